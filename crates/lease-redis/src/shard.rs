//! One shard of the lease state on Redis: every key under one hash tag, so each script runs
//! on one node. Each shard keeps its own publication of the view (`publish.rs`); its indexed
//! acquires and releases go in the rounds every shard of the store shares (`gather.rs`).
//! [`crate::RedisStore`] routes each call to its shard.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use egress_lease::{
    Candidate, Grant, LeaseRequest, MAX_COOLDOWN_TARGETS, NoMatch, ReportResult, StoreError, Target, UnknownLease,
};

use crate::calls::{Answer, Calls, Indexed, Reply, Request, Rounds, count, expiry, int, parse, text};
use crate::duration_millis;
use crate::functions::Op;
use crate::gather::Gather;
use crate::placement::{ShardId, lease_id_in};
use crate::publish::Published;

/// The store on one shard.
pub(crate) struct Shard {
    pub(crate) id: ShardId,
    pub(crate) calls: Arc<Calls>,
    /// The store's rounds, which carry the shard's indexed acquires and releases.
    rounds: Arc<Gather<Rounds>>,
    /// The shard's active leases as of this replica's last call.
    last_total: AtomicUsize,
    /// Cooldowns this replica's reports dropped for [`MAX_COOLDOWN_TARGETS`].
    dropped: AtomicU64,
    /// Live sessions in the shard by client, as of this replica's last session call or sweep.
    pub(crate) sessions: Mutex<BTreeMap<String, usize>>,
    /// This replica's last publication of the shard's view, while it is known to be the one
    /// in Redis.
    pub(crate) published: tokio::sync::Mutex<Option<Published>>,
}

impl Shard {
    pub(crate) fn new(id: ShardId, calls: Calls, rounds: Arc<Gather<Rounds>>) -> Self {
        Self {
            id,
            rounds,
            calls: Arc::new(calls),
            last_total: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            sessions: Mutex::default(),
            published: tokio::sync::Mutex::new(None),
        }
    }

    /// Runs the operation's function on the store's keys with `args` within [`CALL_BUDGET`].
    async fn run<T: redis::FromRedisValue>(&self, op: Op, args: &[String]) -> Result<T, StoreError> {
        self.calls.run(op, args).await
    }

    /// One run of the acquire script over `batch`; `None` when the batch had no idle eligible
    /// proxy and was not `last` (the caller then sends every candidate).
    pub(crate) async fn acquire_listed(
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
    pub(crate) async fn run_listed(
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
            args[3] = lease_id_in(self.id);
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
    /// one that does not know the index, cooldowns at its head hiding more than [`INDEX_LOOK`](crate::INDEX_LOOK)
    /// proxies, several indexes with no proxy in all): the caller then sends its candidates.
    pub(crate) async fn acquire_indexed(
        &self,
        req: &LeaseRequest,
        names: &[String],
    ) -> Result<Option<Result<Grant, NoMatch>>, StoreError> {
        let target = req.target.as_ref().map(Target::hex).unwrap_or_default();
        for _ in 0..3 {
            let request = Indexed {
                ttl: req.ttl,
                target: target.clone(),
                lease_id: lease_id_in(self.id),
                names: names.to_vec(),
            };
            match self.rounds.call(Request::Acquire(self.calls.clone(), request)).await? {
                Reply::Acquire(Answer::Taken { lease_id }, _) => self.calls.release_later(lease_id),
                Reply::Acquire(answer, _) => return Ok(self.answer(answer, req)),
                Reply::Release(_) => return Err(mixed_up()),
            }
        }
        Err(taken())
    }

    /// What an acquire answers for a script's answer other than [`Answer::Taken`]; `None` for
    /// [`Answer::Candidates`].
    pub(crate) fn answer(&self, answer: Answer, req: &LeaseRequest) -> Option<Result<Grant, NoMatch>> {
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

    pub(crate) fn remember_total(&self, total: i64) {
        self.last_total
            .store(usize::try_from(total).unwrap_or(0), Ordering::Relaxed);
    }

    pub(crate) fn total_now(&self) -> usize {
        self.last_total.load(Ordering::Relaxed)
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub(crate) async fn release(&self, lease_id: &str) -> Result<(), StoreError> {
        let request = Request::Release(self.calls.clone(), lease_id.to_owned());
        let Reply::Release(total) = self.rounds.call(request).await? else {
            return Err(mixed_up());
        };
        self.remember_total(total);
        Ok(())
    }

    pub(crate) async fn report(
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

    /// The active leases of each of `proxies` (ids of the shard's proxies), then of the shard.
    pub(crate) async fn active(&self, proxies: &[&str]) -> Result<(Vec<usize>, usize), StoreError> {
        let mut args = vec![self.calls.now()];
        args.extend(proxies.iter().map(|p| (*p).to_owned()));
        let mut counts: Vec<i64> = self.run(Op::Active, &args).await?;
        let total = counts.pop().unwrap_or(0);
        self.remember_total(total);
        let counts = counts.into_iter().map(|n| usize::try_from(n).unwrap_or(0)).collect();
        Ok((counts, usize::try_from(total).unwrap_or(0)))
    }

    /// Moves the shard's expired leases to its ended ones and counts its sessions by client.
    pub(crate) async fn sweep(&self) -> Result<(), StoreError> {
        let [max_ended, retention] = self.calls.ended_args();
        let answer: Vec<redis::Value> = self.run(Op::Sweep, &[self.calls.now(), max_ended, retention]).await?;
        self.remember_total(int(answer.first())?);
        let mut sessions = BTreeMap::new();
        for pair in answer.get(1..).unwrap_or_default().chunks(2) {
            sessions.insert(text(pair.first())?, count(pair.get(1))?);
        }
        *self.sessions.lock().unwrap_or_else(PoisonError::into_inner) = sessions;
        Ok(())
    }
}

/// A round answered a request with the other kind's answer: a fault of the round.
fn mixed_up() -> StoreError {
    StoreError("a round answered a request of another kind".to_owned())
}

/// Three lease ids in a row taken (see [`Answer::Taken`]): 112 random bits do not collide in
/// practice, so that is a fault.
fn taken() -> StoreError {
    StoreError("three lease ids in a row were taken".to_owned())
}
