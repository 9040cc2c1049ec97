//! The lease store on Redis: every replica of the discovery API shares leases, capacity and
//! cooldowns, and a restart loses nothing that Redis kept.
//!
//! Each operation is one Lua script, run as a function of a library the store loads into
//! Redis (`functions.rs`), so Redis runs it atomically: acquire decides capacity,
//! cooldowns and the selection order inside Redis, and two replicas can never both take a
//! proxy's last slot. The scripts read Redis's own clock, so replicas agree on the time
//! whatever theirs say (tests inject a clock with [`RedisStore::with_clock`]).
//!
//! Keys, each starting with `{<prefix>}` (default prefix [`DEFAULT_PREFIX`]) and each with a TTL
//! so nothing outlives its use. The braces make the prefix the keys' hash tag: on a Redis
//! Cluster every key of one store is in one slot, so each script runs on one node.
//!
//! | Key | Type | Holds | Lives |
//! |---|---|---|---|
//! | `lease:<id>` | string | `<expires (ms)>,<target digest>,<proxy>` | until one cooldown window (at least [`EXPIRY_GRACE`]) after its expiry, or until it is among the oldest beyond the newest [`MAX_ENDED`] ended leases |
//! | `active:<proxy>` | sorted set | the proxy's unreleased leases by expiry | [`EXPIRY_GRACE`] past its last lease's expiry |
//! | `all` | sorted set | every unreleased lease by expiry | [`EXPIRY_GRACE`] past the last lease's expiry |
//! | `ended` | list | leases released or found expired, oldest first | as long as the longest-lived record it names; at most [`MAX_ENDED`] entries |
//! | `cool:<proxy>` | hash | cooldown end (ms) by target digest (`""`: global); at most [`MAX_COOLDOWN_TARGETS`] targets | one cooldown window after the last report |
//! | `view` | hash | `healthy,latency,max,offered` and, after a NUL each, the indexes it is in, by proxy id, as published | [`VIEW_LIFETIME`] after the last publication |
//! | `count` | hash | the view's offered and unhealthy proxies, and its publication's token; per index `o:<name>`, `u:<name>` | as the view |
//! | `free` | sorted set | the installation's index: the view's offered, healthy proxies with room, by (active leases, latency, id) | as the view |
//! | `free:<key>=<value>` | sorted set | the same, of the proxies whose indexed attribute `key` is `value` | as the view |
//! | `indexes` | set | the names of the attribute indexes (what each publication keeps alive) | as the view |
//! | `session:<client>/<name>` | string | `<lease>,<proxy>`: the session's lease | [`EXPIRY_GRACE`] past its lease's expiry, or until the lease is released |
//! | `lsess:<lease>` | string | the session (`<client>/<name>`) the lease is of | as the lease's record |
//! | `sessions:<client>` | sorted set | the client's sessions by their lease's expiry; at most its cap live | [`EXPIRY_GRACE`] past the last lease's expiry |
//! | `session-clients` | set | the clients with sessions (the sweep counts each one's) | as the longest-lived `sessions:` |
//!
//! An acquire scoped to the installation ([`Scope::Installation`], an empty selector) is
//! answered from `free`: its head, passing over at most [`INDEX_LOOK`] proxies that cool down
//! for the request. One scoped to attribute indexes ([`Scope::Indexed`], a selector whose every
//! key is indexed) is answered the same way from the smallest of its indexes, passing over the
//! proxies that are not in the others too. Every script that grants or ends a lease, and every
//! publication, moves the proxies it touches in `free` and in their indexes, so an acquire, a
//! release, a report and the expiry of a lease each do a bounded amount of work whatever the
//! fleet's size (one step per index a proxy is in). Other selectors send their candidates (at
//! most [`BATCH`] at first, every one when those are busy).
//!
//! Those installation-wide acquires, and all releases, go to Redis in rounds (`gather.rs`,
//! `calls::Rounds`): the requests that arrive while a round is on its way go together in the
//! next, its releases in one call and its acquires in another, handed to Redis at once so that
//! one sync of its append-only file covers both; each script answers its requests in turn, as
//! if they had come one after another.
//!
//! Sessions and renewal (`session.rs`) extend a lease in place: its expiry in `all`, in its
//! proxy's set, in its record and in its session's keys.
//!
//! The scripts need Redis 7.0 or later (Functions, `PEXPIRE` with `GT`/`NX`, `LPOP` with a count).
//!
//! When Redis cannot be reached every call fails with [`StoreError`] within about two
//! [`CALL_BUDGET`]s (one waiting for a batch, one for its own call; the API answers 503) and
//! nothing is granted; the connection is made again
//! by itself at the next call once Redis is back.

