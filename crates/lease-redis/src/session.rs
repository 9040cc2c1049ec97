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
//! moves. A session lives in its lease's shard; `route.rs` finds it there.

use std::time::Duration;

use egress_lease::{Fit, Grant, LeaseRequest, NotRenewed, Session, StoreError, Target};
use redis::Value;

use crate::calls::{count, expiry, int, text};
use crate::duration_millis;
use crate::functions::Op;
use crate::shard::Shard;

/// What the session step did.
pub(crate) enum Step {
    /// The session changed since it was read.
    Changed,
    /// The session's lease, extended.
    Resumed(Grant),
    /// The session has no live lease (none, ended, or just given back).
    Free,
}

impl Shard {
    /// The session's lease and its proxy, when it names one.
    pub(crate) async fn read_session(&self, key: &str) -> Result<Option<(String, String)>, StoreError> {
        let mut get = redis::cmd("GET");
        get.arg(format!("{}session:{key}", self.calls.tag));
        let held: Option<String> = self.calls.query(&get).await?;
        Ok(held.and_then(|h| h.split_once(',').map(|(l, p)| (l.to_owned(), p.to_owned()))))
    }

    /// `lua/session.lua` on the session as read (`lease`), its proxy `fit` for the request.
    pub(crate) async fn session_step(
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
        let peeked: Vec<Value> = self.calls.run(Op::Renew, &args).await?;
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

    pub(crate) fn note_sessions(&self, client: &str, n: usize) {
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
