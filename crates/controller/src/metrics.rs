//! The operator's scrape-time metrics (spec/core.md §8): values computed from their source at
//! every scrape, so a series whose source is gone disappears instead of going stale.

use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

use egress_api::{Phase, Proxy};
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::provider_health::ProviderHealthSnapshot;

pub const HELP_TARGET_UP: &str = "Whether the target passed its latest provider health check (1) or not (0).";
pub const HELP_CHECK_DURATION: &str = "Duration of the target's latest provider health check.";
pub const HELP_CHECK_TIMESTAMP: &str = "Unix time of the target's latest provider health check.";

/// `proxy_operator_provider_target_up`, `..._check_duration_seconds` and
/// `..._check_timestamp_seconds`, from the monitor's snapshot. An empty snapshot (before the first
/// round, on a non-leader, with checks off) exports no series at all.
#[derive(Debug)]
pub struct ProviderTargetGauges(pub ProviderHealthSnapshot);

type Labels = Vec<(String, String)>;

impl Collector for ProviderTargetGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut up: Vec<(Labels, i64)> = Vec::new();
        let mut duration: Vec<(Labels, f64)> = Vec::new();
        let mut timestamp: Vec<(Labels, f64)> = Vec::new();
        for result in self.0.results() {
            let at = result
                .checked_at
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            for target in result.targets.iter().flatten() {
                let labels = vec![
                    ("provider".to_string(), result.name.clone()),
                    ("target".to_string(), target.name.clone()),
                ];
                up.push((labels.clone(), i64::from(target.ready)));
                duration.push((labels.clone(), target.latency.as_secs_f64()));
                timestamp.push((labels, at));
            }
        }
        if up.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "proxy_operator_provider_check_duration_seconds",
            HELP_CHECK_DURATION,
            None,
            MetricType::Gauge,
        )?;
        for (labels, v) in &duration {
            ConstGauge::new(*v).encode(family.encode_family(labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "proxy_operator_provider_check_timestamp_seconds",
            HELP_CHECK_TIMESTAMP,
            None,
            MetricType::Gauge,
        )?;
        for (labels, v) in &timestamp {
            ConstGauge::new(*v).encode(family.encode_family(labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "proxy_operator_provider_target_up",
            HELP_TARGET_UP,
            None,
            MetricType::Gauge,
        )?;
        for (labels, v) in &up {
            ConstGauge::new(*v).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// `proxy_operator_proxies{phase}`, counted from the reconciler's Proxy cache at each scrape.
/// Only phases that occur are exported; a Proxy without a phase counts as `Pending`.
pub struct ProxyPhases(pub Store<Proxy>);

impl std::fmt::Debug for ProxyPhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyPhases").finish_non_exhaustive()
    }
}

/// Counts by phase name, for the gauge.
pub fn phase_counts(proxies: &[std::sync::Arc<Proxy>]) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for p in proxies {
        let phase = p.status.as_ref().and_then(|s| s.phase).unwrap_or(Phase::Pending);
        *counts.entry(format!("{phase:?}")).or_insert(0) += 1;
    }
    counts
}

impl Collector for ProxyPhases {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counts = phase_counts(&self.0.state());
        let mut family = encoder.encode_descriptor(
            "proxy_operator_proxies",
            "Number of Proxies per phase.",
            None,
            MetricType::Gauge,
        )?;
        for (phase, n) in counts {
            let labels: Labels = vec![("phase".to_string(), phase)];
            ConstGauge::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// `proxy_operator_leases_active`, read from the lease store at each scrape.
pub struct LeasesActive(pub std::sync::Arc<dyn egress_lease::LeaseStore>);

impl std::fmt::Debug for LeasesActive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasesActive").finish_non_exhaustive()
    }
}

impl Collector for LeasesActive {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let n = i64::try_from(self.0.active_total_now()).unwrap_or(i64::MAX);
        let gauge = encoder.encode_descriptor(
            "proxy_operator_leases_active",
            "Number of active proxy leases.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(n).encode(gauge)?;
        Ok(())
    }
}

/// `proxy_operator_lease_cooldowns_dropped_total`: cooldowns the lease store dropped to keep a
/// proxy within its cap of targets (by this replica, for a shared store).
pub struct CooldownsDropped(pub std::sync::Arc<dyn egress_lease::LeaseStore>);

impl std::fmt::Debug for CooldownsDropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CooldownsDropped").finish_non_exhaustive()
    }
}

