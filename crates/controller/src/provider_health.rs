//! The provider-health monitor's pure parts (spec/core.md §7): schedule validation, the status
//! built from a check round, and the transitions worth a log line.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use egress_api::{ConditionStatus, MAX_TARGET_MESSAGE, ProviderHealthStatus, ProviderTarget, conditions, reasons};
use egress_provider::TargetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::conditions::set_condition;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The shortest check interval, other than 0 (off).
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);
/// The longest derived check timeout.
pub const MAX_DERIVED_TIMEOUT: Duration = Duration::from_secs(15);

/// The checks' schedule: `None` when checks are off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub interval: Duration,
    pub timeout: Duration,
}

fn show(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{secs}s")
    }
}

/// Validates `--provider-check-interval` and `--provider-check-timeout` (zero timeout = derive
/// `min(15s, interval)`). When checks are off (interval 0), the timeout is ignored.
pub fn schedule(interval: Duration, timeout: Duration) -> Result<Option<Schedule>, String> {
    if interval.is_zero() {
        return Ok(None);
    }
    if interval < MIN_INTERVAL {
        return Err(format!(
            "--provider-check-interval must be 0 (off) or at least 10s, got {}",
            show(interval)
        ));
    }
    let timeout = if timeout.is_zero() {
        interval.min(MAX_DERIVED_TIMEOUT)
    } else {
        timeout
    };
    if timeout > interval {
        return Err(format!(
            "--provider-check-timeout must be at most --provider-check-interval ({}), got {}",
            show(interval),
            show(timeout)
        ));
    }
    Ok(Some(Schedule { interval, timeout }))
}

/// Cuts a message to at most `max` characters, never inside a character.
pub fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => text[..cut].to_string(),
        None => text.to_string(),
    }
}

/// One provider's check round.
#[derive(Debug, Clone, PartialEq)]
pub struct Round<'a> {
    /// The provider's configured type.
    pub provider_type: &'a str,
    /// `None` when the provider has no checker.
    pub targets: Option<&'a [TargetStatus]>,
    /// When the round finished.
    pub checked_at: Time,
}

/// The new status from the previous one and a round (spec/core.md §7.5, §2.3).
pub fn build_status(
    previous: Option<&ProviderHealthStatus>,
    round: &Round<'_>,
    generation: Option<i64>,
) -> ProviderHealthStatus {
    let before: BTreeMap<&str, &ProviderTarget> = previous
        .map(|p| p.targets.iter().map(|t| (t.name.as_str(), t)).collect())
        .unwrap_or_default();
    let targets: Vec<ProviderTarget> = round
        .targets
        .unwrap_or_default()
        .iter()
        .map(|t| {
            let last_transition_time = match before.get(t.name.as_str()) {
                Some(old) if old.ready == t.ready => old.last_transition_time.clone(),
                _ => round.checked_at.clone(),
            };
            ProviderTarget {
                name: t.name.clone(),
                address: t.address.clone(),
                ready: t.ready,
                reason: t.reason.clone(),
                message: truncate_chars(&t.message, MAX_TARGET_MESSAGE),
                latency_millis: i64::try_from(t.latency.as_millis()).unwrap_or(i64::MAX),
                last_transition_time,
                details: t
                    .details
                    .iter()
                    .map(|(k, v)| (k.clone(), truncate_chars(v, MAX_TARGET_MESSAGE)))
                    .collect(),
            }
        })
        .collect();
    let ready = targets.iter().filter(|t| t.ready).count();
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    let (status, reason, message) = match round.targets {
        None => (
            ConditionStatus::Unknown,
            reasons::CHECKS_NOT_IMPLEMENTED,
            "this provider has no health checks".to_string(),
        ),
        Some([]) => (
            ConditionStatus::Unknown,
            reasons::NO_TARGETS,
            "the check returned no targets".to_string(),
        ),
        Some(_) if ready == targets.len() => (
            ConditionStatus::True,
            reasons::ALL_TARGETS_READY,
            format!("all {ready} targets are ready"),
        ),
        Some(_) => {
            let failing: Vec<&str> = targets.iter().filter(|t| !t.ready).map(|t| t.name.as_str()).collect();
            (
                ConditionStatus::False,
                reasons::TARGETS_NOT_READY,
                format!("not ready: {}", failing.join(", ")),
            )
        }
    };
    set_condition(
        &mut conditions,
        conditions::READY,
        status,
        reason,
        &truncate_chars(&message, 32768),
        generation,
        &round.checked_at,
    );
    ProviderHealthStatus {
        type_: round.provider_type.to_string(),
        conditions,
        targets_ready: format!("{ready}/{}", targets.len()),
        targets,
        last_check_time: Some(round.checked_at.clone()),
    }
}

