//! The in-memory store: all state behind one mutex, so selection and the new lease are one
//! atomic step and concurrent acquisitions never exceed a capacity. One replica only.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::clock::Clock;
use crate::session::{NotRenewed, Session, SessionRefused, extended};
use crate::store::{
    Candidate, Fit, Grant, LeaseRequest, LeaseStore, MAX_COOLDOWN_TARGETS, MAX_ENDED, Member, NoMatch, ProxyRef,
    ReportResult, StoreError, UnknownLease, lease_id,
};
use crate::target::Target;

#[derive(Debug, Clone)]
struct Lease {
    proxy: String,
    target: Option<Target>,
    expires_at: SystemTime,
    /// The session (`client/name`) it is the lease of, while it is.
    session: Option<String>,
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
    /// Each live session (`client/name`) to its lease: one that is neither released nor known
    /// to be expired (its expiry is noticed as its proxy's is, see [`State::active`]).
    sessions: HashMap<String, String>,
    /// Live sessions by client; clients without one are left out.
    session_counts: HashMap<String, usize>,
}

/// What became of a session's lease when its session asked again.
enum Resumed {
    /// Extended: the answer.
    Granted(Grant),
    /// Its proxy is unfit for the request: the lease is still held.
    Unfit,
    /// It had ended (the session with it).
    Ended,
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

    /// Records that a lease ended, and its session with it; forgets the oldest ended ones
    /// beyond [`MAX_ENDED`].
    fn ended(&mut self, lease_id: String) {
        self.end_session(&lease_id);
        self.ended.push_back(lease_id);
        while self.ended.len() > self.max_ended {
            if let Some(oldest) = self.ended.pop_front() {
                self.leases.remove(&oldest);
            }
        }
    }

    /// `candidate`, or another new lease id if it is taken: 128 random bits do not collide in
    /// practice; checked all the same.
    fn free_id(&self, mut candidate: String) -> String {
        while self.leases.contains_key(&candidate) {
            candidate = lease_id();
        }
        candidate
    }

    /// Ends the session whose lease `lease_id` is, if it still is.
    fn end_session(&mut self, lease_id: &str) {
        if let Some(key) = self.leases.get_mut(lease_id).and_then(|l| l.session.take()) {
            self.drop_session(&key, lease_id);
        }
    }

