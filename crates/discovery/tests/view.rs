//! The leader's view publication: what it sends, at once, and that it stops on shutdown.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{Fixed, info};
use egress_discovery::publish_view;
use egress_lease::{
    Candidate, Grant, LeaseRequest, LeaseStore, MemoryStore, NoMatch, ReportResult, StoreError, SystemClock,
    UnknownLease, ViewEntry,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The in-memory store, recording each published view.
struct Recording {
    inner: MemoryStore,
    views: Mutex<Vec<Vec<ViewEntry>>>,
    published: Notify,
}

#[async_trait]
impl LeaseStore for Recording {
    async fn acquire<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        self.inner.acquire(candidates, req).await
    }
    async fn acquire_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &egress_lease::Member<'c>,
        req: &LeaseRequest,
        session: &egress_lease::Session<'_>,
    ) -> Result<Result<Grant, egress_lease::SessionRefused>, StoreError> {
        self.inner.acquire_session(candidates, member, req, session).await
    }
    async fn renew(
        &self,
        lease_id: &str,
        ttl: std::time::Duration,
        fit: &egress_lease::Fit<'_>,
    ) -> Result<Result<Grant, egress_lease::NotRenewed>, StoreError> {
        self.inner.renew(lease_id, ttl, fit).await
    }
    fn sessions_now(&self) -> Vec<(String, usize)> {
        self.inner.sessions_now()
    }
    async fn release(&self, lease_id: &str) -> Result<(), StoreError> {
        self.inner.release(lease_id).await
    }
    async fn report(
        &self,
        lease_id: &str,
        result: ReportResult,
        target: Option<egress_lease::Target>,
    ) -> Result<Result<(), UnknownLease>, StoreError> {
        self.inner.report(lease_id, result, target).await
    }
    fn cooldowns_dropped(&self) -> u64 {
        self.inner.cooldowns_dropped()
    }
    async fn active_leases(&self, proxies: &[&str]) -> Result<Vec<usize>, StoreError> {
        self.inner.active_leases(proxies).await
    }
    async fn active_total(&self) -> Result<usize, StoreError> {
        self.inner.active_total().await
    }
    fn active_total_now(&self) -> usize {
        self.inner.active_total_now()
    }
    async fn sweep(&self) -> Result<(), StoreError> {
        self.inner.sweep().await
    }
    async fn publish_view(&self, view: &[ViewEntry]) -> Result<(), StoreError> {
        self.views.lock().unwrap().push(view.to_vec());
        self.published.notify_one();
        Ok(())
    }
}

#[tokio::test]
async fn the_view_is_published_at_once_and_the_publisher_stops_on_shutdown() {
    let store = Arc::new(Recording {
        inner: MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900)),
        views: Mutex::default(),
        published: Notify::new(),
    });
    let directory = Arc::new(Fixed::new(vec![
        info("crawl/b", true, 20, 3, &[("geo", "eu"), ("purpose", "crawl")]),
        info("crawl/a", false, 10, 0, &[]),
    ]));
    let stop = CancellationToken::new();
    let task = tokio::spawn(publish_view(directory, store.clone(), stop.clone()));
    store.published.notified().await;
    stop.cancel();
    task.await.expect("the publisher stops");
    let views = store.views.lock().unwrap().clone();
    assert_eq!(views.len(), 1, "published once before the shutdown");
    assert_eq!(
        views[0],
        vec![
            ViewEntry {
                id: "crawl/a".into(),
                healthy: false,
                latency_millis: 10,
                max_leases: 0,
                offered: true,
                indexed: vec![],
            },
            ViewEntry {
                id: "crawl/b".into(),
                healthy: true,
                latency_millis: 20,
                max_leases: 3,
                offered: true,
                // The indexed keys' values only (the default: geo, tier, pool).
                indexed: vec!["geo=eu".into()],
            },
        ]
    );
}
