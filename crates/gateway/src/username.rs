//! The proxy username: what a crawler asks of the gateway, in the one field every HTTP client
//! lets it set. Comma-separated `key=value` pairs, each key and value percent-decoded after the
//! split (so `%2C` and `%3D` carry a comma and an equals sign): `pool` picks a ProxyPool,
//! `session` makes the connection sticky, `ttl` is how long an idle session keeps its proxy,
//! and every other key is an attribute the proxy must have, as in the lease API's selector. An
//! empty username, or `any`, asks for any proxy. Pure: the fronts answer its errors with 407
//! (SOCKS5: an authentication failure) and dial nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use egress_lease::SessionName;

/// The longest username: SOCKS5 carries at most 255 bytes, and HTTP is held to the same.
pub const MAX_USERNAME: usize = 255;
/// The username that asks for any proxy where an empty one cannot be sent (SOCKS5).
pub const ANY: &str = "any";
/// Keys with a meaning of their own, never attribute names.
pub const POOL: &str = "pool";
pub const SESSION: &str = "session";
pub const TTL: &str = "ttl";
/// The prefix of keys kept for the proxies' observed exits: only
/// [`egress_discovery::EXIT_KEYS`] (`exit.country`, `exit.asn`) select; the others are refused.
pub const EXIT_PREFIX: &str = "exit.";

/// What a username asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    /// A ProxyPool's name.
    pub pool: Option<String>,
    /// The sticky session; `None`: each tunnel takes a lease of its own.
    pub session: Option<SessionName>,
    /// How long an idle session keeps its proxy (only with a session).
    pub ttl: Option<Duration>,
    /// The attributes the proxy must have.
    pub attributes: BTreeMap<String, String>,
}

impl Routing {
    /// The lease API's selector: the attributes and the pool.
    pub fn selector(&self) -> BTreeMap<String, String> {
        let mut selector = self.attributes.clone();
        if let Some(pool) = &self.pool {
            selector.insert(POOL.to_owned(), pool.clone());
        }
        selector
    }
}

/// What is wrong with a username; the message names the part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsernameError {
    #[error("username is {0} bytes, at most {MAX_USERNAME}")]
    TooLong(usize),
    #[error("username part {0:?} is not key=value")]
    NotAPair(String),
    #[error("username part {0:?} has a % not followed by two hex digits, or is not UTF-8 once decoded")]
    BadEncoding(String),
    #[error("username names {0:?} twice")]
    Duplicate(String),
    #[error("username key {0:?} has an empty value")]
    EmptyValue(String),
    #[error("username key {0:?} is reserved (keys starting with exit. are, but exit.country and exit.asn)")]
    Reserved(String),
    #[error("username session {0:?}: a session is 1 to 64 of A-Z, a-z, 0-9, '_' and '-'")]
    BadSession(String),
    #[error("username ttl {0:?}: seconds (or a duration such as 10m) from 1s to {1}s")]
    BadTtl(String, u64),
    #[error("username ttl needs a session: it is how long an idle session keeps its proxy")]
    TtlWithoutSession,
}

/// The routing `username` asks for; a `ttl` may be at most `max_ttl` (`--max-lease-ttl`).
///
/// # Errors
/// [`UsernameError`] for anything outside the grammar.
pub fn parse(username: &str, max_ttl: Duration) -> Result<Routing, UsernameError> {
    if username.len() > MAX_USERNAME {
        return Err(UsernameError::TooLong(username.len()));
    }
    let mut routing = Routing::default();
    if username.is_empty() || username == ANY {
        return Ok(routing);
    }
    let mut seen = std::collections::BTreeSet::new();
    for part in username.split(',') {
        let (key, value) = part
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| UsernameError::NotAPair(part.to_owned()))?;
        let (key, value) = (decoded(key, part)?, decoded(value, part)?);
        if !seen.insert(key.clone()) {
            return Err(UsernameError::Duplicate(key));
        }
        if value.is_empty() {
            return Err(UsernameError::EmptyValue(key));
        }
        take(&mut routing, key, value, max_ttl)?;
    }
    if routing.ttl.is_some() && routing.session.is_none() {
        return Err(UsernameError::TtlWithoutSession);
    }
    Ok(routing)
}

/// Puts one decoded pair into `routing`.
fn take(routing: &mut Routing, key: String, value: String, max_ttl: Duration) -> Result<(), UsernameError> {
    match key.as_str() {
        POOL => routing.pool = Some(value),
        SESSION => {
            let name = SessionName::parse(&value).map_err(|_| UsernameError::BadSession(value.clone()))?;
            routing.session = Some(name);
        }
        TTL => routing.ttl = Some(ttl(&value, max_ttl)?),
        _ if egress_discovery::EXIT_KEYS.contains(&key.as_str()) => {
            routing.attributes.insert(key, value);
        }
        _ if key.starts_with(EXIT_PREFIX) => return Err(UsernameError::Reserved(key)),
        _ => {
            routing.attributes.insert(key, value);
        }
    }
    Ok(())
}

