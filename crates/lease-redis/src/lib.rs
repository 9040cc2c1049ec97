//! The lease store on Redis: every replica of the discovery API shares leases, capacity and
//! cooldowns, and a restart loses nothing that Redis kept.
//!
//! Each operation is one Lua script, so Redis runs it atomically: acquire decides capacity,
//! cooldowns and the selection order inside Redis, and two replicas can never both take a
//! proxy's last slot. The scripts use the caller's clock (the same injectable clock as the
//! in-memory store), so replicas should keep their clocks in sync (NTP).
//!
//! Keys, under a prefix (default [`DEFAULT_PREFIX`]), each with a TTL so nothing outlives its
//! use:
//!
//! | Key | Type | Holds | Lives |
//! |---|---|---|---|
//! | `lease:<id>` | hash | proxy, target, expires (ms) | until one cooldown window after its expiry |
//! | `active:<proxy>` | sorted set | the proxy's unreleased leases by expiry | until its last lease expires |
//! | `all` | sorted set | every unreleased lease by expiry | until the last lease expires |
//! | `cool:<proxy>` | hash | cooldown end (ms) by target (`""`: global) | one cooldown window after the last report |
//! | `view` | hash | `healthy,latency,max` by proxy id, as published | [`VIEW_LIFETIME`] after the last publication |
//!
//! When Redis cannot be reached every call fails with [`StoreError`] within
//! [`CALL_BUDGET`] (the API answers 503) and nothing is granted; the connection is made again
//! by itself at the next call once Redis is back.

pub mod local;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use egress_lease::{
    Candidate, Clock, Grant, LeaseRequest, LeaseStore, NoMatch, ReportResult, StoreError, UnknownLease, ViewEntry,
    lease_id,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

/// The key prefix unless told otherwise.
pub const DEFAULT_PREFIX: &str = "egress-proxy:";
/// The most one store call may take, connecting included.
pub const CALL_BUDGET: Duration = Duration::from_secs(3);
/// Candidates sent to Redis per acquire script run. The first idle eligible candidate ends the
/// search, so on a fleet with free proxies one batch is all it takes.
pub const BATCH: usize = 64;
/// How long a published view stays without being published again.
pub const VIEW_LIFETIME: Duration = Duration::from_secs(300);

/// Milliseconds since the epoch.
fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn duration_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

struct Scripts {
    acquire: Script,
    release: Script,
    report: Script,
    active: Script,
    sweep: Script,
    publish: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            acquire: Script::new(include_str!("lua/acquire.lua")),
            release: Script::new(include_str!("lua/release.lua")),
            report: Script::new(include_str!("lua/report.lua")),
            active: Script::new(include_str!("lua/active.lua")),
            sweep: Script::new(include_str!("lua/sweep.lua")),
            publish: Script::new(include_str!("lua/publish.lua")),
        }
    }
}

/// The lease store on one Redis server.
pub struct RedisStore {
    connection: ConnectionManager,
    scripts: Scripts,
    prefix: String,
    clock: Arc<dyn Clock>,
    cooldown: Duration,
    /// All active leases as of this replica's last call (the scrape-time gauge).
    last_total: AtomicUsize,
    /// Where Redis is, without credentials (for messages).
    shown: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("redis", &self.shown)
            .field("prefix", &self.prefix)
            .field("cooldown", &self.cooldown)
            .finish_non_exhaustive()
    }
}

