//! The store's calls to Redis: a function of the library run on the store's keys within its
//! budget, with `WAIT` behind a grant when the URL asks for it; a lease given back in the
//! background; and the installation's acquires and all releases sent together in rounds
//! (`gather.rs`, `lua/acquire_indexed.lua`, `lua/release.lua`).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use egress_lease::{Clock, NoMatch, StoreError};
use redis::Value;

use crate::connection::Current;
use crate::functions::{Library, Op};
use crate::gather::Batches;
use crate::{CALL_BUDGET, EXPIRY_RUNS, INDEX_LOOK, WAIT_BUDGET, duration_millis, millis};

/// What every call of one store shares: where Redis is and which keys are the store's.
#[derive(Clone)]
pub(crate) struct Calls {
    pub(crate) connection: Arc<Current>,
    /// The scripts, as Redis Functions.
    pub(crate) library: Arc<Library>,
    /// `{<prefix>}`: every key starts with it, and the braces make it the key's hash tag, so
    /// that on a Redis Cluster all of them live in one slot and every script runs on one node.
    pub(crate) tag: String,
    /// The tests' clock; `None` in production: the scripts read Redis's own clock, so every
    /// replica agrees on the time whatever its own says.
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) cooldown: Duration,
    /// Ended leases kept reportable, at most.
    pub(crate) max_ended: usize,
    /// Where Redis is, without credentials (for messages).
    pub(crate) shown: String,
    /// Replicas that must have a grant before it is answered (the URL's `wait`); 0: none.
    pub(crate) wait_replicas: usize,
}

/// An acquire from an index of the view, as one request of a batch.
pub(crate) struct Indexed {
    pub(crate) ttl: Duration,
    /// The target's digest; empty for none.
    pub(crate) target: String,
    pub(crate) lease_id: String,
    /// The indexes whose proxies it chooses among (`key=value`); none: the installation's.
    pub(crate) names: Vec<String>,
}

/// What an acquire script answered one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Granted {
        lease_id: String,
        proxy: String,
        /// The proxy's active leases with this one.
        active: usize,
        /// Milliseconds since the epoch.
        expires: u64,
        /// All active leases.
        total: i64,
        /// In a session: the client's live sessions, this one included.
        sessions: Option<usize>,
    },
    NoMatch(NoMatch),
    /// The lease id is taken: most likely by this very request, granted by a run the client
    /// library sent again after losing its answer. That lease is given back, and the caller
    /// asks again with another id.
    Taken {
        lease_id: String,
    },
    /// The index cannot answer: send the candidates.
    Candidates,
    /// In a session: it has a lease again since it was read (another replica's); read it again.
    SessionChanged,
    /// In a session: the client holds `held` live sessions, its cap.
    TooManySessions {
        held: usize,
    },
}

impl Calls {
    /// The arguments every script that ends leases takes: the cap and the retention.
    pub(crate) fn ended_args(&self) -> [String; 2] {
        [self.max_ended.to_string(), duration_millis(self.cooldown).to_string()]
    }

    /// The time the scripts get: the clock's in ms, or "" for Redis's own.
    pub(crate) fn now(&self) -> String {
        self.clock
            .as_ref()
            .map(|c| millis(c.now()).to_string())
            .unwrap_or_default()
    }

    /// Runs the operation's function on the store's keys with `args` within [`CALL_BUDGET`].
    pub(crate) async fn run<T: redis::FromRedisValue>(&self, op: Op, args: &[String]) -> Result<T, StoreError> {
        let call = self.library.call(op, &self.tag, args);
        let call = &call;
        let answer = self
            .library
            .send(&self.connection.get(), |mut live| async move {
                call.query_async(&mut live).await
            })
            .await;
        self.answered(answer)
    }

