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
//! | `view` | hash | `healthy,latency,max,offered` by proxy id, as published | [`VIEW_LIFETIME`] after the last publication |
//! | `count` | hash | the view's offered and unhealthy proxies, and its publication's token | as the view |
//! | `free` | sorted set | the index: the view's offered, healthy proxies with room, by (active leases, latency, id) | as the view |
//!
//! An acquire scoped to the installation ([`Scope::Installation`], an empty selector) is
//! answered from `free`: its head, passing over at most [`INDEX_LOOK`] proxies that cool down
//! for the request. Every script that grants or ends a lease, and every publication, moves the
//! proxies it touches in `free`, so an acquire, a release, a report and the expiry of a lease
//! each do a bounded amount of work whatever the fleet's size. Other selectors send their
//! candidates (at most [`BATCH`] at first, every one when those are busy).
//!
//! The scripts need Redis 7.0 or later (Functions, `PEXPIRE` with `GT`/`NX`, `LPOP` with a count).
//!
//! When Redis cannot be reached every call fails with [`StoreError`] within
//! [`CALL_BUDGET`] (the API answers 503) and nothing is granted; the connection is made again
//! by itself at the next call once Redis is back.

mod connection;
mod functions;
#[cfg(feature = "testing")]
pub mod local;
mod publish;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use egress_lease::{
    Candidate, Clock, Grant, LeaseRequest, LeaseStore, MAX_COOLDOWN_TARGETS, MAX_ENDED, NoMatch, ReportResult, Scope,
    StoreError, Target, UnknownLease, ViewEntry, lease_id,
};
use redis::Value;

pub use crate::connection::shown_url;
use crate::connection::{Connection, split_wait};
use crate::functions::{Library, Op};
pub use crate::publish::PUBLISH_CHUNK;
use crate::publish::Published;

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