/// `url` without a password.
pub fn shown_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://[credentials]@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl RedisStore {
    /// A store on the Redis at `url` (`redis://[user:password@]host:port[/db]`), keys under
    /// `prefix`, with the cooldown window (and lease retention after expiry) `cooldown`.
    /// Connects lazily: a Redis that is down at start only makes calls fail until it is up.
    ///
    /// # Errors
    /// The URL is not a Redis URL.
    pub fn new(url: &str, prefix: &str, clock: Arc<dyn Clock>, cooldown: Duration) -> Result<Self, String> {
        let shown = shown_url(url);
        let client = redis::Client::open(url).map_err(|e| format!("lease store {shown}: {e}"))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CALL_BUDGET))
            .set_response_timeout(Some(CALL_BUDGET))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let connection =
            ConnectionManager::new_lazy_with_config(client, config).map_err(|e| format!("lease store {shown}: {e}"))?;
        Ok(Self {
            connection,
            scripts: Scripts::new(),
            prefix: prefix.to_owned(),
            clock,
            cooldown,
            last_total: AtomicUsize::new(0),
            shown,
        })
    }

    fn now(&self) -> u64 {
        millis(self.clock.now())
    }

    /// Runs `script` with `args` (after the prefix) within [`CALL_BUDGET`].
    async fn run<T: redis::FromRedisValue>(&self, script: &Script, args: &[String]) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        invocation.arg(&self.prefix);
        for a in args {
            invocation.arg(a);
        }
        let mut connection = self.connection.clone();
        match tokio::time::timeout(CALL_BUDGET, invocation.invoke_async(&mut connection)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError(format!("redis {}: {e}", self.shown))),
            Err(_) => Err(StoreError(format!(
                "redis {}: no answer within {}s",
                self.shown,
                CALL_BUDGET.as_secs()
            ))),
        }
    }

    /// Runs the acquire script on one batch with a fresh lease id in `args[3]`, again with
    /// another id in the (theoretical) case the first is taken. Answers codes 0, 1 or 3.
    async fn acquire_batch(&self, args: &mut [String]) -> Result<Vec<Value>, StoreError> {
        // 128 random bits do not collide in practice; the script checks all the same.
        for _ in 0..3 {
            args[3] = lease_id();
            let answer: Vec<Value> = self.run(&self.scripts.acquire, args).await?;
            if int(answer.first())? != 2 {
                return Ok(answer);
            }
        }
        Err(StoreError("three lease ids in a row were taken".to_owned()))
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
        let now = self.now().to_string();
        let ttl = duration_millis(req.ttl).to_string();
        let target = req.target.clone().filter(|t| !t.is_empty()).unwrap_or_default();
        let retention = duration_millis(self.cooldown).to_string();
        let mut refused = NoMatch::default();
        // The best candidate of the batches so far when none was idle: checked again, atomically,
        // with the next batch.
        let mut carried: Option<Candidate<'c>> = None;
        let mut candidates = candidates.peekable();
        loop {
            let mut batch: Vec<(Candidate<'c>, bool)> = carried.take().map(|c| (c, false)).into_iter().collect();
            batch.extend(candidates.by_ref().take(BATCH).map(|c| (c, true)));
            let last = candidates.peek().is_none();
            let mut args = vec![
                now.clone(),
                ttl.clone(),
                target.clone(),
                String::new(),
                retention.clone(),
                batch.len().to_string(),
                if last { "1" } else { "0" }.to_owned(),
            ];
            for (c, counted) in &batch {
                args.push(c.id.to_owned());
                args.push(if c.healthy { "1" } else { "0" }.to_owned());
                args.push(c.latency_millis.to_string());
                args.push(c.max_leases.to_string());
                args.push(if *counted { "1" } else { "0" }.to_owned());
            }
            let answer = self.acquire_batch(&mut args).await?;
            let counts = |a: &[Value]| -> Result<NoMatch, StoreError> {
                Ok(NoMatch {
                    considered: count(a.get(1))?,
                    at_capacity: count(a.get(2))?,
                    in_cooldown: count(a.get(3))?,
                    unhealthy: count(a.get(4))?,
                })
            };
            match int(answer.first())? {
                0 => {
                    let n = counts(&answer)?;
                    refused.considered += n.considered;
                    refused.at_capacity += n.at_capacity;
                    refused.in_cooldown += n.in_cooldown;
                    refused.unhealthy += n.unhealthy;
                    return Ok(Err(refused));
                }
                3 => {
                    let n = counts(&answer)?;
                    refused.considered += n.considered;
                    refused.at_capacity += n.at_capacity;
                    refused.in_cooldown += n.in_cooldown;
                    refused.unhealthy += n.unhealthy;
                    let best = text(answer.get(5))?;
                    // Counted as considered here; the next batch only sorts it into a bucket if
                    // it is refused there.
                    carried = batch.into_iter().map(|(c, _)| c).find(|c| c.id == best);
                }
                _ => {
                    let proxy_id = text(answer.get(1))?;
                    let expires = u64::try_from(int(answer.get(3))?).unwrap_or(0);
                    self.remember_total(int(answer.get(4))?);
                    return Ok(Ok(Grant {
                        lease_id: args[3].clone(),
                        proxy_id,
                        expires_at: UNIX_EPOCH + Duration::from_millis(expires),
                        ttl: req.ttl,
                        active_leases: count(answer.get(2))?,
                    }));
                }
            }
        }
    }

    async fn release(&self, lease_id: &str) -> Result<(), StoreError> {
        let total: i64 = self
            .run(&self.scripts.release, &[self.now().to_string(), lease_id.to_owned()])
            .await?;
        self.remember_total(total);
        Ok(())
    }

    async fn report(
        &self,
        lease_id: &str,
        result: ReportResult,
        target: Option<&str>,
    ) -> Result<Result<(), UnknownLease>, StoreError> {
        let kind = if result == ReportResult::Ok { "ok" } else { "cool" };
        let known: i64 = self
            .run(
                &self.scripts.report,
                &[
                    self.now().to_string(),
                    lease_id.to_owned(),
                    kind.to_owned(),
                    target.unwrap_or_default().to_owned(),
                    duration_millis(self.cooldown).to_string(),
                ],
            )
            .await?;
        Ok(if known == 1 { Ok(()) } else { Err(UnknownLease) })
    }

    async fn active_leases(&self, proxies: &[&str]) -> Result<Vec<usize>, StoreError> {
        let mut args = vec![self.now().to_string()];
        args.extend(proxies.iter().map(|p| (*p).to_owned()));
        let mut counts: Vec<i64> = self.run(&self.scripts.active, &args).await?;
        if let Some(total) = counts.pop() {
            self.remember_total(total);
        }
        Ok(counts.into_iter().map(|n| usize::try_from(n).unwrap_or(0)).collect())
    }

    async fn active_total(&self) -> Result<usize, StoreError> {
        let counts: Vec<i64> = self.run(&self.scripts.active, &[self.now().to_string()]).await?;
        let total = counts.last().copied().unwrap_or(0);
        self.remember_total(total);
        Ok(usize::try_from(total).unwrap_or(0))
    }

    fn active_total_now(&self) -> usize {
        self.last_total.load(Ordering::Relaxed)
    }

    async fn sweep(&self) -> Result<(), StoreError> {
        let total: i64 = self.run(&self.scripts.sweep, &[self.now().to_string()]).await?;
        self.remember_total(total);
        Ok(())
    }

    async fn publish_view(&self, view: &[ViewEntry]) -> Result<(), StoreError> {
        let mut args = vec![duration_millis(VIEW_LIFETIME).to_string()];
        for e in view {
            args.push(e.id.clone());
            args.push(format!("{},{},{}", u8::from(e.healthy), e.latency_millis, e.max_leases));
        }
        let _: i64 = self.run(&self.scripts.publish, &args).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            shown_url("redis://:s3cret@10.0.0.1:6379/0"),
            "redis://[credentials]@10.0.0.1:6379/0"
        );
        assert_eq!(shown_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn a_url_that_is_not_redis_is_refused_at_once() {
        let e = RedisStore::new(
            "http://x",
            DEFAULT_PREFIX,
            Arc::new(egress_lease::SystemClock),
            Duration::from_secs(1),
        )
        .expect_err("not redis");
        assert!(e.contains("http://x"), "{e}");
    }
}
