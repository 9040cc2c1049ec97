//! [`Indexed`]: the suite's stores as the discovery API uses them for an empty selector.

use std::sync::Arc;
use std::time::Duration;

use super::Backend;
use crate::{
    Candidate, Fit, Grant, LeaseRequest, LeaseStore, ManualClock, Member, NoMatch, NotRenewed, ProxyRef, ReportResult,
    Session, SessionRefused, StoreError, Target, UnknownLease, ViewEntry,
};

/// `B`'s stores as the discovery API uses them for an empty selector: before each acquire the
/// candidates are published as the view (when they changed), and the request is scoped to the
/// installation, so a shared store answers from its index of the view. A request scoped to a
/// selector's indexes goes as it is (its caller published the view). The suite run over
/// `Indexed(backend)` proves the index decides as the candidates do.
#[derive(Debug)]
pub struct Indexed<B>(pub B);

impl<B: Backend> Backend for Indexed<B> {
    fn store_with_cooldown(&self, clock: ManualClock, cooldown: Duration) -> Option<Arc<dyn LeaseStore>> {
        Some(IndexedStore::on(self.0.store_with_cooldown(clock, cooldown)?))
    }

    fn replicas(&self, clock: ManualClock) -> Option<[Arc<dyn LeaseStore>; 2]> {
        Some(self.0.replicas(clock)?.map(IndexedStore::on))
    }

    fn keeps_pools_apart(&self) -> bool {
        self.0.keeps_pools_apart()
    }
}

/// The request scoped to the installation, as the API scopes an empty selector's.
fn installation(req: &LeaseRequest) -> LeaseRequest {
    LeaseRequest {
        scope: crate::Scope::Installation,
        ..req.clone()
    }
}

impl IndexedStore {
    fn on(inner: Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore> {
        Arc::new(Self {
            inner,
            published: tokio::sync::Mutex::new(None),
        })
    }

    /// Publishes the candidates as the view, when they changed.
    async fn publish(&self, listed: &[Candidate<'_>]) -> Result<(), StoreError> {
        let view: Vec<ViewEntry> = listed
            .iter()
            .map(|c| ViewEntry {
                id: c.id.to_owned(),
                healthy: c.healthy,
                latency_millis: c.latency_millis,
                max_leases: c.max_leases,
                offered: true,
                indexed: Vec::new(),
                pool: c.pool.map(str::to_owned),
            })
            .collect();
        let mut published = self.published.lock().await;
        if published.as_ref() != Some(&view) {
            self.inner.publish_view(&view).await?;
            *published = Some(view);
        }
        Ok(())
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
        // A selector's indexes: its caller published the view they are of.
        if matches!(req.scope, crate::Scope::Indexed(_)) {
            return self.inner.acquire(candidates, req).await;
        }
        let listed: Vec<Candidate<'c>> = candidates.collect();
        self.publish(&listed).await?;
        self.inner.acquire(&mut listed.into_iter(), &installation(req)).await
    }

    async fn publish_view(&self, view: &[ViewEntry]) -> Result<(), StoreError> {
        let mut published = self.published.lock().await;
        self.inner.publish_view(view).await?;
        *published = Some(view.to_vec());
        Ok(())
    }

    async fn acquire_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Result<Grant, SessionRefused>, StoreError> {
        let listed: Vec<Candidate<'c>> = candidates.collect();
        self.publish(&listed).await?;
        self.inner
            .acquire_session(&mut listed.into_iter(), member, &installation(req), session)
            .await
    }

    async fn renew(
        &self,
        lease_id: &str,
        ttl: Duration,
        fit: &Fit<'_>,
    ) -> Result<Result<Grant, NotRenewed>, StoreError> {
        self.inner.renew(lease_id, ttl, fit).await
    }

    async fn session_leases(&self, key: &str) -> Result<Vec<String>, StoreError> {
        self.inner.session_leases(key).await
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
        target: Option<Target>,
    ) -> Result<Result<(), UnknownLease>, StoreError> {
        self.inner.report(lease_id, result, target).await
    }

    fn cooldowns_dropped(&self) -> u64 {
        self.inner.cooldowns_dropped()
    }

    async fn active_leases(&self, proxies: &[ProxyRef<'_>]) -> Result<Vec<usize>, StoreError> {
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
