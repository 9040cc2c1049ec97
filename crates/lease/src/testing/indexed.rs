//! [`Indexed`]: the suite's stores as the discovery API uses them for an empty selector.

use std::sync::Arc;
use std::time::Duration;

use super::Backend;
use crate::{
    Candidate, Grant, LeaseRequest, LeaseStore, ManualClock, NoMatch, ReportResult, StoreError, Target, UnknownLease,
    ViewEntry,
};

/// `B`'s stores as the discovery API uses them for an empty selector: before each acquire the
/// candidates are published as the view (when they changed), and the request is scoped to the
/// installation, so a shared store answers from its index of the view. The suite run over
/// `Indexed(backend)` proves the index decides as the candidates do.
#[derive(Debug)]
pub struct Indexed<B>(pub B);

impl<B: Backend> Backend for Indexed<B> {
    fn store_with_cooldown(&self, clock: ManualClock, cooldown: Duration) -> Option<Arc<dyn LeaseStore>> {
        let inner = self.0.store_with_cooldown(clock, cooldown)?;
        Some(Arc::new(IndexedStore {
            inner,
            published: tokio::sync::Mutex::new(None),
        }))
    }
}

struct IndexedStore {
    inner: Arc<dyn LeaseStore>,
    /// The view last published; held during a publication, so that concurrent clients on one
    /// fleet publish it once.
    published: tokio::sync::Mutex<Option<Vec<ViewEntry>>>,
}

#[async_trait::async_trait]
impl LeaseStore for IndexedStore {
    async fn acquire<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        let listed: Vec<Candidate<'c>> = candidates.collect();
        let view: Vec<ViewEntry> = listed
            .iter()
            .map(|c| ViewEntry {
                id: c.id.to_owned(),
                healthy: c.healthy,
                latency_millis: c.latency_millis,
                max_leases: c.max_leases,
                offered: true,
            })
            .collect();
        {
            let mut published = self.published.lock().await;
            if published.as_ref() != Some(&view) {
                self.inner.publish_view(&view).await?;
                *published = Some(view);
            }
        }
        let scoped = LeaseRequest {
            scope: crate::Scope::Installation,
            ..req.clone()
        };
        self.inner.acquire(&mut listed.into_iter(), &scoped).await
    }

    async fn release(&self, lease_id: &str) -> Result<(), StoreError> {
        self.inner.release(lease_id).await
    }

    async fn report(
        &self,
        lease_id: &str,
        result: ReportResult,
        target: Option<Target>,
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
}