/// A change worth a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Not ready now, and before ready, unseen, or not ready for another reason (an Info line).
    NotReady {
        target: String,
        address: String,
        reason: String,
        message: String,
    },
    /// Ready again after being not ready (an Info line).
    Ready { target: String },
    /// Ready on first sight (debug only).
    FirstSeenReady { target: String },
}

/// The transitions between the previous round's targets and this round's.
pub fn transitions(previous: &[TargetStatus], current: &[TargetStatus]) -> Vec<Transition> {
    let before: BTreeMap<&str, &TargetStatus> = previous.iter().map(|t| (t.name.as_str(), t)).collect();
    current
        .iter()
        .filter_map(|t| match (before.get(t.name.as_str()), t.ready) {
            (old, false) if old.is_none_or(|o| o.ready || o.reason != t.reason) => Some(Transition::NotReady {
                target: t.name.clone(),
                address: t.address.clone(),
                reason: t.reason.clone(),
                message: t.message.clone(),
            }),
            (Some(old), true) if !old.ready => Some(Transition::Ready { target: t.name.clone() }),
            (None, true) => Some(Transition::FirstSeenReady { target: t.name.clone() }),
            _ => None,
        })
        .collect()
}

// ---- the monitor's I/O ----------------------------------------------------------------------

/// One provider's latest round, as the gauges and the status read it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderResult {
    /// The configured name.
    pub name: String,
    /// The configured type.
    pub type_name: String,
    /// When the round finished.
    pub checked_at: std::time::SystemTime,
    /// `None` when the provider has no checker.
    pub targets: Option<Vec<TargetStatus>>,
}

/// The latest round of every provider. Empty before the first round, on non-leaders and when
/// checks are off (then no target gauge is exported at all).
#[derive(Debug, Clone, Default)]
pub struct ProviderHealthSnapshot(Arc<std::sync::RwLock<Vec<ProviderResult>>>);

impl ProviderHealthSnapshot {
    /// A copy of the latest results.
    pub fn results(&self) -> Vec<ProviderResult> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn replace(&self, results: Vec<ProviderResult>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = results;
    }
}

/// The provider-health monitor (leader-only).
#[derive(Clone)]
pub struct Monitor {
    pub client: kube::Client,
    pub providers: Arc<egress_provider::Providers>,
    /// `None`: checks are off.
    pub schedule: Option<Schedule>,
    pub snapshot: ProviderHealthSnapshot,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}

/// Whether a configured name can be an object name (a DNS-1123 subdomain). Names that cannot
/// still get gauges, but no ProviderHealth object.
pub fn valid_object_name(name: &str) -> bool {
    egress_provider::is_dns1123_subdomain(name)
}

fn time_of(t: std::time::SystemTime) -> Time {
    let ts = k8s_openapi::jiff::Timestamp::try_from(t).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    // Status times are whole seconds on the wire (metav1.Time).
    Time(k8s_openapi::jiff::Timestamp::from_second(ts.as_second()).unwrap_or(ts))
}

impl Monitor {
    fn api(&self) -> kube::Api<egress_api::ProviderHealth> {
        kube::Api::all(self.client.clone())
    }