/// `text` percent-decoded: every `%` must start a two-digit hex escape, and the result be UTF-8.
fn decoded(text: &str, part: &str) -> Result<String, UsernameError> {
    let bad = || UsernameError::BadEncoding(part.to_owned());
    let bytes = text.as_bytes();
    let escapes_whole = bytes.iter().enumerate().filter(|(_, b)| **b == b'%').all(|(i, _)| {
        bytes
            .get(i + 1..i + 3)
            .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_whole {
        return Err(bad());
    }
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| bad())
}

/// A ttl: whole seconds, or a Go duration (`90s`, `10m`, `1h`), from 1 s to `max`.
fn ttl(text: &str, max: Duration) -> Result<Duration, UsernameError> {
    let parsed = if text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse().ok().map(Duration::from_secs)
    } else {
        egress_go_decode::parse_duration(text).ok()
    };
    parsed
        .filter(|d| *d >= Duration::from_secs(1) && *d <= max)
        .ok_or_else(|| UsernameError::BadTtl(text.to_owned(), max.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn ok(username: &str) -> Routing {
        parse(username, HOUR).unwrap_or_else(|e| panic!("{username:?}: {e}"))
    }

    fn err(username: &str) -> UsernameError {
        parse(username, HOUR).expect_err(username)
    }

    #[test]
    fn empty_and_any_ask_for_any_proxy() {
        assert_eq!(ok(""), Routing::default());
        assert_eq!(ok("any"), Routing::default());
        assert!(ok("").selector().is_empty());
    }

    #[test]
    fn pairs_pick_a_pool_a_session_its_ttl_and_attributes() {
        let r = ok("pool=blue,session=login-7,ttl=600,geo=eu,tier=premium");
        assert_eq!(r.pool.as_deref(), Some("blue"));
        assert_eq!(r.session.as_ref().map(SessionName::as_str), Some("login-7"));
        assert_eq!(r.ttl, Some(Duration::from_secs(600)));
        assert_eq!(
            r.attributes,
            BTreeMap::from([("geo".into(), "eu".into()), ("tier".into(), "premium".into())])
        );
        let selector = r.selector();
        assert_eq!(selector.get("pool").map(String::as_str), Some("blue"));
        assert_eq!(selector.len(), 3, "session and ttl are not attributes: {selector:?}");
        assert_eq!(ok("session=s,ttl=10m").ttl, Some(Duration::from_secs(600)));
        assert_eq!(ok("session=s,ttl=1h").ttl, Some(HOUR));
    }

    #[test]
    fn keys_and_values_are_percent_decoded_after_the_split() {
        let r = ok("site%20name=a%2Cb%3Dc,pool=x");
        assert_eq!(r.attributes.get("site name").map(String::as_str), Some("a,b=c"));
        assert_eq!(ok("pool=%F0%9F%8C%8D").pool.as_deref(), Some("\u{1F30D}"));
    }

    #[test]
    fn malformed_usernames_are_refused_naming_the_problem() {
        assert_eq!(err(&"a".repeat(256)), UsernameError::TooLong(256));
        assert!(parse(&format!("k={}", "v".repeat(253)), HOUR).is_ok(), "255 bytes pass");
        assert_eq!(err("geo"), UsernameError::NotAPair("geo".into()));
        assert_eq!(err("geo=eu,"), UsernameError::NotAPair(String::new()));
        assert_eq!(err("=eu"), UsernameError::NotAPair("=eu".into()));
        assert_eq!(err("geo=eu,geo=us"), UsernameError::Duplicate("geo".into()));
        assert_eq!(
            err("geo=eu,g%65o=us"),
            UsernameError::Duplicate("geo".into()),
            "after decoding"
        );
        assert_eq!(err("geo="), UsernameError::EmptyValue("geo".into()));
        assert_eq!(err("geo=%zz"), UsernameError::BadEncoding("geo=%zz".into()));
        assert_eq!(err("geo=eu%2"), UsernameError::BadEncoding("geo=eu%2".into()));
        assert_eq!(err("geo=%FF"), UsernameError::BadEncoding("geo=%FF".into()));
        assert_eq!(err("exit.ip=1.2.3.4"), UsernameError::Reserved("exit.ip".into()));
        // The verified exit's country and ASN select, as attributes the directory fills.
        let routing = parse("exit.country=DE,exit.asn=64500,geo=eu", Duration::from_secs(3600)).unwrap();
        assert_eq!(
            routing.selector(),
            BTreeMap::from([
                ("exit.asn".to_owned(), "64500".to_owned()),
                ("exit.country".to_owned(), "DE".to_owned()),
                ("geo".to_owned(), "eu".to_owned()),
            ])
        );
        assert_eq!(err("session=a/b"), UsernameError::BadSession("a/b".into()));
        assert_eq!(
            err(&format!("session={}", "s".repeat(65))),
            UsernameError::BadSession("s".repeat(65))
        );
        assert_eq!(err("ttl=60"), UsernameError::TtlWithoutSession);
        for bad in ["0", "0s", "500ms", "3601", "2h", "-5", "ten", "1.5"] {
            assert_eq!(
                err(&format!("session=s,ttl={bad}")),
                UsernameError::BadTtl(bad.into(), 3600),
                "{bad}"
            );
        }
    }

    #[test]
    fn every_message_names_the_part_at_fault() {
        for (username, names) in [
            ("geo=eu,geo=us", "\"geo\""),
            ("exit.ip=1", "exit.ip"),
            ("session=s,ttl=9h", "\"9h\""),
            ("tier", "\"tier\""),
        ] {
            let message = err(username).to_string();
            assert!(message.contains(names), "{message}");
        }
    }
}