mod calls;
mod connection;
mod functions;
mod gather;
mod publish;
mod session;
mod tls;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use egress_lease::{
    Candidate, Clock, Fit, Grant, LeaseRequest, LeaseStore, MAX_COOLDOWN_TARGETS, MAX_ENDED, Member, NoMatch,
    NotRenewed, ReportResult, Scope, Session, SessionRefused, StoreError, Target, UnknownLease, ViewEntry, lease_id,
};

use crate::calls::{Answer, Calls, Indexed, Reply, Request, Rounds, count, expiry, int, parse, text};
pub use crate::connection::shown_url;
use crate::connection::{Current, split_wait};
use crate::functions::{Library, Op};
use crate::gather::Gather;
pub use crate::publish::PUBLISH_CHUNK;
use crate::publish::Published;
pub use crate::tls::{ClientIdentity, Tls, TlsRoots};

/// The key prefix unless told otherwise.
pub const DEFAULT_PREFIX: &str = "egress-proxy:";
/// The most one store call may take, connecting included.
pub const CALL_BUDGET: Duration = Duration::from_secs(3);
/// Candidates in an acquire's first script run. The first idle eligible candidate ends the
/// search, so on a fleet with free proxies that run is all it takes; otherwise a second run
/// gets every candidate.
pub const BATCH: usize = 64;
/// How long a published view stays without being published again.
pub const VIEW_LIFETIME: Duration = Duration::from_secs(300);
/// The proxies at the head of the installation's index an acquire looks at, at most: those
/// with room but cooling down for the request are passed over; beyond this many the caller's
/// candidates are read instead.
pub const INDEX_LOOK: usize = 128;
/// How long a grant waits for its replicas with the URL's `wait`, at most.
pub const WAIT_BUDGET: Duration = Duration::from_secs(1);
/// How long past its expiry a lease stays in the indexes and its record, at least (`GRACE` in
/// `lua/index.lua`): its expiry is noticed by reading them, by an acquire or by the sweep.
pub const EXPIRY_GRACE: Duration = Duration::from_secs(360);
/// Indexed acquire runs that may each move a thousand expired leases before the choice, at
/// most; past them the caller's candidates decide.
pub const EXPIRY_RUNS: usize = 4;

/// Milliseconds since the epoch.
fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn duration_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The scheme of a Redis Cluster's URL.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";
/// The scheme of a Redis Cluster's URL over TLS.
pub const TLS_CLUSTER_SCHEME: &str = "rediss+cluster://";

