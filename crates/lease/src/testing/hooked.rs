//! [`Hooked`]: the in-memory store with hooks, for tests of what calls a store (the API, the
//! view publisher) that watch or change a few calls and leave the rest as they are.

use std::time::Duration;

use crate::{
    Candidate, Fit, Grant, LeaseRequest, LeaseStore, Member, MemoryStore, NoMatch, NotRenewed, ProxyRef, ReportResult,
    Session, SessionRefused, StoreError, Target, UnknownLease, ViewEntry,
};

/// What a test watches or changes; each hook does nothing unless it is given.
#[async_trait::async_trait]
pub trait Hooks: Send + Sync + 'static {
    /// Before each acquire, plain or in a session, with its request. `Some`: the store chooses
    /// among that one candidate instead of the caller's (a store whose index knew nothing of
    /// the caller's scope).
    fn acquiring(&self, req: &LeaseRequest) -> Option<Candidate<'static>> {
        let _ = req;
        None
    }

    /// Before each read of active leases; may hold it.
    async fn reading_active(&self, proxies: &[ProxyRef<'_>]) {
        let _ = proxies;
    }

    /// Each view published (the in-memory store itself needs none).
    fn published(&self, view: &[ViewEntry]) {
        let _ = view;
    }
}

/// `inner`, with `hooks` around its calls.
pub struct Hooked<H> {
    pub inner: MemoryStore,
    pub hooks: H,
}

impl<H> std::fmt::Debug for Hooked<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooked")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<H: Hooks> LeaseStore for Hooked<H> {
    async fn acquire<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        match self.hooks.acquiring(req) {
            Some(instead) => self.inner.acquire(&mut std::iter::once(instead), req).await,
            None => self.inner.acquire(candidates, req).await,
        }
    }

    async fn acquire_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Result<Grant, SessionRefused>, StoreError> {
        match self.hooks.acquiring(req) {
            Some(instead) => {
                let member = move |id: &str| (id == instead.id).then_some(instead);
                self.inner
                    .acquire_session(&mut std::iter::once(instead), &member, req, session)
                    .await
            }
            None => self.inner.acquire_session(candidates, member, req, session).await,
        }
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
        self.hooks.reading_active(proxies).await;
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
        self.hooks.published(view);
        self.inner.publish_view(view).await
    }
}
