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

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::clock::Clock;
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
}

impl Candidate<'_> {
    /// The order [`LeaseStore::acquire`] wants its candidates in: latency, then id.
    pub fn order(&self, other: &Self) -> std::cmp::Ordering {
        (self.latency_millis, self.id).cmp(&(other.latency_millis, other.id))
    }
}

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
/// its own instead of reading them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scope {
    /// Exactly the candidates given (a selector no index serves).
    #[default]
    Listed,
    /// Every offered proxy of the installation, as the published view holds them (an empty
    /// selector). The candidates are still given, in order: a store without an index, or whose
    /// index is not built (no view published yet), reads them.
    Installation,
}

/// A lease granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub lease_id: String,
    pub proxy_id: String,
    pub expires_at: SystemTime,
    pub ttl: Duration,
    /// The proxy's active leases, this one included.
    pub active_leases: usize,
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
    async fn active_leases(&self, proxies: &[&str]) -> Result<Vec<usize>, StoreError>;

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

#[derive(Debug, Clone)]
struct Lease {
    proxy: String,
    target: Option<Target>,
    expires_at: SystemTime,
}

/// One proxy's cooldowns: their ends, global and by target.
#[derive(Debug, Default)]
struct Cooldowns {
    global: Option<SystemTime>,
    targets: HashMap<Target, SystemTime>,
}

impl Cooldowns {
    fn blocks(&self, target: Option<Target>, now: SystemTime) -> bool {
        self.global.is_some_and(|end| end > now)
            || target.is_some_and(|t| self.targets.get(&t).is_some_and(|end| *end > now))
    }

    /// Starts or extends a cooldown until `end`; `true` when another had to be dropped for it.
    fn start(&mut self, target: Option<Target>, end: SystemTime, now: SystemTime) -> bool {
        let Some(target) = target else {
            self.global = Some(self.global.map_or(end, |e| e.max(end)));
            return false;
        };
        if let Some(slot) = self.targets.get_mut(&target) {
            *slot = (*slot).max(end);
            return false;
        }
        let mut dropped = false;
        if self.targets.len() >= MAX_COOLDOWN_TARGETS {
            self.targets.retain(|_, e| *e > now);
        }
        if self.targets.len() >= MAX_COOLDOWN_TARGETS
            && let Some(soonest) = self.targets.iter().min_by_key(|(_, e)| **e).map(|(t, _)| *t)
        {
            self.targets.remove(&soonest);
            dropped = true;
        }
        self.targets.insert(target, end);
        dropped
    }

    fn forget_ended(&mut self, now: SystemTime) -> bool {
        self.global = self.global.filter(|e| *e > now);
        self.targets.retain(|_, e| *e > now);
        self.global.is_some() || !self.targets.is_empty()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Every lease not yet forgotten (reports need them after their end).
    leases: HashMap<String, Lease>,
    /// The unreleased leases of each proxy, with their expiry. Released ones leave at once and
    /// expired ones whenever the proxy is next considered (or at the sweep), so these lists
    /// stay as short as the capacities.
    active: HashMap<String, Vec<(SystemTime, String)>>,
    /// Ended leases, oldest first; beyond `max_ended` the oldest are forgotten.
    ended: VecDeque<String>,
    cooldowns: HashMap<String, Cooldowns>,
    dropped: u64,
    /// [`MemoryStore::with_max_ended`], or [`MAX_ENDED`].
    max_ended: usize,
}

impl State {
    /// The proxy's active leases, having moved its expired ones to the ended.
    fn active(&mut self, proxy: &str, now: SystemTime) -> usize {
        let Some(list) = self.active.get_mut(proxy) else {
            return 0;
        };
        if list.iter().any(|(expires, _)| *expires <= now) {
            let (live, expired): (Vec<_>, Vec<_>) = list.drain(..).partition(|(expires, _)| *expires > now);
            *list = live;
            let n = list.len();
            if n == 0 {
                self.active.remove(proxy);
            }
            for (_, id) in expired {
                self.ended(id);
            }
            return n;
        }
        list.len()
    }

    fn cooling(&self, proxy: &str, target: Option<Target>, now: SystemTime) -> bool {
        self.cooldowns.get(proxy).is_some_and(|c| c.blocks(target, now))
    }

    /// Records that a lease ended; forgets the oldest ended ones beyond [`MAX_ENDED`].
    fn ended(&mut self, lease_id: String) {
        self.ended.push_back(lease_id);
        while self.ended.len() > self.max_ended {
            if let Some(oldest) = self.ended.pop_front() {
                self.leases.remove(&oldest);
            }
        }
    }
}

/// The in-memory store: all state behind one mutex.
pub struct MemoryStore {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    cooldown: Duration,
    max_ended: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("cooldown", &self.cooldown)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store whose cooldown window (and lease retention after expiry) is `cooldown`.
    pub fn new(clock: Arc<dyn Clock>, cooldown: Duration) -> Self {
        Self {
            state: Mutex::default(),
            clock,
            cooldown,
            max_ended: MAX_ENDED,
        }
    }

    /// The same store keeping at most `max_ended` ended leases reportable (tests of the bound).
    #[must_use]
    pub fn with_max_ended(mut self, max_ended: usize) -> Self {
        self.max_ended = max_ended;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.max_ended = self.max_ended;
        state
    }

    /// Whether `proxy` is cooling down for a request naming `target` (tests and the API's views).
    pub fn cooling(&self, proxy: &str, target: Option<Target>) -> bool {
        self.lock().cooling(proxy, target, self.clock.now())
    }