    /// Sends a plain command (no function) within [`CALL_BUDGET`].
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let answer = self
            .connection
            .get()
            .within(
                CALL_BUDGET,
                |mut live| async move { cmd.query_async::<T>(&mut live).await },
            )
            .await;
        self.answered(answer)
    }

    /// Sends a pipeline of plain commands within [`CALL_BUDGET`].
    pub(crate) async fn query_pipe<T: redis::FromRedisValue>(&self, pipe: &redis::Pipeline) -> Result<T, StoreError> {
        let answer = self
            .connection
            .get()
            .within(
                CALL_BUDGET,
                |mut live| async move { pipe.query_async::<T>(&mut live).await },
            )
            .await;
        self.answered(answer)
    }

    /// A call's answer, or the [`StoreError`] that says why there is none.
    pub(crate) fn answered<T>(&self, answer: Option<redis::RedisResult<T>>) -> Result<T, StoreError> {
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

    /// Runs an acquire function and, with the URL's `wait`, `WAIT` for that many replicas (at
    /// most [`WAIT_BUDGET`]) right behind it in one pipeline on the same connection: the
    /// function's answer and how many replicas have its writes (0 without `wait`). One
    /// pipeline, because `WAIT` counts only the writes sent on its own connection: sent
    /// separately, it could go on a connection made again in between, which has written
    /// nothing, and answer at once for a grant no replica has.
    pub(crate) async fn run_acquire(&self, op: Op, args: &[String]) -> Result<(Vec<Value>, i64), StoreError> {
        if self.wait_replicas == 0 {
            return self.run(op, args).await.map(|answer| (answer, 0));
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.wait_replicas)
            .arg(u64::try_from(WAIT_BUDGET.as_millis()).unwrap_or(u64::MAX));
        let mut pipe = redis::pipe();
        pipe.add_command(self.library.call(op, &self.tag, args))
            .add_command(wait);
        let pipe = &pipe;
        let answer = self
            .library
            .send(&self.connection.get(), |mut live| async move {
                pipe.query_async(&mut live).await
            })
            .await;
        self.answered(answer)
    }

    /// With `wait`, whether that many replicas had the grants of a call (`replicated` of them,
    /// by the `WAIT` behind it): a failover then cannot lose them and grant their slots again.
    pub(crate) fn replicated(&self, replicated: i64) -> Result<(), StoreError> {
        if self.wait_replicas == 0 || usize::try_from(replicated).is_ok_and(|n| n >= self.wait_replicas) {
            return Ok(());
        }
        Err(StoreError(format!(
            "redis {}: a grant reached {replicated} of {} replicas within {} ms; given back",
            self.shown,
            self.wait_replicas,
            WAIT_BUDGET.as_millis()
        )))
    }

    /// Releases `lease_id` in the background, trying for about a minute: the lease an acquire
    /// may have granted without its answer arriving, or granted to a caller that left.
    pub(crate) fn release_later(&self, lease_id: String) {
        let (connection, library) = (self.connection.clone(), self.library.clone());
        // Each try on the connection in use then: TLS files may change within the minute.
        let [max_ended, retention] = self.ended_args();
        let call = self
            .library
            .call(Op::Release, &self.tag, &[self.now(), max_ended, retention, lease_id]);
        let shown = self.shown.clone();
        tokio::spawn(async move {
            let call = &call;
            for attempt in 0..8u32 {
                let done = library
                    .send(&connection.get(), |mut live| async move {
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

    /// One run of the indexed acquire over `batch`; [`Answer::Candidates`] for each when
    /// [`EXPIRY_RUNS`] runs did not move every expired lease (a mass expiry the sweep has not
    /// caught up with; the candidates' own expired leases are then moved as they are looked
    /// at).
    async fn acquire_indexed(&self, batch: &[&Indexed]) -> Result<Vec<Result<Answer, StoreError>>, StoreError> {
        let [max_ended, retention] = self.ended_args();
        let mut args = vec![String::new(), retention, max_ended, INDEX_LOOK.to_string()];
        for r in batch {
            args.push(duration_millis(r.ttl).to_string());
            args.push(r.target.clone());
            args.push(r.lease_id.clone());
            args.push(r.names.len().to_string());
            args.extend(r.names.iter().cloned());
        }
        for _ in 0..EXPIRY_RUNS {
            args[0] = self.now();
            let (answer, replicated) = self.run_acquire(Op::AcquireIndexed, &args).await?;
            // More expired leases to move first; nothing was granted.
            if matches!(answer.first(), Some(Value::Int(-1))) {
                continue;
            }
            let total = int(answer.first())?;
            if answer.len() != batch.len() + 1 {
                return Err(unexpected(&answer));
            }
            let replication = self.replicated(replicated);
            return Ok(batch
                .iter()
                .zip(&answer[1..])
                .map(|(r, a)| {
                    let Value::Array(a) = a else {
                        return Err(unexpected(a));
                    };
                    let answer = parse(a, &r.lease_id, total)?;
                    match (&answer, &replication) {
                        // Not replicated in time: given back, and the acquire fails (503).
                        (Answer::Granted { .. }, Err(e)) => Err(e.clone()),
                        _ => Ok(answer),
                    }
                })
                .collect());
        }
        Ok(batch.iter().map(|_| Ok(Answer::Candidates)).collect())
    }
}

/// Requests one script carries, at most: a script keeps Redis from every other client while it
/// runs (about 25 µs an acquire on the bench machine, under a millisecond for a full call;
/// several when each request passes over many cooling proxies).
pub(crate) const MAX_PER_CALL: usize = 32;

/// A request of a round: an acquire from an index, or a release, each with the calls of its
/// shard.
pub(crate) enum Request {
    Acquire(Arc<Calls>, Indexed),
    Release(Arc<Calls>, String),
}

/// What a round answered one request: the acquire script's answer (with its shard's calls, to
/// give a grant back whose caller left), or the shard's active leases after a release.
pub(crate) enum Reply {
    Acquire(Answer, Arc<Calls>),
    Release(i64),
}

/// The indexed acquires and all releases of every shard, sent in rounds (`gather.rs`): the
/// releases of a round go first (what they free is then there for its acquires), at most
/// [`MAX_PER_CALL`] of a kind in one call, one call or more per shard.
///
/// Why together: with `appendfsync always`, Redis syncs its append-only file once per turn of
/// its loop, before it answers what that turn ran, and a sync costs as much as a whole call's
/// scripts on a virtual disk. The calls of a round, of every shard, are handed to the
/// connection at once, so the client library writes them in one go and Redis runs them in one
/// turn, with one sync (on a cluster, one per master the round reaches); sent as separate
/// batches, acquires and releases arrived apart and paid a sync each, and a round per shard
/// paid one per shard.
pub(crate) struct Rounds;

/// One call of the indexed acquire over `batch` (with where each answer goes), and what it
/// granted given back where the grant cannot be answered.
async fn acquire_call(calls: &Arc<Calls>, batch: &[(usize, Indexed)]) -> Vec<(usize, Result<Reply, StoreError>)> {
    let requests: Vec<&Indexed> = batch.iter().map(|(_, r)| r).collect();
    let answers = match calls.acquire_indexed(&requests).await {
        Ok(answers) => {
            for (r, a) in requests.iter().zip(&answers) {
                // Granted but not answered as such (no replica had it in time, or the
                // answer did not parse): given back.
                if a.is_err() {
                    calls.release_later(r.lease_id.clone());
                }
            }
            answers
        }
        Err(e) => {
            // The script may have run and granted with its answer lost: those leases are
            // given back, so retried requests do not find the slots taken.
            for r in &requests {
                calls.release_later(r.lease_id.clone());
            }
            requests.iter().map(|_| Err(e.clone())).collect()
        }
    };
    batch
        .iter()
        .zip(answers)
        .map(|((i, _), a)| (*i, a.map(|a| Reply::Acquire(a, calls.clone()))))
        .collect()
}

/// One call of `lua/release.lua` over `batch`'s lease ids: each answered with the shard's
/// active leases.
async fn release_call(calls: &Calls, batch: &[(usize, String)]) -> Vec<(usize, Result<Reply, StoreError>)> {
    let [max_ended, retention] = calls.ended_args();
    let mut args = vec![calls.now(), max_ended, retention];
    args.extend(batch.iter().map(|(_, id)| id.clone()));
    let total = calls.run::<i64>(Op::Release, &args).await;
    batch
        .iter()
        .map(|(i, _)| (*i, total.clone().map(Reply::Release)))
        .collect()
}

/// A round's requests of one kind by shard (its tag), each with its place in the round.
type ByShard<T> = std::collections::BTreeMap<String, (Arc<Calls>, Vec<(usize, T)>)>;

impl Batches for Rounds {
    type Request = Request;
    type Answer = Reply;

    async fn send(&self, batch: Vec<Request>) -> Vec<Result<Reply, StoreError>> {
        let carried = batch.len();
        let mut acquires: ByShard<Indexed> = ByShard::new();
        let mut releases: ByShard<String> = ByShard::new();
        for (i, r) in batch.into_iter().enumerate() {
            match r {
                Request::Acquire(calls, a) => acquires
                    .entry(calls.tag.clone())
                    .or_insert_with(|| (calls, Vec::new()))
                    .1
                    .push((i, a)),
                Request::Release(calls, id) => releases
                    .entry(calls.tag.clone())
                    .or_insert_with(|| (calls, Vec::new()))
                    .1
                    .push((i, id)),
            }
        }
        // Polled together, in this order: each call reaches the connection before any waits.
        let released = futures::future::join_all(
            releases
                .values()
                .flat_map(|(calls, rs)| rs.chunks(MAX_PER_CALL).map(move |c| release_call(calls, c))),
        );
        let acquired = futures::future::join_all(
            acquires
                .values()
                .flat_map(|(calls, rs)| rs.chunks(MAX_PER_CALL).map(move |c| acquire_call(calls, c))),
        );
        let (released, acquired) = futures::future::join(released, acquired).await;
        let mut answers: Vec<Option<Result<Reply, StoreError>>> = (0..carried).map(|_| None).collect();
        for (i, answer) in released.into_iter().chain(acquired).flatten() {
            answers[i] = Some(answer);
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(StoreError("a round answered fewer requests than it carried".to_owned()))))
            .collect()
    }

    /// A grant whose caller left is given back; a release whose caller left has still ended
    /// its lease, with nothing to undo.
    fn orphan(&self, answer: Reply) {
        if let Reply::Acquire(Answer::Granted { lease_id, .. } | Answer::Taken { lease_id }, calls) = answer {
            calls.release_later(lease_id);
        }
    }
}

/// An acquire script's answer to one request: {0, considered, at capacity, in cooldown,
/// unhealthy}, {1, proxy, its active leases, expires (ms), [all active, client's sessions]},
/// {2}, {3}, {4} or {5, client's sessions}. `total`: all active leases, as the script counted
/// them.
pub(crate) fn parse(answer: &[Value], lease_id: &str, total: i64) -> Result<Answer, StoreError> {
    Ok(match int(answer.first())? {
        0 => Answer::NoMatch(NoMatch {
            considered: count(answer.get(1))?,
            at_capacity: count(answer.get(2))?,
            in_cooldown: count(answer.get(3))?,
            unhealthy: count(answer.get(4))?,
        }),
        1 => Answer::Granted {
            lease_id: lease_id.to_owned(),
            proxy: text(answer.get(1))?,
            active: count(answer.get(2))?,
            expires: u64::try_from(int(answer.get(3))?).unwrap_or(0),
            total,
            sessions: answer.get(5).map(|n| count(Some(n))).transpose()?,
        },
        2 => Answer::Taken {
            lease_id: lease_id.to_owned(),
        },
        3 => Answer::Candidates,
        4 => Answer::SessionChanged,
        5 => Answer::TooManySessions {
            held: count(answer.get(1))?,
        },
        other => return Err(StoreError(format!("the acquire script answered {other}"))),
    })
}

/// When a lease granted `expires` (ms since the epoch).
pub(crate) fn expiry(expires: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_millis(expires)
}

fn unexpected(v: &(impl std::fmt::Debug + ?Sized)) -> StoreError {
    StoreError(format!("unexpected answer from the acquire script: {v:?}"))
}

pub(crate) fn int(v: Option<&Value>) -> Result<i64, StoreError> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(unexpected(&other)),
    }
}

pub(crate) fn text(v: Option<&Value>) -> Result<String, StoreError> {
    match v {
        Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
        other => Err(unexpected(&other)),
    }
}

pub(crate) fn count(v: Option<&Value>) -> Result<usize, StoreError> {
    int(v).map(|n| usize::try_from(n).unwrap_or(0))
}