impl Collector for CooldownsDropped {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counter = encoder.encode_descriptor(
            "proxy_operator_lease_cooldowns_dropped",
            "Cooldowns dropped because a proxy already cooled down for the most targets it may hold at once.",
            None,
            MetricType::Counter,
        )?;
        prometheus_client::metrics::counter::ConstCounter::new(self.0.cooldowns_dropped()).encode(counter)?;
        Ok(())
    }
}

/// `proxy_operator_lease_sessions{client}`: each client's live sticky sessions, read from the
/// lease store at each scrape (exact for the in-memory store; for a shared one as of this
/// replica's last session call or sweep).
pub struct LeaseSessions(pub std::sync::Arc<dyn egress_lease::LeaseStore>);

impl std::fmt::Debug for LeaseSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseSessions").finish_non_exhaustive()
    }
}

impl Collector for LeaseSessions {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "proxy_operator_lease_sessions",
            "Live sticky sessions of each discovery client.",
            None,
            MetricType::Gauge,
        )?;
        for (client, n) in self.0.sessions_now() {
            let labels: Labels = vec![("client".to_string(), client)];
            ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Registers the controller's scrape-time metrics.
pub fn register(registry: &mut Registry, snapshot: ProviderHealthSnapshot, proxies: Store<Proxy>) {
    registry.register_collector(Box::new(ProviderTargetGauges(snapshot)));
    registry.register_collector(Box::new(ProxyPhases(proxies.clone())));
    registry.register_collector(Box::new(crate::exit_metrics::DistinctExits(proxies)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider_health::ProviderResult;
    use egress_provider::TargetStatus;
    use std::time::Duration;

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn target_gauges_come_from_the_snapshot_and_vanish_with_it() {
        let snapshot = ProviderHealthSnapshot::default();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProviderTargetGauges(snapshot.clone())));
        assert!(
            !scrape(&registry).contains("proxy_operator_provider"),
            "an empty snapshot exports nothing"
        );
        let mut down = TargetStatus::reachable("nas2", "nas2:22", Duration::from_millis(5));
        down.ready = false;
        snapshot.replace(vec![ProviderResult {
            name: "kvm-home".into(),
            type_name: "kvm2".into(),
            checked_at: UNIX_EPOCH + Duration::from_millis(1_757_602_800_500),
            targets: Some(vec![
                TargetStatus::reachable("nas1", "nas1:22", Duration::from_millis(84)),
                down,
            ]),
        }]);
        let text = scrape(&registry);
        for line in [
            "# HELP proxy_operator_provider_target_up Whether the target passed its latest provider health check (1) or not (0).",
            "# TYPE proxy_operator_provider_target_up gauge",
            r#"proxy_operator_provider_target_up{provider="kvm-home",target="nas1"} 1"#,
            r#"proxy_operator_provider_target_up{provider="kvm-home",target="nas2"} 0"#,
            r#"proxy_operator_provider_check_duration_seconds{provider="kvm-home",target="nas1"} 0.084"#,
            r#"proxy_operator_provider_check_timestamp_seconds{provider="kvm-home",target="nas1"} 1757602800.5"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        snapshot.replace(vec![]);
        assert!(!scrape(&registry).contains("proxy_operator_provider"));
    }

    #[test]
    fn phases_are_counted_and_unset_counts_as_pending() {
        let proxy = |phase: Option<Phase>| {
            let mut p = Proxy::new("p", Default::default());
            p.status = phase.map(|ph| egress_api::ProxyStatus {
                phase: Some(ph),
                ..Default::default()
            });
            std::sync::Arc::new(p)
        };
        let counts = phase_counts(&[
            proxy(Some(Phase::Ready)),
            proxy(Some(Phase::Ready)),
            proxy(None),
            proxy(Some(Phase::Failed)),
        ]);
        assert_eq!(
            counts,
            BTreeMap::from([("Failed".into(), 1), ("Pending".into(), 1), ("Ready".into(), 2)])
        );
    }
}