/// The lease store on one Redis server, or on a Redis Cluster: every key of one store lives in
/// one slot.
pub struct RedisStore {
    calls: Arc<Calls>,
    /// The installation's acquires and all releases, sent to Redis in rounds.
    rounds: Gather<Rounds>,
    /// All active leases as of this replica's last call (the scrape-time gauge).
    last_total: AtomicUsize,
    /// Cooldowns this replica's reports dropped for [`MAX_COOLDOWN_TARGETS`].
    dropped: AtomicU64,
    /// Live sessions by client, as of this replica's last session call or sweep.
    sessions: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    /// This replica's last publication of the view, while it is known to be the one in Redis.
    published: tokio::sync::Mutex<Option<Published>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("redis", &self.calls.shown)
            .field("keys", &self.calls.tag)
            .field("cooldown", &self.calls.cooldown)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on the Redis at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `redis+cluster://[user:password@]host:port[,host:port…]` for a Redis Cluster; `rediss`
    /// for either over TLS, the server checked against the system's CA certificates), keys under
    /// `{<prefix>}`, with the cooldown window (and lease retention after expiry) `cooldown`,
    /// on Redis's clock. Connects lazily: a Redis that is down at start only makes calls fail
    /// until it is up. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The URL is not a Redis URL, or the prefix holds a brace (it would break the hash tag).
    pub fn new(url: &str, prefix: &str, cooldown: Duration) -> Result<Self, String> {
        Self::new_with_tls(url, prefix, cooldown, &Tls::default())
    }

    /// [`new`](Self::new), over TLS as `tls` says: what the server's certificate must chain
    /// to, and the certificate the store shows it. TLS uses rustls's process-wide crypto
    /// provider (the operator installs ring at start); a program that builds in more than one
    /// provider installs one before its first call.
    ///
    /// # Errors
    /// As [`new`](Self::new); also CA certificates or a client certificate given for a URL
    /// without TLS, and a URL fragment (the client library's `#insecure` would turn the check
    /// off).
    pub fn new_with_tls(url: &str, prefix: &str, cooldown: Duration, tls: &Tls) -> Result<Self, String> {
        let shown = shown_url(url);
        let tag = tag(prefix)?;
        let (url, wait_replicas) = split_wait(url).map_err(|e| format!("lease store {shown}: {e}"))?;
        let connection = Current::open(&url, tls).map_err(|e| format!("lease store {shown}: {e}"))?;
        Ok(Self::on(Calls {
            connection: Arc::new(connection),
            library: Arc::new(Library::new()),
            tag,
            clock: None,
            cooldown,
            max_ended: MAX_ENDED,
            shown,
            wait_replicas,
        }))
    }

    /// Makes the store's calls from now on go over a new connection made with `tls`: a renewed
    /// client certificate or a rotated CA takes effect without a new store (the operator
    /// re-reads its TLS files). Calls on their way end on the connection they started on;
    /// leases and everything else in Redis are untouched. Every store made from this one
    /// (`with_*`) shares its connection, and so the change.
    ///
    /// # Errors
    /// As [`new_with_tls`](Self::new_with_tls) for the store's URL; the connection in use
    /// then stays.
    pub fn use_tls(&self, tls: &Tls) -> Result<(), String> {
        self.calls
            .connection
            .replace(tls)
            .map_err(|e| format!("lease store {}: {e}", self.calls.shown))
    }

    fn on(calls: Calls) -> Self {
        let calls = Arc::new(calls);
        Self {
            rounds: Gather::new(Arc::new(Rounds(calls.clone()))),
            calls,
            last_total: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            sessions: std::sync::Mutex::default(),
            published: tokio::sync::Mutex::new(None),
        }
    }

    /// Each operation's name (`acquire`, `acquire_indexed`, `release`, `report`, `active`,
    /// `sweep`, `publish`) and its function's (what `FCALL` and Redis's slow log name it by),
    /// for benches and diagnostics that attribute Redis's time to the operations.
    pub fn function_names(&self) -> Vec<(&'static str, String)> {
        Op::ALL
            .iter()
            .map(|op| (op.name(), self.calls.library.function(*op)))
            .collect()
    }

    /// The same store keeping at most `max_ended` ended leases reportable (tests of the bound).
    #[must_use]
    pub fn with_max_ended(self, max_ended: usize) -> Self {
        Self::on(Calls {
            max_ended,
            ..(*self.calls).clone()
        })
    }

