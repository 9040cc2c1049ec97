//! Orphan GC (spec/core.md §6): deletes provider instances whose Proxy is gone. The rule for
//! one instance is a pure function ([`fate`]); [`OrphanGc::sweep`] is one sweep.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_api::Proxy;
use egress_provider::{Instance, OpCtx, Providers};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Why an instance is kept, or that it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// No UID mark: its owner cannot be told, so it is never collected.
    KeepUnmarked,
    /// Not this installation's (the operator runs with one): the instance carries another
    /// installation's mark, or none, so whose it is cannot be told. The reconciler marks its own
    /// Proxies' running instances that carry none, so those are collectable once orphaned.
    KeepForeign,
    /// Its Proxy exists (a Proxy being deleted counts: its own reconciler cleans up).
    KeepLive,
    /// Younger than the minimum age (a future creation time is never old enough).
    KeepYoung,
    Delete,
}

/// The fate of one instance, checks in this order: UID mark, installation, live UID, age.
/// The live check comes before the age, so a wrong creation time can never get a live Proxy's
/// instance deleted. A missing creation time counts as very old.
pub fn fate(
    instance: &Instance,
    live_uids: &HashSet<String>,
    installation: Option<&str>,
    now: SystemTime,
    min_age: Duration,
) -> Fate {
    if instance.uid.is_empty() {
        return Fate::KeepUnmarked;
    }
    if let Some(ours) = installation
        && instance.installation.as_deref() != Some(ours)
    {
        return Fate::KeepForeign;
    }
    if live_uids.contains(&instance.uid) {
        return Fate::KeepLive;
    }
    match instance.created_at {
        None => Fate::Delete,
        Some(created) => match now.duration_since(created) {
            Ok(age) if age >= min_age => Fate::Delete,
            // Younger than the minimum, or created "in the future".
            _ => Fate::KeepYoung,
        },
    }
}

/// Orphan GC, leader-only.
#[derive(Clone)]
pub struct OrphanGc {
    pub client: Client,
    pub providers: Arc<Providers>,
    /// Time between sweeps (`--gc-interval`, default 10m).
    pub interval: Duration,
    /// Instances younger than this are kept (`--gc-min-age`, default 10m).
    pub min_age: Duration,
    /// When set, only instances carrying this installation mark are collected.
    pub installation: Option<String>,
}

impl std::fmt::Debug for OrphanGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrphanGc")
            .field("interval", &self.interval)
            .field("min_age", &self.min_age)
            .field("installation", &self.installation)
            .finish_non_exhaustive()
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// False when the Proxy list failed and nothing was looked at.
    pub swept: bool,
    pub deleted: usize,
    /// Providers whose list failed, skipped for this sweep.
    pub skipped: Vec<String>,
}

/// Proxies are listed in pages of this size, so a large cluster is not read in one answer.
const PAGE: u32 = 500;

impl OrphanGc {
    /// The UIDs of every Proxy in the cluster, from an uncached, cluster-wide list (a
    /// namespace-restricted view would make other namespaces' instances look orphaned).
    /// Proxies being deleted count as live: their own reconciler cleans up.
    async fn live_uids(&self) -> Result<HashSet<String>, kube::Error> {
        let api: Api<Proxy> = Api::all(self.client.clone());
        let mut uids = HashSet::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = api.list(&params).await?;
            uids.extend(page.items.iter().filter_map(|p| p.uid()));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(uids),
            }
        }
    }

    /// One sweep, providers one after another. A provider whose list fails is skipped; the others
    /// are still swept. A failed Proxy list skips the whole sweep: never act on an empty live set.
    pub async fn sweep(&self, cx: &OpCtx) -> SweepReport {
        let span = tracing::info_span!(
            "gc.sweep",
            gc.providers = self.providers.entries().len(),
            gc.deleted = tracing::field::Empty
        );
        let report = async {
            let mut report = SweepReport::default();
            // Ages are measured against the moment before the Proxy list: an instance created
            // after it (whose Proxy the list may miss) then looks too young to collect.
            let listed_at = SystemTime::now();
            let live = match self.live_uids().await {
                Ok(live) => live,
                Err(e) => {
                    tracing::error!(target: "orphan-gc", error = %e, "listing Proxies failed; skipping this sweep");
                    return report;
                }
            };
            report.swept = true;
            for entry in self.providers.entries() {
                let instances = match entry.provider.list_by_tag(cx).await {
                    Ok(list) => list,
                    Err(e) => {
                        tracing::error!(target: "orphan-gc", provider = %entry.name, error = %e, "listing instances failed; skipping this provider");
                        report.skipped.push(entry.name.clone());
                        continue;
                    }
                };
                for instance in instances {
                    let v = fate(&instance, &live, self.installation.as_deref(), listed_at, self.min_age);
                    if v != Fate::Delete {
                        continue;
                    }
                    match entry.provider.delete(cx, &instance.id).await {
                        Ok(()) => {
                            report.deleted += 1;
                            tracing::info!(target: "orphan-gc", provider = %entry.name, providerID = %instance.id.as_str(), uid = %instance.uid, "deleted an orphaned instance");
                        }
                        Err(e) => tracing::error!(
                            target: "orphan-gc", provider = %entry.name, providerID = %instance.id.as_str(),
                            uid = %instance.uid, error = %e, "deleting orphaned instance"
                        ),
                    }
                }
            }
            report
        }
        .instrument(span.clone())
        .await;
        span.record("gc.deleted", report.deleted);
        report
    }

    /// Sweeps every interval until `shutdown`; the first sweep comes after one interval, once the
    /// operator has settled.
    pub async fn run(self, shutdown: CancellationToken) {
        let cx = OpCtx::with_cancel(shutdown.child_token());
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            self.sweep(&cx).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_provider::{InstanceState, ProviderId};

    fn instance(uid: &str, created: Option<SystemTime>, installation: Option<&str>) -> Instance {
        Instance {
            id: ProviderId::new("i"),
            ip: None,
            state: InstanceState::Running,
            uid: uid.into(),
            created_at: created,
            installation: installation.map(str::to_string),
        }
    }

    #[test]
    fn the_checks_in_their_order() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
        let min = Duration::from_secs(600);
        let live: HashSet<String> = ["live".to_string()].into();
        let old = Some(now - Duration::from_secs(601));
        let young = Some(now - Duration::from_secs(599));
        let future = Some(now + Duration::from_secs(3600));
        let rows = [
            (instance("", old, None), None, Fate::KeepUnmarked),
            (instance("live", old, None), None, Fate::KeepLive),
            (instance("live", None, None), None, Fate::KeepLive),
            (instance("gone", young, None), None, Fate::KeepYoung),
            (instance("gone", future, None), None, Fate::KeepYoung),
            (instance("gone", old, None), None, Fate::Delete),
            (instance("gone", None, None), None, Fate::Delete),
            (instance(" live", old, None), None, Fate::Delete),
            (instance("gone", old, Some("other")), Some("ours"), Fate::KeepForeign),
            (instance("gone", old, None), Some("ours"), Fate::KeepForeign),
            (instance("gone", old, Some("ours")), Some("ours"), Fate::Delete),
            (instance("", old, Some("ours")), Some("ours"), Fate::KeepUnmarked),
        ];
        for (i, (inst, installation, want)) in rows.into_iter().enumerate() {
            assert_eq!(fate(&inst, &live, installation, now, min), want, "row {i}");
        }
    }
}
