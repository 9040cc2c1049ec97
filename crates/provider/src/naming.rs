//! Deterministic instance names, the GC marks and the name rules the config
//! and the providers share.

use sha2::{Digest, Sha256};

/// Mark key every managed instance carries (label, or libvirt metadata element).
pub const LABEL_MANAGED: &str = "proxy-operator-managed";
/// The only value of [`LABEL_MANAGED`] that counts as managed (`true`, not `yes`).
pub const LABEL_MANAGED_YES: &str = "true";
/// Mark key holding the owning Proxy's UID.
pub const LABEL_UID: &str = "proxy-operator-uid";
/// Optional mark key naming the operator installation the instance belongs to, so two
/// installations sharing a backend can tell their instances apart: written at create, or
/// afterwards on an instance that has none by [`Provider::mark_installation`](crate::Provider::mark_installation).
/// Never changed once written.
pub const LABEL_INSTALLATION: &str = "proxy-operator-installation";

/// What `mark_installation` does with one instance, decided from the marks it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Marking {
    /// It carries the wanted mark already: nothing to write.
    AlreadyMarked,
    /// It carries none (or an empty one): write the wanted mark.
    Write,
    /// It is not this operator's to mark (Permanent, nothing written): why.
    Refused(String),
}

/// The [`Marking`] of an instance named `name` whose managed mark is `managed` and whose
/// installation mark is `current`, asked to carry `wanted`. Another installation's mark is never
/// overwritten: that installation's orphan GC owns the instance. An instance without the managed
/// mark is not this operator's at all.
pub fn marking(name: &str, managed: bool, current: Option<&str>, wanted: &str) -> Marking {
    match current.filter(|c| !c.is_empty()) {
        _ if !managed => Marking::Refused(format!(
            "instance {name} is not managed by this operator (no {LABEL_MANAGED}={LABEL_MANAGED_YES} mark); \
             its installation mark is left alone"
        )),
        Some(c) if c == wanted => Marking::AlreadyMarked,
        Some(other) => Marking::Refused(format!(
            "instance {name} carries installation {other:?}'s mark, not {wanted:?}: another installation's \
             instance is never marked again"
        )),
        None => Marking::Write,
    }
}

/// Prefix of every instance name.
pub const NAME_PREFIX: &str = "proxy-";

/// The instance name for a Proxy UID: `proxy-` and the first 16 characters of
/// the lowercase, unpadded RFC 4648 base32 encoding of SHA-256 over the UID's
/// UTF-8 bytes. 22 characters, a valid DNS label, stable across replacements.
pub fn name_from_uid(uid: &str) -> String {
    let digest = Sha256::digest(uid.as_bytes());
    // NB: 10 bytes are exactly 16 base32 characters, so no padding and no
    // truncation mid-group.
    let suffix = data_encoding::BASE32_NOPAD.encode(&digest[..10]).to_ascii_lowercase();
    format!("{NAME_PREFIX}{suffix}")
}

/// Whether `s` is a lowercase RFC 1123 label: 1 to 63 characters of `a-z`,
/// `0-9` and `-`, starting and ending with a letter or digit. Provider entry
/// names must be one, because a `ProviderHealth` object is named after them.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty() && b.len() <= 63 && b.iter().all(|c| ok(c) || *c == b'-') && ok(&b[0]) && ok(&b[b.len() - 1])
}

/// Whether `s` is a lowercase RFC 1123 subdomain (dot-separated labels, at most 253
/// characters): what a cluster-scoped object such as `ProviderHealth` may be named.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            !b.is_empty() && b.iter().all(|c| ok(c) || *c == b'-') && ok(&b[0]) && ok(&b[b.len() - 1])
        })
}

/// Sixteen bytes as an RFC 4122 UUID of `version` (the version nibble and the `10` variant
/// bits set), in its lowercase hyphenated text form.
pub fn uuid_text(mut bytes: [u8; 16], version: u8) -> String {
    bytes[6] = (bytes[6] & 0x0f) | (version << 4);
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = data_encoding::HEXLOWER.encode(&bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Whether `s` matches `^[A-Za-z0-9][A-Za-z0-9_.-]*$`: the identifier rule
/// for values that end up inside a providerID segment or a file name (host
/// names, image keys, kvm2 entry names). No slash, so no `../`.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn name_from_uid_matches_the_pinned_vector() {
        // Computed once with an independent tool (python hashlib + base64.b32encode)
        // for the UID below; pins the derivation against accidental change.
        assert_eq!(name_from_uid("9bbceb41-4d4b-4a9c-8d2e-0f3c3a1b2c3d"), EXPECTED_VECTOR);
    }

    const EXPECTED_VECTOR: &str = include_str!("../tests/data/name_vector.txt");

    #[test]
    fn name_is_a_valid_dns_label_of_22_characters() {
        let n = name_from_uid("a");
        assert_eq!(n.len(), 22);
        assert!(is_dns1123_label(&n));
    }

    proptest! {
        #[test]
        fn name_is_deterministic_and_well_formed(uid in ".{0,64}") {
            let a = name_from_uid(&uid);
            prop_assert_eq!(&a, &name_from_uid(&uid));
            prop_assert!(a.starts_with(NAME_PREFIX));
            prop_assert_eq!(a.len(), 22);
            prop_assert!(a[NAME_PREFIX.len()..].bytes().all(|c| c.is_ascii_lowercase() || (b'2'..=b'7').contains(&c)));
        }

        #[test]
        fn identifiers_never_contain_a_slash(s in ".{0,20}") {
            if is_identifier(&s) {
                prop_assert!(!s.contains('/'));
                prop_assert!(!s.starts_with('.'));
            }
        }
    }

    #[test]
    fn only_a_managed_instance_without_a_mark_is_marked() {
        assert_eq!(marking("p", true, None, "blue"), Marking::Write);
        assert_eq!(marking("p", true, Some(""), "blue"), Marking::Write);
        assert_eq!(marking("p", true, Some("blue"), "blue"), Marking::AlreadyMarked);
        let Marking::Refused(why) = marking("p", true, Some("green"), "blue") else {
            panic!("another installation's instance was marked");
        };
        assert!(why.contains("\"green\"") && why.contains("\"blue\""), "{why}");
        let Marking::Refused(why) = marking("p", false, None, "blue") else {
            panic!("an unmanaged instance was marked");
        };
        assert!(why.contains("not managed"), "{why}");
    }

    #[test]
    fn dns_label_rules() {
        for good in ["a", "kvm2-home", "gcp-eu", "x1", &"a".repeat(63)] {
            assert!(is_dns1123_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "Kvm", "kvm_home", "a.b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
    }

    #[test]
    fn dns_subdomain_rules() {
        for good in [
            "a",
            "kvm.home",
            "a.b.c",
            &"a".repeat(64),
            &format!("{}.b", "a".repeat(63)),
        ] {
            assert!(is_dns1123_subdomain(good), "{good}");
        }
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "Kvm.home",
            "kvm_home",
            "-a.b",
            "a.b-",
            &"a".repeat(254),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn identifier_rules() {
        for good in ["beelink", "debian-13", "a.b_c-d", "9"] {
            assert!(is_identifier(good), "{good}");
        }
        for bad in ["", "dc1/rack2", "../etc/d", ".hidden", "-x", "a b", "é"] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }
}
