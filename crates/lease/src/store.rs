//! The lease store: leases, capacity, selection and cooldowns.
//!
//! Rules (spec/core.md §5.7-§5.10):
//!
//! - A proxy is eligible when it is healthy, has fewer active leases than its capacity
//!   (`maxLeases`; 0 means never leased) and is not cooling down for the request. A proxy failing
//!   several checks is counted once, under the first in that order (health, capacity, cooldown),
//!   so the three counts of a refusal add up to the proxies considered.
//! - Among the eligible: fewest active leases, then lowest latency, then smallest id.
//! - Active leases are those neither released nor past their expiry, whenever the sweep runs.
//! - A `rate_limited` or `banned` report starts one cooldown window for the lease's proxy and the
//!   resolved target (the report's, else the lease's, else none: a global cooldown). A cooldown
//!   with a target blocks only requests naming that target; a global one blocks every request.
//!   Overlapping cooldowns keep the later end.
//! - A lease stays reportable (released or not) until one cooldown window after its expiry; the
//!   sweep then forgets it.
//!
//! Bounds, whatever clients send (the state is at most the fleet's capacity in active leases,
//! plus these):
//!
//! - A target is kept as a 16-byte digest ([`Target`]), so its length costs nothing.
//! - Of the leases that have ended (released, or found expired), the newest [`MAX_ENDED`] stay
//!   reportable; older ones are forgotten early (a report on one is `unknown_lease`).
//! - A proxy cools down for at most [`MAX_COOLDOWN_TARGETS`] targets at once, beside its global
//!   cooldown; a report for one more drops the cooldown that ends soonest, counted by
//!   [`LeaseStore::cooldowns_dropped`].
//! - Sessions ([`crate::session`]) are at most the active leases, and each client's at most its
//!   cap.

use std::time::{Duration, SystemTime};

use crate::session::{NotRenewed, Session, SessionRefused};
use crate::target::Target;

/// Ended leases kept reportable, at most (the newest). About 5 MiB in memory: small enough that
/// a flood of leases reaches it within a minute and memory stays flat from there, large enough
/// that at a few hundred leases a second a released lease stays reportable for about a minute
/// (reports usually come while the lease is held, which this does not limit).
pub const MAX_ENDED: usize = 16_384;
/// Targets one proxy cools down for at once, at most, beside its global cooldown.
pub const MAX_COOLDOWN_TARGETS: usize = 64;

/// A proxy that matches a request's selector, as the caller knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// `<namespace>/<name>`.
    pub id: &'a str,
    pub healthy: bool,
    pub latency_millis: i64,
    /// Capacity; 0 (or less) means the proxy is never leased.
    pub max_leases: i32,
    /// Its `pool` attribute (what a `pool` selector matches): a sharded store keeps a pool's
    /// leases together.
    pub pool: Option<&'a str>,
}

impl<'a> ProxyRef<'a> {
    /// A proxy of no pool.
    pub fn unpooled(id: &'a str) -> Self {
        Self { id, pool: None }
    }
}

impl Candidate<'_> {
    /// The order [`LeaseStore::acquire`] wants its candidates in: latency, then id.
    pub fn order(&self, other: &Self) -> std::cmp::Ordering {
        (self.latency_millis, self.id).cmp(&(other.latency_millis, other.id))
    }
}

/// Whether a proxy is one of an acquire's candidates, and as which: how a store checks that a
/// session's proxy still matches the request without reading every candidate.
pub type Member<'c> = dyn for<'p> Fn(&'p str) -> Option<Candidate<'c>> + Send + Sync + 'c;

/// Whether a lease's proxy may still be leased (offered and healthy): how a store checks a
/// renewal.
pub type Fit<'f> = dyn for<'p> Fn(&'p str) -> bool + Send + Sync + 'f;

/// What a client asks for, once validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    pub ttl: Duration,
    /// The site to be crawled.
    pub target: Option<Target>,
    /// Which proxies the candidates are.
    pub scope: Scope,
}

/// Which proxies an acquire's candidates are, so a shared store can answer from an index of
/// its own instead of reading them. Whatever the scope, the candidates are still given, in
/// order: a store without an index, or whose index cannot answer (no view published yet, or
/// one that does not know the index), reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Scope {
    /// Exactly the candidates given (a selector no index serves).
    #[default]
    Listed,
    /// Every offered proxy of the installation, as the published view holds them (an empty
    /// selector).
    Installation,
    /// Every offered proxy in all of these indexes ([`index_name`]s, at least one), as the
    /// published view holds them ([`ViewEntry::indexed`]): a selector whose every key is indexed.
    Indexed(Vec<String>),
}

