//! Publishing the proxies this replica serves to a shared lease store, so that every replica
//! leases with the same capacity, health and latency (the in-memory store needs none).

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_lease::{LeaseStore, ViewEntry};
use tokio_util::sync::CancellationToken;

use crate::api::ProxyDirectory;
use crate::fleet::Fleet;

/// How often the directory is looked at: a changed view is published within this.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(2);
/// An unchanged view is published again after this (the store forgets an old one).
pub const REPUBLISH_AFTER: Duration = Duration::from_secs(60);
/// Between two looks prompted by the directory's change signal, at least this: a fleet whose
/// statuses change hundreds of times a second is compared ten times a second, not hundreds.
pub const CHANGE_GAP: Duration = Duration::from_millis(100);

/// The view entries of `proxies`, in lease order.
pub fn entries(proxies: &Fleet) -> Vec<ViewEntry> {
    proxies
        .in_lease_order()
        .map(|p| ViewEntry {
            id: p.id.clone(),
            healthy: p.healthy,
            latency_millis: p.latency_millis,
            max_leases: p.max_leases,
            offered: p.offered,
            indexed: crate::selection::published_indexes(proxies, p),
            pool: p.lease_pool().map(str::to_owned),
        })
        .collect()
}

/// Whether the two views offer different proxies to leases: a promotion, a drain, a proxy
/// added or gone. What cannot wait for the next scheduled look.
fn offers_differ(a: &Fleet, b: &Fleet) -> bool {
    fn offered(v: &Fleet) -> impl Iterator<Item = &str> {
        v.in_id_order().filter(|p| p.offered).map(|p| p.id.as_str())
    }
    a.len() != b.len() || !offered(a).eq(offered(b))
}

/// Publishes `directory`'s proxies to `store` at once, then whenever they change (looked at
/// every [`PUBLISH_EVERY`]) and at least every [`REPUBLISH_AFTER`], until `shutdown`. When the
/// directory signals a change that alters which proxies are offered (a pool's standby
/// promoted, a member drained), the view is published at once, not at the next look. A store
/// that cannot be reached is tried again at the next look.
pub async fn publish_view(directory: Arc<dyn ProxyDirectory>, store: Arc<dyn LeaseStore>, shutdown: CancellationToken) {
    let mut published: Option<(Arc<Fleet>, Instant)> = None;
    let mut changes = directory.changes();
    let mut schedule = tokio::time::interval(PUBLISH_EVERY);
    schedule.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the view is published as soon as the leader starts.
    let mut urgent_only = false;
    loop {
        match directory.proxies() {
            Ok(proxies) => {
                let due = match &published {
                    None => true,
                    Some((p, _)) if urgent_only => offers_differ(p, &proxies),
                    Some((p, at)) => !Arc::ptr_eq(p, &proxies) || at.elapsed() >= REPUBLISH_AFTER,
                };
                if due {
                    match store.publish_view(&entries(&proxies)).await {
                        Ok(()) => published = Some((proxies, Instant::now())),
                        Err(e) => {
                            tracing::info!(target: "discovery", error = %e, "Publishing the proxy view failed; trying again")
                        }
                    }
                }
            }
            Err(e) => tracing::info!(target: "discovery", error = %e, "Listing proxies for the shared view failed"),
        }
        let changed = async {
            match changes.as_mut() {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        // The directory is gone; look on the schedule only.
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = schedule.tick() => urgent_only = false,
            () = changed => {
                urgent_only = true;
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(CHANGE_GAP) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::ProxyInfo;

    fn info(id: &str, offered: bool) -> ProxyInfo {
        ProxyInfo {
            id: id.into(),
            ip: String::new(),
            port: 3128,
            attributes: Default::default(),
            phase: String::new(),
            healthy: true,
            latency_millis: 0,
            max_leases: 1,
            credentials: None,
            offered,
            pool_role: None,
            pool: None,
            exit: None,
        }
    }

    fn fleet(proxies: &[ProxyInfo]) -> Fleet {
        proxies.iter().cloned().collect()
    }

    #[test]
    fn only_a_change_in_what_is_offered_is_urgent() {
        let a = [info("ns/a", true), info("ns/b", false)];
        let mut latency = a.clone();
        latency[0].latency_millis = 50;
        assert!(
            !offers_differ(&fleet(&a), &fleet(&latency)),
            "latency waits for the schedule"
        );
        assert!(
            offers_differ(&fleet(&a), &fleet(&[info("ns/a", true), info("ns/b", true)])),
            "a promotion"
        );
        assert!(
            offers_differ(&fleet(&a), &fleet(&[info("ns/a", false), info("ns/b", false)])),
            "a drain"
        );
        assert!(offers_differ(&fleet(&a), &fleet(&a[..1])), "a proxy gone");
        let reordered = [info("ns/b", false), info("ns/a", true)];
        assert!(!offers_differ(&fleet(&a), &fleet(&reordered)));
    }
}
