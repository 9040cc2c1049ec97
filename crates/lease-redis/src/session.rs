//! Sessions and renewal on Redis (`lua/session.lua`, `lua/renew.lua`, the session half of
//! `lua/acquire.lua`).
//!
//! An acquire in a session reads the session (`GET`), checks its proxy against the request's
//! candidates here, then runs the session step, which applies only while the session is as
//! read: the lease extended, or given back when its proxy is unfit. A session without a live
//! lease then gets one from the acquire script, which binds it only while the session still
//! has none and its client is under its cap. Whenever a step finds the session changed
//! (another replica bound or moved it in between), the acquire reads it again, three times at
//! most; so two replicas asking for one session at once end with one lease.
//!
//! A session's first lease is chosen from the candidates, never from the installation's index:
//! the index cannot bind a session, and a session asks for a new lease only when it starts or
//! moves.

use std::time::Duration;

use egress_lease::{
    Candidate, Fit, Grant, LeaseRequest, Member, NotRenewed, Session, SessionRefused, StoreError, Target,
};
use redis::Value;

use crate::calls::{Answer, count, expiry, int, text};
use crate::functions::Op;
use crate::{BATCH, RedisStore, duration_millis};

/// Reads of a session in one acquire, at most: each further one follows another replica's
/// change to the session, and a session changes only when its lease starts, moves or ends.
const SESSION_READS: usize = 3;

/// What the session step did.
enum Step {
    /// The session changed since it was read.
    Changed,
    /// The session's lease, extended.
    Resumed(Grant),
    /// The session has no live lease (none, ended, or just given back).
    Free,
}

/// The request's candidates, read as far as needed and kept for another try.
struct Listed<'a, 'c> {
    read: Vec<Candidate<'c>>,
    rest: &'a mut (dyn Iterator<Item = Candidate<'c>> + Send),
}

impl<'c> Listed<'_, 'c> {
    /// The first batch, and whether it is all of them.
    fn first(&mut self) -> (&[Candidate<'c>], bool) {
        let want = (BATCH + 1).saturating_sub(self.read.len());
        self.read.extend((&mut *self.rest).take(want));
        let last = self.read.len() <= BATCH;
        (&self.read[..self.read.len().min(BATCH)], last)
    }

    fn all(&mut self) -> &[Candidate<'c>] {
        self.read.extend(&mut *self.rest);
        &self.read
    }
}

impl RedisStore {
    /// [`egress_lease::LeaseStore::acquire_session`].
    pub(crate) async fn in_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Result<Grant, SessionRefused>, StoreError> {
        let key = session.key();
        let mut listed = Listed {
            read: Vec::new(),
            rest: candidates,
        };
        for _ in 0..SESSION_READS {
            if let Some((lease, proxy)) = self.read_session(&key).await? {
                let fit = member(&proxy).is_some_and(|c| c.healthy);
                match self.session_step(session, &key, &lease, fit, req).await? {
                    Step::Changed => continue,
                    Step::Resumed(grant) => return Ok(Ok(grant)),
                    Step::Free => {}
                }
            }
            let (first, last) = listed.first();
            let mut answer = self.run_listed(first, last, req, Some((&key, session.cap))).await?;
            if answer == Answer::Candidates {
                answer = self
                    .run_listed(listed.all(), true, req, Some((&key, session.cap)))
                    .await?;
            }
            let refused = match answer {
                Answer::SessionChanged => continue,
                Answer::TooManySessions { held } => SessionRefused::TooMany { held, cap: session.cap },
                Answer::NoMatch(n) => SessionRefused::NoMatch(n),
                Answer::Granted { sessions, .. } => {
                    if let Some(n) = sessions {
                        self.note_sessions(session.client, n);
                    }
                    return match self.answer(answer, req) {
                        Some(Ok(grant)) => Ok(Ok(grant)),
                        _ => Err(StoreError("a grant did not read as one".to_owned())),
                    };
                }
                Answer::Candidates | Answer::Taken { .. } => {
                    return Err(StoreError("the final acquire run asked for more".to_owned()));
                }
            };
            return Ok(Err(refused));
        }
        Err(StoreError(format!(
            "session {key}: changed by other replicas {SESSION_READS} times while this one asked for it"
        )))
    }