/// The attribute that names a proxy's pool, always indexed: `pool=<name>` in [`Scope::Indexed`]
/// names the pool's members.
pub const POOL_KEY: &str = "pool";

/// The name of the index of the proxies whose attribute `key` is `value`.
pub fn index_name(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// A lease granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub lease_id: String,
    pub proxy_id: String,
    pub expires_at: SystemTime,
    /// How long from the answer the lease lives.
    pub ttl: Duration,
    /// The proxy's active leases, this one included.
    pub active_leases: usize,
    /// A lease that was held already, extended (a session's answered again, or a renewal):
    /// no new lease, no capacity taken.
    pub resumed: bool,
}

/// Why no lease was granted: the proxies considered, and why each was skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoMatch {
    pub considered: usize,
    pub at_capacity: usize,
    pub in_cooldown: usize,
    pub unhealthy: usize,
}

/// What a client reports about a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportResult {
    Ok,
    RateLimited,
    Banned,
}

impl std::str::FromStr for ReportResult {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "ok" => Ok(Self::Ok),
            "rate_limited" => Ok(Self::RateLimited),
            "banned" => Ok(Self::Banned),
            _ => Err(()),
        }
    }
}

/// A report on a lease never issued, or forgotten (one cooldown window after its expiry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no such lease")]
pub struct UnknownLease;

/// The store could not be reached or answered nonsense: nothing was granted, released or
/// recorded. The discovery API answers 503.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lease store unavailable: {0}")]
pub struct StoreError(pub String);

/// One proxy as the replica serving the discovery API sees it: what a shared store publishes so
/// that every replica decides with the same capacity, health and latency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewEntry {
    /// `<namespace>/<name>`.
    pub id: String,
    pub healthy: bool,
    pub latency_millis: i64,
    pub max_leases: i32,
    /// Whether it may get a new lease (`false`: a pool's standby or draining member). A shared
    /// store refuses a candidate its view marks not offered, so a replica whose cache has not
    /// yet seen the role change cannot lease it; such a candidate is not counted as considered.
    pub offered: bool,
    /// The indexes it is in ([`index_name`]s of its indexed attributes), for acquires scoped
    /// [`Scope::Indexed`].
    pub indexed: Vec<String>,
    /// Its `pool` attribute (see [`Candidate::pool`]).
    pub pool: Option<String>,
}

/// A proxy as a store finds its leases: its id and its pool (see [`Candidate::pool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyRef<'a> {
    /// `<namespace>/<name>`.
    pub id: &'a str,
    pub pool: Option<&'a str>,
}

