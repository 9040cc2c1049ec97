//! Targets: the site a lease is for and a cooldown applies to.
//!
//! A client may send a bare host, a `host:port`, or a whole URL; they all name the same site, so
//! a target is reduced to `host[:port]` in lower case (scheme, user information, path, query and
//! fragment dropped). Any string the Go operator accepted is still accepted; only one longer than
//! [`MAX_TARGET_BYTES`] is refused. The stores keep a 128-bit digest of the reduced form, never
//! the text, so a lease or cooldown costs the same whatever its target's length.

use sha2::Digest as _;

/// The longest target accepted, in bytes, before it is reduced.
pub const MAX_TARGET_BYTES: usize = 2048;

/// A target over [`MAX_TARGET_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("target is over {MAX_TARGET_BYTES} bytes")]
pub struct TargetTooLong;

/// A reduced target, as the stores compare it: the first 16 bytes of the SHA-256 of its
/// `host[:port]`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target([u8; 16]);

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Target({})", self.hex())
    }
}

impl Target {
    /// The target `raw` names; `None` when it names none (empty, or nothing but a path).
    ///
    /// # Errors
    ///
    /// `raw` is over [`MAX_TARGET_BYTES`].
    pub fn parse(raw: &str) -> Result<Option<Self>, TargetTooLong> {
        if raw.len() > MAX_TARGET_BYTES {
            return Err(TargetTooLong);
        }
        Ok(host_port(raw).map(|site| {
            let digest = sha2::Sha256::digest(site.as_bytes());
            let mut key = [0u8; 16];
            key.copy_from_slice(&digest[..16]);
            Self(key)
        }))
    }

    /// 32 lower-case hex digits (the Redis store's field names).
    #[must_use]
    pub fn hex(&self) -> String {
        data_encoding::HEXLOWER.encode(&self.0)
    }
}

/// `raw` reduced to `host[:port]` in lower case; `None` when nothing is left.
#[must_use]
pub fn host_port(raw: &str) -> Option<String> {
    let mut rest = raw.trim();
    // A scheme: letters, digits, `+`, `-`, `.` before `://`.
    if let Some((scheme, after)) = rest.split_once("://")
        && !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        rest = after;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let host = host.to_ascii_lowercase();
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_reduce_to_host_and_port() {
        for (raw, want) in [
            ("example.com", Some("example.com")),
            ("Example.COM", Some("example.com")),
            ("  shop.example:8443 ", Some("shop.example:8443")),
            ("https://shop.example/a/b?c=d#e", Some("shop.example")),
            ("HTTP://User:Pass@Shop.Example:80/x", Some("shop.example:80")),
            ("shop.example/path", Some("shop.example")),
            ("shop.example?q", Some("shop.example")),
            ("[2001:DB8::1]:443", Some("[2001:db8::1]:443")),
            ("not a url at all", Some("not a url at all")),
            ("://x", Some(":")),
            ("", None),
            ("   ", None),
            ("/only/a/path", None),
            ("https://", None),
        ] {
            assert_eq!(host_port(raw).as_deref(), want, "{raw:?}");
        }
    }

    #[test]
    fn one_site_is_one_target_whatever_its_spelling() {
        let a = Target::parse("https://Shop.Example/a?b").unwrap();
        let b = Target::parse("shop.example").unwrap();
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(Target::parse("shop.example:8443").unwrap(), b);
        assert_eq!(Target::parse("").unwrap(), None);
        assert_eq!(a.unwrap().hex().len(), 32);
    }

    #[test]
    fn only_a_target_over_2_kib_is_refused() {
        let at_limit = "a".repeat(MAX_TARGET_BYTES);
        assert!(Target::parse(&at_limit).unwrap().is_some());
        assert_eq!(Target::parse(&format!("{at_limit}a")), Err(TargetTooLong));
    }
}