    /// Once per process: removes the operator's ProviderHealth objects for providers no longer
    /// configured (all of them when checks are off, so no stale `Ready=True` survives).
    pub async fn cleanup(&self) -> Result<usize, kube::Error> {
        let selector = format!("{}={}", egress_api::LABEL_MANAGED_BY, egress_api::MANAGED_BY);
        let list = self
            .api()
            .list(&kube::api::ListParams::default().labels(&selector))
            .await?;
        let mut deleted = 0;
        for object in list.items {
            let name = kube::ResourceExt::name_any(&object);
            let configured = self.schedule.is_some() && self.providers.get(&name).is_some();
            if !configured {
                match self.api().delete(&name, &Default::default()).await {
                    Ok(_) => deleted += 1,
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(deleted)
    }

    /// One round: every checker concurrently under the round's timeout, the snapshot replaced,
    /// transitions logged, and each provider's object published.
    pub async fn round(&self, schedule: &Schedule, shutdown: &CancellationToken) {
        let span = tracing::info_span!(
            "providerhealth.check",
            otel.kind = "internal",
            providerhealth.providers = self.providers.entries().len(),
            providerhealth.targets_not_ready = tracing::field::Empty,
        );
        async {
            let cx = egress_provider::OpCtx::with_cancel(shutdown.child_token()).with_timeout(schedule.timeout);
            let checks = self.providers.entries().iter().map(|entry| {
                let cx = &cx;
                async move {
                    let targets = match &entry.checker {
                        Some(checker) => Some(checker.check(cx).await),
                        None => None,
                    };
                    ProviderResult {
                        name: entry.name.clone(),
                        type_name: entry.type_name.clone(),
                        checked_at: std::time::SystemTime::now(),
                        targets,
                    }
                }
            });
            let mut results = futures::future::join_all(checks).await;
            // Every result carries the round's finish time.
            let finished = std::time::SystemTime::now();
            results.iter_mut().for_each(|r| r.checked_at = finished);
            let previous = self.snapshot.results();
            for r in &results {
                let before = previous.iter().find(|p| p.name == r.name).and_then(|p| p.targets.clone()).unwrap_or_default();
                for t in transitions(&before, r.targets.as_deref().unwrap_or_default()) {
                    match t {
                        Transition::NotReady { target, address, reason, message } => tracing::info!(
                            provider = %r.name, target = %target, address = %address, reason = %reason, message = %message,
                            "WARNING: provider target not ready"
                        ),
                        Transition::Ready { target } => tracing::info!(provider = %r.name, target = %target, "Provider target ready"),
                        Transition::FirstSeenReady { target } => tracing::debug!(provider = %r.name, target = %target, "Provider target ready"),
                    }
                }
            }
            let not_ready: usize =
                results.iter().map(|r| r.targets.as_ref().map_or(0, |t| t.iter().filter(|t| !t.ready).count())).sum();
            tracing::Span::current().record("providerhealth.targets_not_ready", not_ready);
            self.snapshot.replace(results.clone());
            for r in &results {
                if let Err(e) = self.publish(r).await {
                    tracing::warn!(provider = %r.name, error = %e, "writing ProviderHealth failed; the next round retries");
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// Reads the object through the API (not a cache), creates it when missing, and patches its
    /// status when it differs.
    async fn publish(&self, result: &ProviderResult) -> Result<(), kube::Error> {
        if !valid_object_name(&result.name) {
            return Ok(());
        }
        let api = self.api();
        let existing = match api.get_opt(&result.name).await? {
            Some(o) => o,
            None => {
                let mut object = egress_api::ProviderHealth::new(&result.name, Default::default());
                object.metadata.labels = Some(
                    [(
                        egress_api::LABEL_MANAGED_BY.to_string(),
                        egress_api::MANAGED_BY.to_string(),
                    )]
                    .into(),
                );
                match api.create(&Default::default(), &object).await {
                    Ok(o) => o,
                    Err(kube::Error::Api(s)) if s.code == 409 => api.get(&result.name).await?,
                    Err(e) => return Err(e),
                }
            }
        };
        let round = Round {
            provider_type: &result.type_name,
            targets: result.targets.as_deref(),
            checked_at: time_of(result.checked_at),
        };
        let status = build_status(existing.status.as_ref(), &round, existing.metadata.generation);
        if existing.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let before = serde_json::to_value(existing.status.clone().unwrap_or_default()).unwrap_or_default();
        let after = serde_json::to_value(&status).unwrap_or_default();
        let patch = serde_json::json!({"status": crate::merge::diff(&before, &after)});
        let params = kube::api::PatchParams {
            field_manager: Some(crate::identity::FIELD_MANAGER.into()),
            ..Default::default()
        };
        api.patch_status(&result.name, &params, &kube::api::Patch::Merge(patch))
            .await?;
        Ok(())
    }

    /// Cleanup once, then a round at once and one every interval, until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        for name in self
            .providers
            .entries()
            .iter()
            .map(|e| &e.name)
            .filter(|n| !valid_object_name(n))
        {
            tracing::warn!(provider = %name, "provider name is not a valid object name; no ProviderHealth object is written for it");
        }
        // Cleanup is retried until it succeeds: with checks off it is the only thing that keeps
        // a stale Ready=True from surviving.
        let mut cleaned = false;
        let mut retry = Duration::from_secs(1);
        loop {
            if !cleaned {
                match self.cleanup().await {
                    Ok(_) => cleaned = true,
                    Err(e) => tracing::warn!(error = %e, "cleaning up stale ProviderHealth objects failed; retrying"),
                }
            }
            let Some(schedule) = self.schedule else {
                if cleaned {
                    return;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(Duration::from_secs(60));
                continue;
            };
            self.round(&schedule, &shutdown).await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(schedule.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn target(name: &str, ready: bool, reason: &str) -> TargetStatus {
        TargetStatus {
            name: name.into(),
            address: format!("{name}:22"),
            ready,
            reason: reason.into(),
            message: if ready {
                String::new()
            } else {
                "connection refused".into()
            },
            latency: Duration::from_millis(12),
            details: BTreeMap::new(),
        }
    }

    #[test]
    fn schedule_rules_and_messages() {
        let s = |i, t| schedule(Duration::from_secs(i), Duration::from_secs(t));
        assert_eq!(s(0, 0), Ok(None));
        assert_eq!(s(0, 99), Ok(None), "the timeout is ignored when checks are off");
        assert_eq!(
            s(5, 0).unwrap_err(),
            "--provider-check-interval must be 0 (off) or at least 10s, got 5s"
        );
        assert_eq!(
            s(60, 0),
            Ok(Some(Schedule {
                interval: Duration::from_secs(60),
                timeout: Duration::from_secs(15)
            }))
        );
        assert_eq!(s(10, 0).unwrap().unwrap().timeout, Duration::from_secs(10));
        assert_eq!(
            s(30, 31).unwrap_err(),
            "--provider-check-timeout must be at most --provider-check-interval (30s), got 31s"
        );
        assert_eq!(s(30, 30).unwrap().unwrap().timeout, Duration::from_secs(30));
    }

    #[test]
    fn messages_are_cut_at_1024_characters_never_inside_one() {
        assert_eq!(truncate_chars(&"x".repeat(2000), 1024).len(), 1024);
        let wide = "é".repeat(2000);
        let cut = truncate_chars(&wide, 1024);
        assert_eq!(cut.chars().count(), 1024);
        assert_eq!(truncate_chars("short", 1024), "short");
    }

    #[test]
    fn the_ready_condition_by_round() {
        fn round(targets: Option<&[TargetStatus]>) -> Round<'_> {
            Round {
                provider_type: "kvm2",
                targets,
                checked_at: at(10),
            }
        }
        let ready_of = |s: &ProviderHealthStatus| {
            let c = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
            (c.status, c.reason.clone())
        };
        let none = build_status(None, &round(None), Some(1));
        assert_eq!(
            ready_of(&none),
            (ConditionStatus::Unknown, "ChecksNotImplemented".into())
        );
        assert_eq!(none.targets_ready, "0/0");
        let empty = build_status(None, &round(Some(&[])), Some(1));
        assert_eq!(ready_of(&empty), (ConditionStatus::Unknown, "NoTargets".into()));
        let all = [target("hv1", true, "Reachable"), target("hv2", true, "Reachable")];
        let up = build_status(None, &round(Some(&all)), Some(1));
        assert_eq!(ready_of(&up), (ConditionStatus::True, "AllTargetsReady".into()));
        assert_eq!((up.targets_ready.as_str(), up.type_.as_str()), ("2/2", "kvm2"));
        assert_eq!(up.targets[0].latency_millis, 12);
        let half = [target("hv1", true, "Reachable"), target("hv2", false, "Unreachable")];
        let down = build_status(
            Some(&up),
            &Round {
                checked_at: at(20),
                ..round(Some(&half))
            },
            Some(1),
        );
        let (status, reason) = ready_of(&down);
        assert_eq!((status, reason.as_str()), (ConditionStatus::False, "TargetsNotReady"));
        assert!(down.conditions[0].message.contains("hv2"));
        assert_eq!(down.targets_ready, "1/2");
        // Transition times move only for the target that flipped.
        assert_eq!(down.targets[0].last_transition_time, at(10));
        assert_eq!(down.targets[1].last_transition_time, at(20));
        assert_eq!(down.last_check_time, Some(at(20)));
    }

    #[test]
    fn transitions_worth_a_log_line() {
        let prev = [
            target("a", true, "Reachable"),
            target("b", false, "Unreachable"),
            target("c", false, "Unreachable"),
        ];
        let now = [
            target("a", false, "Unreachable"),
            target("b", true, "Reachable"),
            target("c", false, "Forbidden"),
            target("d", true, "Reachable"),
            target("e", false, "Timeout"),
        ];
        let t = transitions(&prev, &now);
        let names: Vec<String> = t
            .iter()
            .map(|t| match t {
                Transition::NotReady { target, reason, .. } => format!("down {target} {reason}"),
                Transition::Ready { target } => format!("up {target}"),
                Transition::FirstSeenReady { target } => format!("first {target}"),
            })
            .collect();
        assert_eq!(
            names,
            vec![
                "down a Unreachable",
                "up b",
                "down c Forbidden",
                "first d",
                "down e Timeout"
            ]
        );
        assert!(transitions(&now, &now).is_empty(), "nothing changed, nothing to say");
    }
}