/// The lease store on one Redis server, or on a Redis Cluster: every key of one store lives in
/// one slot.
pub struct RedisStore {
    connection: Connection,
    /// The scripts, as Redis Functions.
    library: Arc<Library>,
    /// `{<prefix>}`: every key starts with it, and the braces make it the key's hash tag, so
    /// that on a Redis Cluster all of them live in one slot and every script runs on one node.
    tag: String,
    /// The tests' clock; `None` in production: the scripts read Redis's own clock, so every
    /// replica agrees on the time whatever its own says.
    clock: Option<Arc<dyn Clock>>,
    cooldown: Duration,
    /// All active leases as of this replica's last call (the scrape-time gauge).
    last_total: AtomicUsize,
    /// Ended leases kept reportable, at most.
    max_ended: usize,
    /// Cooldowns this replica's reports dropped for [`MAX_COOLDOWN_TARGETS`].
    dropped: AtomicU64,
    /// Where Redis is, without credentials (for messages).
    shown: String,
    /// This replica's last publication of the view, while it is known to be the one in Redis.
    published: tokio::sync::Mutex<Option<Published>>,
    /// Replicas that must have a grant before it is answered (the URL's `wait`); 0: none.
    wait_replicas: usize,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("redis", &self.shown)
            .field("keys", &self.tag)
            .field("cooldown", &self.cooldown)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on the Redis at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `redis+cluster://[user:password@]host:port[,host:port…]` for a Redis Cluster), keys under
    /// `{<prefix>}`, with the cooldown window (and lease retention after expiry) `cooldown`,
    /// on Redis's clock. Connects lazily: a Redis that is down at start only makes calls fail
    /// until it is up. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The URL is not a Redis URL, or the prefix holds a brace (it would break the hash tag).
    pub fn new(url: &str, prefix: &str, cooldown: Duration) -> Result<Self, String> {
        let shown = shown_url(url);
        if prefix.contains(['{', '}']) {
            return Err(format!("lease store key prefix {prefix:?}: braces are not allowed"));
        }
        let (url, wait_replicas) = split_wait(url).map_err(|e| format!("lease store {shown}: {e}"))?;
        let connection = Connection::open(&url).map_err(|e| format!("lease store {shown}: {e}"))?;
        Ok(Self {
            connection,
            library: Arc::new(Library::new()),
            tag: format!("{{{prefix}}}"),
            clock: None,
            cooldown,
            last_total: AtomicUsize::new(0),
            max_ended: MAX_ENDED,
            dropped: AtomicU64::new(0),
            shown,
            published: tokio::sync::Mutex::new(None),
            wait_replicas,
        })
    }

    /// Each operation's name (`acquire`, `acquire_indexed`, `release`, `report`, `active`,
    /// `sweep`, `publish`) and its function's (what `FCALL` and Redis's slow log name it by),
    /// for benches and diagnostics that attribute Redis's time to the operations.
    pub fn function_names(&self) -> Vec<(&'static str, String)> {
        Op::ALL
            .iter()
            .map(|op| (op.name(), self.library.function(*op)))
            .collect()
    }

    /// The same store keeping at most `max_ended` ended leases reportable (tests of the bound).
    #[must_use]
    pub fn with_max_ended(mut self, max_ended: usize) -> Self {
        self.max_ended = max_ended;
        self
    }

    /// The arguments every script that ends leases takes: the cap and the retention.
    fn ended_args(&self) -> [String; 2] {
        [self.max_ended.to_string(), duration_millis(self.cooldown).to_string()]
    }

    /// The same store on `clock` instead of Redis's (tests that move time by hand).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The time the scripts get: the clock's in ms, or "" for Redis's own.
    fn now(&self) -> String {
        self.clock
            .as_ref()
            .map(|c| millis(c.now()).to_string())
            .unwrap_or_default()
    }

    /// Runs the operation's function on the store's keys with `args` within [`CALL_BUDGET`].
    async fn run<T: redis::FromRedisValue>(&self, op: Op, args: &[String]) -> Result<T, StoreError> {
        let call = self.library.call(op, &self.tag, args);
        let call = &call;
        let answer = self
            .library
            .send(
                &self.connection,
                |mut live| async move { call.query_async(&mut live).await },
            )
            .await;
        self.answered(answer)
    }

    /// A call's answer, or the [`StoreError`] that says why there is none.
    fn answered<T>(&self, answer: Option<redis::RedisResult<T>>) -> Result<T, StoreError> {
        match answer {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(StoreError(format!("redis {}: {e}", self.shown))),
            None => Err(StoreError(format!(
                "redis {}: no answer within {}s",
                self.shown,
                CALL_BUDGET.as_secs()
            ))),
        }
    }

    /// Runs an acquire function and, right behind it in one pipeline on the same connection,
    /// `WAIT` for the URL's replicas (at most [`WAIT_BUDGET`]): the function's answer and how
    /// many replicas have its writes. One pipeline, because `WAIT` counts only the writes sent on
    /// its own connection: sent separately, it could go on a connection made again in between,
    /// which has written nothing, and answer at once for a grant no replica has.
    async fn run_waiting(&self, op: Op, args: &[String]) -> Result<(Vec<Value>, i64), StoreError> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.wait_replicas)
            .arg(u64::try_from(WAIT_BUDGET.as_millis()).unwrap_or(u64::MAX));
        let mut pipe = redis::pipe();
        pipe.add_command(self.library.call(op, &self.tag, args))
            .add_command(wait);
        let pipe = &pipe;
        let answer = self
            .library
            .send(
                &self.connection,
                |mut live| async move { pipe.query_async(&mut live).await },
            )
            .await;
        self.answered(answer)
    }

    /// One run of the acquire script over `batch`; `None` when the batch had no idle eligible
    /// proxy and was not `last` (the caller then sends every candidate).
    async fn acquire_listed(
        &self,
        batch: &[Candidate<'_>],
        last: bool,
        req: &LeaseRequest,
    ) -> Result<Option<Result<Grant, NoMatch>>, StoreError> {
        let mut args = vec![
            self.now(),
            duration_millis(req.ttl).to_string(),
            req.target.as_ref().map(Target::hex).unwrap_or_default(),
            String::new(),
            duration_millis(self.cooldown).to_string(),
            batch.len().to_string(),
            if last { "1" } else { "0" }.to_owned(),
            self.max_ended.to_string(),
        ];
        for c in batch {
            args.push(c.id.to_owned());
            args.push(if c.healthy { "1" } else { "0" }.to_owned());
            args.push(c.latency_millis.to_string());
            args.push(c.max_leases.to_string());
        }
        self.acquire_with(Op::Acquire, args, req).await
    }

    /// Acquires from the installation's index; `None` when there is none (no view published)
    /// or the cooldowns at its head hide more than [`INDEX_LOOK`] proxies (the caller then
    /// sends its candidates).
    async fn acquire_indexed(&self, req: &LeaseRequest) -> Result<Option<Result<Grant, NoMatch>>, StoreError> {
        let args = vec![
            self.now(),
            duration_millis(req.ttl).to_string(),
            req.target.as_ref().map(Target::hex).unwrap_or_default(),
            String::new(),
            duration_millis(self.cooldown).to_string(),
            self.max_ended.to_string(),
            INDEX_LOOK.to_string(),
        ];
        self.acquire_with(Op::AcquireIndexed, args, req).await
    }

    /// Runs an acquire script whose fourth argument is the lease id, until it answers: with a
    /// new id when the last was taken (three tries), again while expired leases remain to be
    /// moved (each indexed run moves a thousand). `None`: the script asks for the candidates,
    /// or [`EXPIRY_RUNS`] runs did not move every expired lease (a mass expiry the sweep has not
    /// caught up with; the candidates' own expired leases are then moved as they are looked at).
    async fn acquire_with(
        &self,
        op: Op,
        mut args: Vec<String>,
        req: &LeaseRequest,
    ) -> Result<Option<Result<Grant, NoMatch>>, StoreError> {
        let (mut taken, mut expiry_runs) = (0, 0);
        loop {
            args[3] = lease_id();
            let ran = if self.wait_replicas == 0 {
                self.run(op, &args).await.map(|a| (a, 0))
            } else {
                self.run_waiting(op, &args).await
            };
            let (answer, replicated): (Vec<Value>, i64) = match ran {
                Ok(a) => a,
                Err(e) => {
                    // The script may have run and granted with its answer lost: that lease is
                    // given back, so a retried request does not find the slot taken.
                    self.release_later(args[3].clone());
                    return Err(e);
                }
            };
            match int(answer.first())? {
                0 => {
                    return Ok(Some(Err(NoMatch {
                        considered: count(answer.get(1))?,
                        at_capacity: count(answer.get(2))?,
                        in_cooldown: count(answer.get(3))?,
                        unhealthy: count(answer.get(4))?,
                    })));
                }
                1 => {
                    let expires = u64::try_from(int(answer.get(3))?).unwrap_or(0);
                    self.remember_total(int(answer.get(4))?);
                    self.replicated(&args[3], replicated)?;
                    return Ok(Some(Ok(Grant {
                        lease_id: args[3].clone(),
                        proxy_id: text(answer.get(1))?,
                        expires_at: UNIX_EPOCH + Duration::from_millis(expires),
                        ttl: req.ttl,
                        active_leases: count(answer.get(2))?,
                    })));
                }
                // 128 random bits do not collide in practice: a taken id is most likely this
                // call's own, granted by a run the client library sent again after losing its
                // answer. That lease is given back before another id is tried.
                2 if taken < 2 => {
                    self.release_later(args[3].clone());
                    taken += 1;
                }
                2 => return Err(StoreError("three lease ids in a row were taken".to_owned())),
                3 => return Ok(None),
                4 if expiry_runs + 1 < EXPIRY_RUNS => expiry_runs += 1,
                4 => return Ok(None),
                other => return Err(StoreError(format!("the acquire script answered {other}"))),
            }
        }
    }

    /// With `wait`, whether that many replicas had the grant of `lease_id` (`replicated` of
    /// them, by the `WAIT` behind it): a failover then cannot lose it and grant its slot again.
    /// A grant not replicated in time is given back and the acquire fails (the API answers 503).
    fn replicated(&self, lease_id: &str, replicated: i64) -> Result<(), StoreError> {
        if self.wait_replicas == 0 || usize::try_from(replicated).is_ok_and(|n| n >= self.wait_replicas) {
            return Ok(());
        }
        self.release_later(lease_id.to_owned());
        Err(StoreError(format!(
            "redis {}: a grant reached {replicated} of {} replicas within {} ms; given back",
            self.shown,
            self.wait_replicas,
            WAIT_BUDGET.as_millis()
        )))
    }

    /// Releases `lease_id` in the background, trying for about a minute: the lease an acquire
    /// may have granted without its answer arriving.
    fn release_later(&self, lease_id: String) {
        let (connection, library) = (self.connection.clone(), self.library.clone());
        let [max_ended, retention] = self.ended_args();
        let call = self
            .library
            .call(Op::Release, &self.tag, &[self.now(), lease_id, max_ended, retention]);
        let shown = self.shown.clone();
        tokio::spawn(async move {
            let call = &call;
            for attempt in 0..8u32 {
                let done = library
                    .send(&connection, |mut live| async move {
                        call.query_async::<i64>(&mut live).await
                    })
                    .await;
                if matches!(done, Some(Ok(_))) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500) * 2u32.pow(attempt.min(4))).await;
            }
            tracing::info!(redis = %shown, "a lease whose grant was not answered could not be given back; it ends at its expiry");
        });
    }

    fn remember_total(&self, total: i64) {
        self.last_total
            .store(usize::try_from(total).unwrap_or(0), Ordering::Relaxed);
    }
}