    /// Forgets the session `key` if `lease_id` is still its lease.
    fn drop_session(&mut self, key: &str, lease_id: &str) {
        if self.sessions.get(key).is_none_or(|l| l != lease_id) {
            return;
        }
        self.sessions.remove(key);
        let client = key.split_once('/').map_or(key, |(c, _)| c);
        if let Some(n) = self.session_counts.get_mut(client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.session_counts.remove(client);
            }
        }
    }

    /// The best eligible candidate and its active leases, or the counts of why there is none.
    fn choose<'c>(
        &mut self,
        candidates: &mut dyn Iterator<Item = Candidate<'c>>,
        target: Option<Target>,
        now: SystemTime,
    ) -> Result<(usize, &'c str), NoMatch> {
        let mut refused = NoMatch::default();
        let mut best: Option<(usize, i64, &'c str)> = None;
        for c in candidates {
            refused.considered += 1;
            if !c.healthy {
                refused.unhealthy += 1;
                continue;
            }
            let active = self.active(c.id, now);
            if i64::try_from(active).unwrap_or(i64::MAX) >= i64::from(c.max_leases) {
                refused.at_capacity += 1;
                continue;
            }
            if self.cooling(c.id, target, now) {
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
        best.map(|(active, _, proxy)| (active, proxy)).ok_or(refused)
    }

    /// Records a new lease `lease_id` (free) on `proxy`, which had `active` leases.
    fn grant(&mut self, lease_id: String, proxy: &str, active: usize, req: &LeaseRequest, now: SystemTime) -> Grant {
        let expires_at = now + req.ttl;
        self.leases.insert(
            lease_id.clone(),
            Lease {
                proxy: proxy.to_owned(),
                target: req.target,
                expires_at,
                session: None,
            },
        );
        self.active
            .entry(proxy.to_owned())
            .or_default()
            .push((expires_at, lease_id.clone()));
        Grant {
            lease_id,
            proxy_id: proxy.to_owned(),
            expires_at,
            ttl: req.ttl,
            active_leases: active + 1,
            resumed: false,
        }
    }

    /// Ends an unreleased lease now; nothing for an unknown, expired or released one.
    fn release(&mut self, lease_id: &str) {
        let Some(proxy) = self.leases.get(lease_id).map(|l| l.proxy.clone()) else {
            return;
        };
        let Some(leases) = self.active.get_mut(&proxy) else {
            return;
        };
        let before = leases.len();
        leases.retain(|(_, id)| id != lease_id);
        let released = leases.len() < before;
        if leases.is_empty() {
            self.active.remove(&proxy);
        }
        if released {
            self.ended(lease_id.to_owned());
        }
    }

    /// The lease's proxy and that proxy's active leases while the lease is one of them (its
    /// expiry noticed first); `None` once it has ended.
    fn live_lease(&mut self, lease_id: &str, now: SystemTime) -> Option<(String, usize)> {
        let proxy = self.leases.get(lease_id)?.proxy.clone();
        let active = self.active(&proxy, now);
        let list = self.active.get(&proxy)?;
        list.iter().any(|(_, id)| id == lease_id).then_some((proxy, active))
    }

    /// Extends the held lease `lease_id` on `proxy` (with `active` leases) to `ttl` from now.
    fn extend(&mut self, lease_id: &str, proxy: String, active: usize, ttl: Duration, now: SystemTime) -> Grant {
        let mut expires_at = now + ttl;
        if let Some(lease) = self.leases.get_mut(lease_id) {
            lease.expires_at = extended(lease.expires_at, now, ttl);
            expires_at = lease.expires_at;
        }
        if let Some(entry) = self
            .active
            .get_mut(&proxy)
            .and_then(|list| list.iter_mut().find(|(_, id)| id == lease_id))
        {
            entry.0 = expires_at;
        }
        Grant {
            lease_id: lease_id.to_owned(),
            proxy_id: proxy,
            expires_at,
            ttl: expires_at.duration_since(now).unwrap_or_default(),
            active_leases: active,
            resumed: true,
        }
    }

    /// The session's lease `lease_id`, extended while its proxy is fit for `req`.
    fn resume<'c>(&mut self, lease_id: &str, member: &Member<'c>, req: &LeaseRequest, now: SystemTime) -> Resumed {
        let Some((proxy, active)) = self.live_lease(lease_id, now) else {
            return Resumed::Ended;
        };
        let fit = member(&proxy).is_some_and(|c| c.healthy) && !self.cooling(&proxy, req.target, now);
        if !fit {
            return Resumed::Unfit;
        }
        Resumed::Granted(self.extend(lease_id, proxy, active, req.ttl, now))
    }

    /// Makes `lease_id` the lease of the (new or moved) session `key` of `client`.
    fn bind(&mut self, key: String, client: &str, lease_id: &str) {
        if let Some(lease) = self.leases.get_mut(lease_id) {
            lease.session = Some(key.clone());
        }
        if self.sessions.insert(key, lease_id.to_owned()).is_none() {
            *self.session_counts.entry(client.to_owned()).or_default() += 1;
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
        // Made before the lock is taken: the critical section stays short under many clients.
        let lease_id = lease_id();
        let mut state = self.lock();
        let (active, proxy) = state.choose(candidates, req.target, now)?;
        let lease_id = state.free_id(lease_id);
        Ok(state.grant(lease_id, proxy, active, req, now))
    }

    fn acquire_session_now<'c>(
        &self,
        candidates: &mut dyn Iterator<Item = Candidate<'c>>,
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Grant, SessionRefused> {
        let now = self.clock.now();
        let key = session.key();
        let lease_id = lease_id();
        let mut state = self.lock();
        if let Some(current) = state.sessions.get(&key).cloned() {
            match state.resume(&current, member, req, now) {
                Resumed::Granted(grant) => return Ok(grant),
                // Given back, the session ends, and moving it counts against the cap no more
                // than it did.
                Resumed::Unfit => state.release(&current),
                Resumed::Ended => state.drop_session(&key, &current),
            }
        }
        let held = state.session_counts.get(session.client).copied().unwrap_or(0);
        if held >= session.cap {
            return Err(SessionRefused::TooMany { held, cap: session.cap });
        }
        let (active, proxy) = state
            .choose(candidates, req.target, now)
            .map_err(SessionRefused::NoMatch)?;
        let lease_id = state.free_id(lease_id);
        let grant = state.grant(lease_id, proxy, active, req, now);
        state.bind(key, session.client, &grant.lease_id);
        Ok(grant)
    }

    fn renew_now(&self, lease_id: &str, ttl: Duration, fit: &Fit<'_>) -> Result<Grant, NotRenewed> {
        let now = self.clock.now();
        let mut state = self.lock();
        let (proxy, active) = state.live_lease(lease_id, now).ok_or(NotRenewed::Ended)?;
        if !fit(&proxy) {
            return Err(NotRenewed::Unfit { proxy });
        }
        Ok(state.extend(lease_id, proxy, active, ttl, now))
    }

    fn release_now(&self, lease_id: &str) {
        self.lock().release(lease_id);
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

    async fn acquire_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Result<Grant, SessionRefused>, StoreError> {
        Ok(self.acquire_session_now(candidates, member, req, session))
    }

    async fn renew(
        &self,
        lease_id: &str,
        ttl: Duration,
        fit: &Fit<'_>,
    ) -> Result<Result<Grant, NotRenewed>, StoreError> {
        Ok(self.renew_now(lease_id, ttl, fit))
    }

    async fn session_leases(&self, key: &str) -> Result<Vec<String>, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let Some(lease_id) = state.sessions.get(key).cloned() else {
            return Ok(Vec::new());
        };
        // Its lease may have expired unnoticed: then the session has ended with it.
        Ok(state.live_lease(&lease_id, now).map(|_| lease_id).into_iter().collect())
    }

    fn sessions_now(&self) -> Vec<(String, usize)> {
        let mut counts: Vec<(String, usize)> = self.lock().session_counts.clone().into_iter().collect();
        counts.sort();
        counts
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

    async fn active_leases(&self, proxies: &[ProxyRef<'_>]) -> Result<Vec<usize>, StoreError> {
        let ids: Vec<&str> = proxies.iter().map(|p| p.id).collect();
        Ok(self.active_leases_now(&ids))
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