/// A lease store. Implementations keep selection and insertion atomic. Every call may fail with
/// [`StoreError`] when the store lives elsewhere (Redis); the in-memory store never fails.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Grants a lease on the best eligible candidate. The candidates must come in ascending
    /// (latency, id) order ([`Candidate::order`]): the first idle eligible one is then the best,
    /// and the search stops there, whatever the size of the fleet. With
    /// [`Scope::Installation`] a shared store may choose from the published view's offered
    /// proxies instead, without reading the candidates; the grant may then name a proxy the
    /// caller does not know yet (its view is older than the published one).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable; inside, [`NoMatch`] with the counts when no
    /// candidate is eligible.
    async fn acquire<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError>;

    /// Grants a lease in a session ([`crate::session`]): the session's lease, extended, while
    /// its proxy is fit for the request; else, as [`acquire`](Self::acquire) does, a new one on
    /// the best eligible candidate, which the session then names. `member` tells whether a
    /// proxy is one of the request's candidates (the session's proxy need not be among the
    /// first the store reads).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable; inside, [`SessionRefused`] when nothing
    /// was granted.
    async fn acquire_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Result<Grant, SessionRefused>, StoreError>;

    /// Extends an active lease to `ttl` from now (never shortening it) while `fit` says its
    /// proxy may still be leased.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable; inside, [`NotRenewed`] when the lease has
    /// ended or its proxy is unfit.
    async fn renew(
        &self,
        lease_id: &str,
        ttl: Duration,
        fit: &Fit<'_>,
    ) -> Result<Result<Grant, NotRenewed>, StoreError>;

    /// The live leases of the session `key` ([`Session::key`]), for a report on the session:
    /// none once it has ended. A shared store with shards returns one for each shard the
    /// session lives in (a session asked for with two pools lives in both pools' shards).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable.
    async fn session_leases(&self, key: &str) -> Result<Vec<String>, StoreError>;

    /// Live sessions by client name, as last known, without waiting (read at scrape time):
    /// exact for the in-memory store, as of this replica's last session call or sweep for a
    /// shared one. Clients without a session are left out.
    fn sessions_now(&self) -> Vec<(String, usize)>;

    /// Ends a lease now. Unknown, expired or already released ids are fine.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable.
    async fn release(&self, lease_id: &str) -> Result<(), StoreError>;

    /// Records a report.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable; inside, [`UnknownLease`] for a lease never
    /// issued or already forgotten.
    async fn report(
        &self,
        lease_id: &str,
        result: ReportResult,
        target: Option<Target>,
    ) -> Result<Result<(), UnknownLease>, StoreError>;

    /// Cooldowns dropped to keep a proxy within [`MAX_COOLDOWN_TARGETS`], since start (by this
    /// replica, for a shared store).
    fn cooldowns_dropped(&self) -> u64;

    /// The active leases of each of `proxies`, in their order.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable.
    async fn active_leases(&self, proxies: &[ProxyRef<'_>]) -> Result<Vec<usize>, StoreError>;

    /// All active leases.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable.
    async fn active_total(&self) -> Result<usize, StoreError>;

    /// All active leases as last known, without waiting (`proxy_operator_leases_active` is read
    /// at scrape time, which cannot wait): exact for the in-memory store, as of this replica's
    /// last call or sweep for a shared one.
    fn active_total_now(&self) -> usize;

    /// Forgets leases past their retention and cooldowns that have ended.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable.
    async fn sweep(&self) -> Result<(), StoreError>;

    /// Publishes the proxies this replica serves, replacing the previous view as one step, so
    /// that every replica decides on the same capacity, health and latency. The in-memory store
    /// serves one replica and needs none.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store is unavailable.
    async fn publish_view(&self, view: &[ViewEntry]) -> Result<(), StoreError> {
        let _ = view;
        Ok(())
    }
}

/// A new lease id: 128 random bits from the OS-seeded CSPRNG, as 26 unpadded base32 characters.
pub fn lease_id() -> String {
    let bytes: [u8; 16] = rand::random();
    data_encoding::BASE32_NOPAD.encode(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_26_base32_characters_of_16_random_bytes() {
        let a = lease_id();
        let b = lease_id();
        assert_eq!(a.len(), 26);
        assert!(
            a.bytes().all(|c| c.is_ascii_uppercase() || (b'2'..=b'7').contains(&c)),
            "{a}"
        );
        assert_eq!(data_encoding::BASE32_NOPAD.decode(a.as_bytes()).unwrap().len(), 16);
        assert_ne!(a, b);
    }

    #[test]
    fn report_results_parse_exactly() {
        assert_eq!("ok".parse(), Ok(ReportResult::Ok));
        assert_eq!("rate_limited".parse(), Ok(ReportResult::RateLimited));
        assert_eq!("banned".parse(), Ok(ReportResult::Banned));
        for bad in ["", "OK", "ban", "rate-limited"] {
            assert_eq!(bad.parse::<ReportResult>(), Err(()), "{bad}");
        }
    }
}
