//! Volume names in a host's pool.
//!
//! The base image carries the provider entry's name (`base-<entry>-<key>.<format>`): two entries
//! that map one key to two different URLs must never share, and so never delete, one file (H4).

use sha2::{Digest, Sha256};

/// The overlay of domain `name`.
pub fn overlay(name: &str) -> String {
    format!("{name}.qcow2")
}

/// The seed ISO of domain `name`.
pub fn seed(name: &str) -> String {
    format!("{name}-seed.iso")
}

/// The cached base image of catalogue key `key` (or [`url_key`]) for entry `entry`.
pub fn base(entry: &str, key: &str, format: &str) -> String {
    format!("base-{entry}-{key}.{format}")
}

/// The cached base image of catalogue key `key` (or [`url_key_kvm`]) as the first-generation
/// provider names it (`base-<key>.<format>`; kept so its caches go on being used).
pub fn base_kvm(key: &str, format: &str) -> String {
    format!("base-{key}.{format}")
}

/// The key of an image given by URL as the first-generation provider makes it: the first 16 hex
/// characters of the URL's SHA-256.
pub fn url_key_kvm(url: &str) -> String {
    Sha256::digest(url.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The marker that completes base volume `base` (its digest, 64 hex characters).
pub fn marker(base: &str) -> String {
    format!("{base}.sha256")
}

/// The MAC address of domain `name`'s NIC: QEMU's locally administered prefix `52:54:00` and
/// three bytes of the name's SHA-256, so the provider knows which interface is the VM's own
/// when the guest agent reports several (review M14).
pub fn mac(name: &str) -> String {
    let d = Sha256::digest(name.as_bytes());
    format!("52:54:00:{:02x}:{:02x}:{:02x}", d[0], d[1], d[2])
}

/// The key of an image given by URL: `url-` and the first 32 hex characters of the URL's
/// SHA-256 (review L8: 128 bits, and a prefix that sets URL images apart from catalogue keys).
pub fn url_key(url: &str) -> String {
    let hex: String = Sha256::digest(url.as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("url-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_spec() {
        assert_eq!(overlay("proxy-a"), "proxy-a.qcow2");
        assert_eq!(seed("proxy-a"), "proxy-a-seed.iso");
        let b = base("kvm2-home", "debian-13", "qcow2");
        assert_eq!(b, "base-kvm2-home-debian-13.qcow2");
        assert_eq!(marker(&b), "base-kvm2-home-debian-13.qcow2.sha256");
        assert_eq!(
            base("kvm2-integration", "test-image", "qcow2"),
            "base-kvm2-integration-test-image.qcow2"
        );
        let m = mac("proxy-a");
        assert!(m.starts_with("52:54:00:") && m.len() == 17, "{m}");
        assert_eq!(m, mac("proxy-a"));
        assert_ne!(m, mac("proxy-b"));
        assert_eq!(base_kvm("debian-13", "qcow2"), "base-debian-13.qcow2");
        // Pinned with Python's hashlib: sha256(url).hexdigest()[:16] for kvm.
        assert_eq!(url_key_kvm("https://example.com/a.qcow2"), "4124fe5315443ffa");
        // Pinned with Python's hashlib: "url-" + sha256(url).hexdigest()[:32].
        assert_eq!(
            url_key("https://example.com/a.qcow2"),
            "url-4124fe5315443ffac292e1429535a406"
        );
        assert_ne!(
            url_key("https://example.com/a.qcow2"),
            url_key("https://example.com/b.qcow2")
        );
    }
}
