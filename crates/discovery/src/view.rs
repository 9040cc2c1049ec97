//! Publishing the proxies this replica serves to a shared lease store, so that every replica
//! leases with the same capacity, health and latency (the in-memory store needs none).

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_lease::{LeaseStore, ViewEntry};
use tokio_util::sync::CancellationToken;

use crate::api::{ProxyDirectory, ProxyInfo};

/// How often the directory is looked at: a changed view is published within this.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(2);
/// An unchanged view is published again after this (the store forgets an old one).
pub const REPUBLISH_AFTER: Duration = Duration::from_secs(60);

/// The view entries of `proxies`.
pub fn entries(proxies: &[ProxyInfo]) -> Vec<ViewEntry> {
    proxies
        .iter()
        .map(|p| ViewEntry {
            id: p.id.clone(),
            healthy: p.healthy,
            latency_millis: p.latency_millis,
            max_leases: p.max_leases,
        })
        .collect()
}

/// Publishes `directory`'s proxies to `store` at once, then whenever they change (looked at
/// every [`PUBLISH_EVERY`]) and at least every [`REPUBLISH_AFTER`], until `shutdown`. A store
/// that cannot be reached is tried again at the next look.
pub async fn publish_view(directory: Arc<dyn ProxyDirectory>, store: Arc<dyn LeaseStore>, shutdown: CancellationToken) {
    let mut published: Option<(Arc<Vec<ProxyInfo>>, Instant)> = None;
    loop {
        match directory.proxies() {
            Ok(proxies) => {
                let fresh = published
                    .as_ref()
                    .is_some_and(|(p, at)| Arc::ptr_eq(p, &proxies) && at.elapsed() < REPUBLISH_AFTER);
                if !fresh {
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
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(PUBLISH_EVERY) => {}
        }
    }
}