    /// The same store (and connection) with its keys under `prefix`: a caller that checks the
    /// URL and TLS settings before it knows the prefix (the operator, before it has asked the
    /// cluster for its installation id).
    ///
    /// # Errors
    /// The prefix holds a brace (it would break the hash tag).
    pub fn with_prefix(self, prefix: &str) -> Result<Self, String> {
        Ok(Self::on(Calls {
            tag: tag(prefix)?,
            ..(*self.calls).clone()
        }))
    }

    /// The same store on `clock` instead of Redis's (tests that move time by hand).
    #[must_use]
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self::on(Calls {
            clock: Some(clock),
            ..(*self.calls).clone()
        })
    }

    /// Runs the operation's function on the store's keys with `args` within [`CALL_BUDGET`].
    async fn run<T: redis::FromRedisValue>(&self, op: Op, args: &[String]) -> Result<T, StoreError> {
        self.calls.run(op, args).await
    }

    /// One run of the acquire script over `batch`; `None` when the batch had no idle eligible
    /// proxy and was not `last` (the caller then sends every candidate).
    async fn acquire_listed(
        &self,
        batch: &[Candidate<'_>],
        last: bool,
        req: &LeaseRequest,
    ) -> Result<Option<Result<Grant, NoMatch>>, StoreError> {
        let answer = self.run_listed(batch, last, req, None).await?;
        Ok(self.answer(answer, req))
    }

    /// One run of the acquire script over `batch`, in the session `session` (its key and the
    /// client's cap) if any. Tried with a new lease id when the last was taken (three tries).
    async fn run_listed(
        &self,
        batch: &[Candidate<'_>],
        last: bool,
        req: &LeaseRequest,
        session: Option<(&str, usize)>,
    ) -> Result<Answer, StoreError> {
        let mut args = vec![
            self.calls.now(),
            duration_millis(req.ttl).to_string(),
            req.target.as_ref().map(Target::hex).unwrap_or_default(),
            String::new(),
            duration_millis(self.calls.cooldown).to_string(),
            batch.len().to_string(),
            if last { "1" } else { "0" }.to_owned(),
            self.calls.max_ended.to_string(),
            session.map(|(key, _)| key.to_owned()).unwrap_or_default(),
            session.map_or(0, |(_, cap)| cap).to_string(),
        ];
        for c in batch {
            args.push(c.id.to_owned());
            args.push(if c.healthy { "1" } else { "0" }.to_owned());
            args.push(c.latency_millis.to_string());
            args.push(c.max_leases.to_string());
        }
        for _ in 0..3 {
            args[3] = lease_id();
            let answer = self
                .calls
                .run_acquire(Op::Acquire, &args)
                .await
                .and_then(|(answer, replicated)| {
                    // A grant carries all active leases after its lease.
                    let granted = matches!(answer.first(), Some(redis::Value::Int(1)));
                    let total = if granted { int(answer.get(4))? } else { 0 };
                    let parsed = parse(&answer, &args[3], total)?;
                    if granted {
                        self.calls.replicated(replicated)?;
                    }
                    Ok(parsed)
                });
            match answer {
                Ok(Answer::Taken { lease_id }) => self.calls.release_later(lease_id),
                Ok(answer) => return Ok(answer),
                Err(e) => {
                    // The script may have run and granted with its answer lost, or granted
                    // what no replica had in time: that lease is given back, so a retried
                    // request does not find the slot taken.
                    self.calls.release_later(args[3].clone());
                    return Err(e);
                }
            }
        }
        Err(taken())
    }

    /// Acquires from the index of `names` (none: the installation's), in a batch with the
    /// acquires that arrive meanwhile; `None` when the index cannot answer (no view published,
    /// one that does not know the index, cooldowns at its head hiding more than [`INDEX_LOOK`]
    /// proxies, several indexes with no proxy in all): the caller then sends its candidates.
    async fn acquire_indexed(
        &self,
        req: &LeaseRequest,
        names: &[String],
    ) -> Result<Option<Result<Grant, NoMatch>>, StoreError> {
        let target = req.target.as_ref().map(Target::hex).unwrap_or_default();
        for _ in 0..3 {
            let request = Indexed {
                ttl: req.ttl,
                target: target.clone(),
                lease_id: lease_id(),
                names: names.to_vec(),
            };
            match self.rounds.call(Request::Acquire(request)).await? {
                Reply::Acquire(Answer::Taken { lease_id }) => self.calls.release_later(lease_id),
                Reply::Acquire(answer) => return Ok(self.answer(answer, req)),
                Reply::Release(_) => return Err(mixed_up()),
            }
        }
        Err(taken())
    }

    /// What an acquire answers for a script's answer other than [`Answer::Taken`]; `None` for
    /// [`Answer::Candidates`].
    fn answer(&self, answer: Answer, req: &LeaseRequest) -> Option<Result<Grant, NoMatch>> {
        match answer {
            Answer::Granted {
                lease_id,
                proxy,
                active,
                expires,
                total,
                sessions: _,
            } => {
                self.remember_total(total);
                Some(Ok(Grant {
                    lease_id,
                    proxy_id: proxy,
                    expires_at: expiry(expires),
                    ttl: req.ttl,
                    active_leases: active,
                    resumed: false,
                }))
            }
            Answer::NoMatch(n) => Some(Err(n)),
            // The last two only answer a request in a session (`session.rs`).
            Answer::Candidates | Answer::Taken { .. } | Answer::SessionChanged | Answer::TooManySessions { .. } => None,
        }
    }

    fn remember_total(&self, total: i64) {
        self.last_total
            .store(usize::try_from(total).unwrap_or(0), Ordering::Relaxed);
    }
}

/// A round answered a request with the other kind's answer: a fault of the round.
fn mixed_up() -> StoreError {
    StoreError("a round answered a request of another kind".to_owned())
}

/// Three lease ids in a row taken (see [`Answer::Taken`]): 128 random bits do not collide in
/// practice, so that is a fault.
fn taken() -> StoreError {
    StoreError("three lease ids in a row were taken".to_owned())
}

#[async_trait::async_trait]
impl LeaseStore for RedisStore {
    async fn acquire<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        // An index answers in a bounded number of steps whatever the fleet.
        let names = match &req.scope {
            Scope::Listed => None,
            Scope::Installation => Some(&[][..]),
            Scope::Indexed(names) => Some(&names[..]),
        };
        if let Some(names) = names
            && let Some(answer) = self.acquire_indexed(req, names).await?
        {
            return Ok(answer);
        }
        // The first batch holds the best idle proxy on any fleet with free ones; only without
        // one does Redis get every candidate, in one run, so the choice stays atomic. The rest
        // of the fleet is read only then, so the usual acquire costs the same on any fleet.
        let mut all: Vec<Candidate<'c>> = (&mut *candidates).take(BATCH).collect();
        let next = candidates.next();
        let answer = match self.acquire_listed(&all, next.is_none(), req).await? {
            Some(answer) => answer,
            None => {
                all.extend(next);
                all.extend(candidates);
                self.acquire_listed(&all, true, req)
                    .await?
                    .ok_or_else(|| StoreError("the final acquire run asked for more".to_owned()))?
            }
        };
        Ok(answer)
    }

    async fn acquire_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Result<Grant, SessionRefused>, StoreError> {
        self.in_session(candidates, member, req, session).await
    }

    async fn renew(
        &self,
        lease_id: &str,
        ttl: Duration,
        fit: &Fit<'_>,
    ) -> Result<Result<Grant, NotRenewed>, StoreError> {
        self.renew_lease(lease_id, ttl, fit).await
    }

    fn sessions_now(&self) -> Vec<(String, usize)> {
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.iter().map(|(client, n)| (client.clone(), *n)).collect()
    }

    async fn release(&self, lease_id: &str) -> Result<(), StoreError> {
        let Reply::Release(total) = self.rounds.call(Request::Release(lease_id.to_owned())).await? else {
            return Err(mixed_up());
        };
        self.remember_total(total);
        Ok(())
    }

    async fn report(
        &self,
        lease_id: &str,
        result: ReportResult,
        target: Option<Target>,
    ) -> Result<Result<(), UnknownLease>, StoreError> {
        let kind = if result == ReportResult::Ok { "ok" } else { "cool" };
        let known: i64 = self
            .run(
                Op::Report,
                &[
                    self.calls.now(),
                    lease_id.to_owned(),
                    kind.to_owned(),
                    target.as_ref().map(Target::hex).unwrap_or_default(),
                    duration_millis(self.calls.cooldown).to_string(),
                    MAX_COOLDOWN_TARGETS.to_string(),
                ],
            )
            .await?;
        if known == 2 {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(if known == 0 { Err(UnknownLease) } else { Ok(()) })
    }

    fn cooldowns_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    async fn active_leases(&self, proxies: &[&str]) -> Result<Vec<usize>, StoreError> {
        let mut args = vec![self.calls.now()];
        args.extend(proxies.iter().map(|p| (*p).to_owned()));
        let mut counts: Vec<i64> = self.run(Op::Active, &args).await?;
        if let Some(total) = counts.pop() {
            self.remember_total(total);
        }
        Ok(counts.into_iter().map(|n| usize::try_from(n).unwrap_or(0)).collect())
    }

    async fn active_total(&self) -> Result<usize, StoreError> {
        let counts: Vec<i64> = self.run(Op::Active, &[self.calls.now()]).await?;
        let total = counts.last().copied().unwrap_or(0);
        self.remember_total(total);
        Ok(usize::try_from(total).unwrap_or(0))
    }

    fn active_total_now(&self) -> usize {
        self.last_total.load(Ordering::Relaxed)
    }

    async fn sweep(&self) -> Result<(), StoreError> {
        let [max_ended, retention] = self.calls.ended_args();
        let answer: Vec<redis::Value> = self.run(Op::Sweep, &[self.calls.now(), max_ended, retention]).await?;
        self.remember_total(int(answer.first())?);
        let mut sessions = std::collections::BTreeMap::new();
        for pair in answer.get(1..).unwrap_or_default().chunks(2) {
            sessions.insert(text(pair.first())?, count(pair.get(1))?);
        }
        *self.sessions.lock().unwrap_or_else(PoisonError::into_inner) = sessions;
        Ok(())
    }

    async fn publish_view(&self, view: &[ViewEntry]) -> Result<(), StoreError> {
        self.publish(view).await
    }
}

/// The hash tag of `prefix`'s keys, `{<prefix>}`.
fn tag(prefix: &str) -> Result<String, String> {
    if prefix.contains(['{', '}']) {
        return Err(format!("lease store key prefix {prefix:?}: braces are not allowed"));
    }
    Ok(format!("{{{prefix}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_with_a_brace_or_a_cluster_url_without_nodes_is_refused_at_once() {
        for (url, prefix, why) in [
            ("redis://h:1", "a{b}:", "braces"),
            ("redis+cluster://,", "p:", "no cluster node"),
        ] {
            let e = RedisStore::new(url, prefix, Duration::from_secs(1)).expect_err(why);
            assert!(e.contains(why), "{e}");
        }
    }

    #[tokio::test]
    async fn a_prefix_given_later_is_checked_alike() {
        // Contacts nothing: the connection is made on the first call.
        let store = RedisStore::new("redis://h:1", DEFAULT_PREFIX, Duration::from_secs(1)).unwrap();
        let Err(e) = store.with_prefix("a{b}:") else {
            panic!("a prefix with braces was taken");
        };
        assert!(e.contains("braces"), "{e}");
    }

    #[test]
    fn a_url_that_is_not_redis_is_refused_at_once() {
        let e = RedisStore::new("http://x", DEFAULT_PREFIX, Duration::from_secs(1)).expect_err("not redis");
        assert!(e.contains("http://x"), "{e}");
    }
}