fn int(v: Option<&Value>) -> Result<i64, StoreError> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(StoreError(format!(
            "unexpected answer from the acquire script: {other:?}"
        ))),
    }
}

fn text(v: Option<&Value>) -> Result<String, StoreError> {
    match v {
        Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
        other => Err(StoreError(format!(
            "unexpected answer from the acquire script: {other:?}"
        ))),
    }
}

fn count(v: Option<&Value>) -> Result<usize, StoreError> {
    int(v).map(|n| usize::try_from(n).unwrap_or(0))
}

#[async_trait::async_trait]
impl LeaseStore for RedisStore {
    async fn acquire<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        // The installation's index answers in a bounded number of steps whatever the fleet.
        if req.scope == Scope::Installation
            && let Some(answer) = self.acquire_indexed(req).await?
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

    async fn release(&self, lease_id: &str) -> Result<(), StoreError> {
        let [max_ended, retention] = self.ended_args();
        let total: i64 = self
            .run(Op::Release, &[self.now(), lease_id.to_owned(), max_ended, retention])
            .await?;
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
                    self.now(),
                    lease_id.to_owned(),
                    kind.to_owned(),
                    target.as_ref().map(Target::hex).unwrap_or_default(),
                    duration_millis(self.cooldown).to_string(),
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
        let mut args = vec![self.now()];
        args.extend(proxies.iter().map(|p| (*p).to_owned()));
        let mut counts: Vec<i64> = self.run(Op::Active, &args).await?;
        if let Some(total) = counts.pop() {
            self.remember_total(total);
        }
        Ok(counts.into_iter().map(|n| usize::try_from(n).unwrap_or(0)).collect())
    }

    async fn active_total(&self) -> Result<usize, StoreError> {
        let counts: Vec<i64> = self.run(Op::Active, &[self.now()]).await?;
        let total = counts.last().copied().unwrap_or(0);
        self.remember_total(total);
        Ok(usize::try_from(total).unwrap_or(0))
    }

    fn active_total_now(&self) -> usize {
        self.last_total.load(Ordering::Relaxed)
    }

    async fn sweep(&self) -> Result<(), StoreError> {
        let [max_ended, retention] = self.ended_args();
        let total: i64 = self.run(Op::Sweep, &[self.now(), max_ended, retention]).await?;
        self.remember_total(total);
        Ok(())
    }

    async fn publish_view(&self, view: &[ViewEntry]) -> Result<(), StoreError> {
        self.publish(view).await
    }
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

    #[test]
    fn a_url_that_is_not_redis_is_refused_at_once() {
        let e = RedisStore::new("http://x", DEFAULT_PREFIX, Duration::from_secs(1)).expect_err("not redis");
        assert!(e.contains("http://x"), "{e}");
    }
}
