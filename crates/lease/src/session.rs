//! Sticky sessions and renewal: a client that names a session keeps one lease, and so one
//! proxy, for as long as it keeps asking and that proxy stays fit for it.
//!
//! Rules (docs/discovery.md, "Sessions and renewal"):
//!
//! - A session is the caller's client name and a name it chooses ([`SessionName`]); two clients
//!   never share one.
//! - While the session's lease lives, an acquire naming the session returns that lease (same id,
//!   same proxy) and extends it to the request's TTL from now, never shortening it; no capacity
//!   is taken for it.
//! - When the lease's proxy is no longer fit for the request (no longer a candidate: drained,
//!   outside the selector or scope; unhealthy; cooling down for the request's target), the lease
//!   is given back and the session moves to the proxy a new acquire chooses. With none eligible,
//!   the answer is the usual refusal and the session has ended.
//! - A session ends with its lease (released, or expired). Only a request that starts one counts
//!   against the client's cap of live sessions; resuming or moving one never does.
//! - A held lease, in a session or not, can be renewed: its expiry becomes the renewal's TTL from
//!   now (never earlier than it was), while its proxy is still offered and healthy.
//!
//! Two replicas asking for one session at once get one lease: the mapping is the store's, and a
//! store changes it only in one atomic step that first checks it is still as the caller saw it.

use std::time::Duration;

use crate::store::NoMatch;

/// The longest session name.
pub const MAX_SESSION_NAME: usize = 64;

/// A session's name as a client gives it: 1 to [`MAX_SESSION_NAME`] of `A-Z`, `a-z`, `0-9`,
/// `_` and `-`, so it fits in a key, a log line and a proxy username unescaped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionName(String);

/// A session name outside the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("session must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-'")]
pub struct InvalidSession;

impl SessionName {
    /// # Errors
    ///
    /// [`InvalidSession`] for an empty name, one over 64 bytes, or any other character.
    pub fn parse(name: &str) -> Result<Self, InvalidSession> {
        let allowed = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-';
        if name.is_empty() || name.len() > MAX_SESSION_NAME || !name.as_bytes().iter().all(allowed) {
            return Err(InvalidSession);
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Which session an acquire belongs to, and how many live sessions its client may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session<'a> {
    /// The caller's client name (a DNS label: no `/`, so `client/name` names one session).
    pub client: &'a str,
    pub name: &'a SessionName,
    /// Live sessions the client may hold; a request that would start one more is refused.
    pub cap: usize,
}

impl Session<'_> {
    /// `<client>/<name>`: the session's key in a store.
    pub fn key(&self) -> String {
        format!("{}/{}", self.client, self.name.as_str())
    }
}

/// Why an acquire in a session granted nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRefused {
    /// No proxy was eligible for the session's new lease (the session has ended, if it had one).
    NoMatch(NoMatch),
    /// Starting the session would pass the client's cap: `held` live sessions of `cap`.
    TooMany { held: usize, cap: usize },
}

/// Why a renewal extended nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRenewed {
    /// No such lease, or it has ended (released or expired).
    Ended,
    /// Its proxy is no longer offered, or unhealthy: the lease runs to its expiry as it was.
    Unfit { proxy: String },
}

/// The expiry of a lease that ran until `expires` once extended to `ttl` from `now`: never
/// earlier than it was.
pub fn extended(expires: std::time::SystemTime, now: std::time::SystemTime, ttl: Duration) -> std::time::SystemTime {
    expires.max(now + ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names_follow_the_grammar() {
        for good in ["a", "A-z_0", &"x".repeat(64), "login-42"] {
            assert_eq!(
                SessionName::parse(good).map(|n| n.as_str().to_owned()),
                Ok(good.to_owned())
            );
        }
        for bad in ["", &"x".repeat(65), "a b", "a/b", "a:b", "é", "a.b", "a\n"] {
            assert_eq!(SessionName::parse(bad), Err(InvalidSession), "{bad:?}");
        }
    }

    #[test]
    fn an_extension_never_shortens() {
        let t0 = std::time::UNIX_EPOCH + Duration::from_secs(1000);
        let minute = Duration::from_secs(60);
        assert_eq!(extended(t0 + minute, t0, minute * 5), t0 + minute * 5);
        assert_eq!(extended(t0 + minute * 9, t0, minute * 5), t0 + minute * 9);
    }

    #[test]
    fn a_session_is_keyed_by_client_and_name() {
        let name = SessionName::parse("s-1").unwrap();
        let s = Session {
            client: "team-a",
            name: &name,
            cap: 1,
        };
        assert_eq!(s.key(), "team-a/s-1");
    }
}