    /// Leases remembered, active or ended, and cooldowns held (tests of the bounds).
    pub fn held(&self) -> (usize, usize) {
        let state = self.lock();
        let cooldowns = state
            .cooldowns
            .values()
            .map(|c| c.targets.len() + usize::from(c.global.is_some()))
            .sum();
        (state.leases.len(), cooldowns)
    }
}

impl MemoryStore {
    fn acquire_now<'c>(
        &self,
        candidates: &mut dyn Iterator<Item = Candidate<'c>>,
        req: &LeaseRequest,
    ) -> Result<Grant, NoMatch> {
        let now = self.clock.now();
        let target = req.target;
        // Made before the lock is taken: the critical section stays short under many clients.
        let mut lease_id = lease_id();
        let mut state = self.lock();
        let mut refused = NoMatch::default();
        let mut best: Option<(usize, i64, &'c str)> = None;
        for c in candidates {
            refused.considered += 1;
            if !c.healthy {
                refused.unhealthy += 1;
                continue;
            }
            let active = state.active(c.id, now);
            if i64::try_from(active).unwrap_or(i64::MAX) >= i64::from(c.max_leases) {
                refused.at_capacity += 1;
                continue;
            }
            if state.cooling(c.id, target, now) {
                refused.in_cooldown += 1;
                continue;
            }
            if best.is_none_or(|b| (active, c.latency_millis, c.id) < b) {
                best = Some((active, c.latency_millis, c.id));
            }
            if active == 0 {
                // In (latency, id) order, the first idle eligible proxy cannot be beaten.
                break;
            }
        }
        let Some((active, _, proxy)) = best else {
            return Err(refused);
        };
        let proxy = proxy.to_string();
        // 128 random bits do not collide in practice; checked all the same.
        while state.leases.contains_key(&lease_id) {
            lease_id = self::lease_id();
        }
        let expires_at = now + req.ttl;
        state.leases.insert(
            lease_id.clone(),
            Lease {
                proxy: proxy.clone(),
                target,
                expires_at,
            },
        );
        state
            .active
            .entry(proxy.clone())
            .or_default()
            .push((expires_at, lease_id.clone()));
        Ok(Grant {
            lease_id,
            proxy_id: proxy,
            expires_at,
            ttl: req.ttl,
            active_leases: active + 1,
        })
    }

    fn release_now(&self, lease_id: &str) {
        let mut state = self.lock();
        let Some(proxy) = state.leases.get(lease_id).map(|l| l.proxy.clone()) else {
            return;
        };
        let Some(leases) = state.active.get_mut(&proxy) else {
            return;
        };
        let before = leases.len();
        leases.retain(|(_, id)| id != lease_id);
        let released = leases.len() < before;
        if leases.is_empty() {
            state.active.remove(&proxy);
        }
        if released {
            state.ended(lease_id.to_owned());
        }
    }

    fn report_now(&self, lease_id: &str, result: ReportResult, target: Option<Target>) -> Result<(), UnknownLease> {
        let now = self.clock.now();
        let mut state = self.lock();
        let lease = state.leases.get(lease_id).ok_or(UnknownLease)?;
        // Forgotten one window after expiry, whether or not the sweep has run yet.
        if lease.expires_at + self.cooldown <= now {
            return Err(UnknownLease);
        }
        // A zero window (`--lease-cooldown=0`) rests nothing, so there is nothing to record.
        if result == ReportResult::Ok || self.cooldown.is_zero() {
            return Ok(());
        }
        let resolved = target.or(lease.target);
        let proxy = lease.proxy.clone();
        let end = now + self.cooldown;
        if state.cooldowns.entry(proxy).or_default().start(resolved, end, now) {
            state.dropped += 1;
        }
        Ok(())
    }

    fn active_leases_now(&self, proxies: &[&str]) -> Vec<usize> {
        let now = self.clock.now();
        let mut state = self.lock();
        proxies.iter().map(|p| state.active(p, now)).collect()
    }

    fn total_now(&self) -> usize {
        let now = self.clock.now();
        self.lock()
            .active
            .values()
            .map(|leases| leases.iter().filter(|(expires, _)| *expires > now).count())
            .sum()
    }

    fn sweep_now(&self) {
        let now = self.clock.now();
        let cooldown = self.cooldown;
        let mut state = self.lock();
        let mut expired = Vec::new();
        state.active.retain(|_, list| {
            list.retain(|(expires, id)| {
                let live = *expires > now;
                if !live {
                    expired.push(id.clone());
                }
                live
            });
            !list.is_empty()
        });
        for id in expired {
            state.ended(id);
        }
        let State {
            leases,
            ended,
            cooldowns,
            ..
        } = &mut *state;
        leases.retain(|_, l| l.expires_at + cooldown > now);
        ended.retain(|id| leases.contains_key(id));
        cooldowns.retain(|_, c| c.forget_ended(now));
    }
}

#[async_trait::async_trait]
impl LeaseStore for MemoryStore {
    async fn acquire<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        Ok(self.acquire_now(candidates, req))
    }

    async fn release(&self, lease_id: &str) -> Result<(), StoreError> {
        self.release_now(lease_id);
        Ok(())
    }

    async fn report(
        &self,
        lease_id: &str,
        result: ReportResult,
        target: Option<Target>,
    ) -> Result<Result<(), UnknownLease>, StoreError> {
        Ok(self.report_now(lease_id, result, target))
    }

    fn cooldowns_dropped(&self) -> u64 {
        self.lock().dropped
    }

    async fn active_leases(&self, proxies: &[&str]) -> Result<Vec<usize>, StoreError> {
        Ok(self.active_leases_now(proxies))
    }

    async fn active_total(&self) -> Result<usize, StoreError> {
        Ok(self.total_now())
    }

    fn active_total_now(&self) -> usize {
        self.total_now()
    }

    async fn sweep(&self) -> Result<(), StoreError> {
        self.sweep_now();
        Ok(())
    }
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