    /// The session's lease and its proxy, when it names one.
    async fn read_session(&self, key: &str) -> Result<Option<(String, String)>, StoreError> {
        let mut get = redis::cmd("GET");
        get.arg(format!("{}session:{key}", self.calls.tag));
        let held: Option<String> = self.calls.query(&get).await?;
        Ok(held.and_then(|h| h.split_once(',').map(|(l, p)| (l.to_owned(), p.to_owned()))))
    }

    /// `lua/session.lua` on the session as read (`lease`), its proxy `fit` for the request.
    async fn session_step(
        &self,
        session: &Session<'_>,
        key: &str,
        lease: &str,
        fit: bool,
        req: &LeaseRequest,
    ) -> Result<Step, StoreError> {
        let [max_ended, retention] = self.calls.ended_args();
        let args = [
            self.calls.now(),
            key.to_owned(),
            lease.to_owned(),
            if fit { "1" } else { "0" }.to_owned(),
            duration_millis(req.ttl).to_string(),
            req.target.as_ref().map(Target::hex).unwrap_or_default(),
            max_ended,
            retention,
        ];
        let (answer, replicated) = self.calls.run_acquire(Op::Session, &args).await?;
        match int(answer.first())? {
            4 => Ok(Step::Changed),
            6 => {
                self.note_sessions(session.client, count(answer.get(1))?);
                Ok(Step::Free)
            }
            1 => {
                self.calls.replicated(replicated)?;
                self.remember_total(int(answer.get(4))?);
                self.note_sessions(session.client, count(answer.get(5))?);
                Ok(Step::Resumed(extended(lease, &answer)?))
            }
            other => Err(StoreError(format!("the session script answered {other}"))),
        }
    }

    /// [`egress_lease::LeaseStore::renew`]: the lease's proxy read, checked, then the lease
    /// extended (a proxy never changes under a lease, so nothing can come between).
    pub(crate) async fn renew_lease(
        &self,
        lease_id: &str,
        ttl: Duration,
        fit: &Fit<'_>,
    ) -> Result<Result<Grant, NotRenewed>, StoreError> {
        let mut args = [
            self.calls.now(),
            lease_id.to_owned(),
            "peek".to_owned(),
            duration_millis(ttl).to_string(),
            duration_millis(self.calls.cooldown).to_string(),
        ];
        let peeked: Vec<Value> = self.run(Op::Renew, &args).await?;
        let Some(proxy) = peeked.first().map(|p| text(Some(p))).transpose()? else {
            return Ok(Err(NotRenewed::Ended));
        };
        if !fit(&proxy) {
            return Ok(Err(NotRenewed::Unfit { proxy }));
        }
        args[0] = self.calls.now();
        "extend".clone_into(&mut args[2]);
        let (answer, replicated) = self.calls.run_acquire(Op::Renew, &args).await?;
        if int(answer.first())? == 0 {
            return Ok(Err(NotRenewed::Ended));
        }
        self.calls.replicated(replicated)?;
        Ok(Ok(extended(lease_id, &answer)?))
    }

    fn note_sessions(&self, client: &str, n: usize) {
        let mut sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if n == 0 {
            sessions.remove(client);
        } else {
            sessions.insert(client.to_owned(), n);
        }
    }
}

/// The grant of an extended lease: {1, proxy, its active leases, expires (ms), .., lives (ms)},
/// how long it lives from Redis's now last.
fn extended(lease_id: &str, answer: &[Value]) -> Result<Grant, StoreError> {
    let lives = u64::try_from(int(answer.last())?).unwrap_or(0);
    Ok(Grant {
        lease_id: lease_id.to_owned(),
        proxy_id: text(answer.get(1))?,
        expires_at: expiry(u64::try_from(int(answer.get(3))?).unwrap_or(0)),
        ttl: Duration::from_millis(lives),
        active_leases: count(answer.get(2))?,
        resumed: true,
    })
}
