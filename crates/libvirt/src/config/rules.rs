//! The rules of a `kvm` or `kvm2` block ([`KvmConfig`]'s [`Block`](egress_provider::config::Block)
//! validation), in the order of kvm.md §1.2, and the checks of the URLs and addresses they use.

use std::collections::{BTreeMap, HashMap, HashSet};

use egress_provider::config::go_quote;
use egress_provider::is_identifier;

use super::{KvmConfig, KvmHost, KvmImage, KvmMachineType};

/// The rules of [`KvmConfig::validate`] for a present block named `b`, in the order of kvm.md
/// §1.2: the first that fails is the one reported.
pub(super) fn rules(b: &str, cfg: &KvmConfig) -> Result<(), String> {
    block_rules(b, cfg)?;
    // BTreeMap: keys in sorted order, so the reported key is deterministic.
    for (key, image) in &cfg.images {
        image_rules(&format!("{b}.images[{}]", go_quote(key)), key, image)?;
    }
    for (j, host) in cfg.image_url_hosts.iter().flatten().enumerate() {
        if !is_url_host(host) {
            return Err(format!(
                "{b}.imageUrlHosts[{j}] must be a host name or an IP address, without scheme, port or path (got {})",
                go_quote(host)
            ));
        }
    }
    if let Some(seconds) = cfg.stall_timeout_seconds
        && !(KvmConfig::MIN_STALL_TIMEOUT_SECONDS..=KvmConfig::MAX_STALL_TIMEOUT_SECONDS).contains(&seconds)
    {
        return Err(format!(
            "{b}.stallTimeoutSeconds must be between {} and {} (got {seconds})",
            KvmConfig::MIN_STALL_TIMEOUT_SECONDS,
            KvmConfig::MAX_STALL_TIMEOUT_SECONDS
        ));
    }
    machine_type_rules(b, &cfg.machine_types)?;
    host_rules(b, &cfg.hosts)
}

/// The SSH material, the disk size, the vendor data and the domain type.
fn block_rules(b: &str, cfg: &KvmConfig) -> Result<(), String> {
    if cfg.ssh_key_file.is_empty() {
        return Err(format!("{b}.sshKeyFile is required"));
    }
    if cfg.known_hosts_file.is_empty() && !cfg.insecure_ignore_host_key {
        return Err(format!(
            "{b}.knownHostsFile is required unless {b}.insecureIgnoreHostKey is true"
        ));
    }
    if cfg.disk_size_gb < 0 {
        return Err(format!("{b}.diskSizeGb must not be negative"));
    }
    // Review L20: bounds that keep the pool-space arithmetic far from overflow.
    if cfg.disk_size_gb > MAX_DISK_SIZE_GB {
        return Err(format!("{b}.diskSizeGb must be at most {MAX_DISK_SIZE_GB}"));
    }
    // Review L13: cloud-init silently drops a vendor-data part it cannot classify, and a
    // nested multipart; with the guest agent on, ours is put beside it in a multipart.
    if cfg.effective_install_guest_agent() && !vendor_data_recognised(&cfg.vendor_data) {
        return Err(format!(
            "{b}.vendorData must start with a line cloud-init recognises (#cloud-config, #!, #include, \
             ## template: jinja...) and must not be MIME multipart while installGuestAgent is on: \
             cloud-init would drop it"
        ));
    }
    if let Some(domain_type) = cfg.domain_type.as_deref()
        && !matches!(domain_type, "" | "kvm" | "qemu")
    {
        return Err(format!(
            "{b}.domainType must be kvm or qemu (got {})",
            go_quote(domain_type)
        ));
    }
    Ok(())
}

/// Catalogue image `key`, reported as `at`.
fn image_rules(at: &str, key: &str, image: &KvmImage) -> Result<(), String> {
    if !is_identifier(key) {
        return Err(format!(
            "{at}: key must be letters, digits, dots, dashes or underscores \u{2014} \
             it becomes part of the cached base volume's name"
        ));
    }
    if !is_http_url(&image.url) {
        return Err(format!(
            "{at}.url must be an http(s) URL (got {})",
            go_quote(&image.url)
        ));
    }
    // Review L24: credentials in a URL end up in log lines and errors. (The URL is not
    // quoted here for the same reason.)
    if url_has_userinfo(&image.url) {
        return Err(format!(
            "{at}.url must not carry credentials (user:password@): they would show in logs and errors"
        ));
    }
    if !image.sha256.is_empty() && !is_sha256_hex(&image.sha256) {
        return Err(format!("{at}.sha256 must be 64 hex characters"));
    }
    if !matches!(image.format.as_str(), "" | "qcow2" | "raw") {
        return Err(format!(
            "{at}.format must be qcow2 or raw (got {})",
            go_quote(&image.format)
        ));
    }
    if !matches!(image.firmware.as_str(), "" | "uefi" | "bios") {
        return Err(format!(
            "{at}.firmware must be uefi or bios (got {})",
            go_quote(&image.firmware)
        ));
    }
    Ok(())
}

/// At least one machine type, each with sizes within bounds.
fn machine_type_rules(b: &str, machine_types: &BTreeMap<String, KvmMachineType>) -> Result<(), String> {
    if machine_types.is_empty() {
        return Err(format!("{b}.machineTypes must define at least one profile"));
    }
    for (key, machine) in machine_types {
        if machine.vcpus <= 0 || machine.memory_mib <= 0 {
            return Err(format!(
                "{b}.machineTypes[{}] needs vcpus > 0 and memoryMiB > 0",
                go_quote(key)
            ));
        }
        if machine.vcpus > MAX_VCPUS || machine.memory_mib > MAX_MEMORY_MIB {
            return Err(format!(
                "{b}.machineTypes[{}] needs vcpus <= {MAX_VCPUS} and memoryMiB <= {MAX_MEMORY_MIB}",
                go_quote(key)
            ));
        }
    }
    Ok(())
}

/// At least one host; each named once, on a daemon of its own, with its fields well formed.
fn host_rules(b: &str, hosts: &[KvmHost]) -> Result<(), String> {
    if hosts.is_empty() {
        return Err(format!("{b}.hosts must list at least one host"));
    }
    let mut seen = HashSet::new();
    let mut daemons = HashMap::new();
    for (j, host) in hosts.iter().enumerate() {
        let at = format!("{b}.hosts[{j}]");
        if host.name.is_empty() {
            return Err(format!("{at}: name is required"));
        }
        let name = go_quote(&host.name);
        if !is_identifier(&host.name) {
            return Err(format!(
                "{at}: name {name} must be letters, digits, dots, dashes or underscores \u{2014} \
                 it becomes part of the providerID hosts/<name>/domains/<vm>"
            ));
        }
        if !seen.insert(host.name.as_str()) {
            return Err(format!("{at}: duplicate host name {name}"));
        }
        // Two hosts on one daemon would list each other's domains and fill one image cache
        // with one fill-lease writer (docs/providers/kvm2.md, "The image cache's fence").
        if let Some(other) = daemons.insert(host.daemon(), host.name.as_str()) {
            return Err(format!(
                "{at} {name}: address {} and socket {} are those of host {}; two hosts of one entry must \
                 reach two libvirt daemons",
                go_quote(&host.address),
                go_quote(host.effective_socket()),
                go_quote(other)
            ));
        }
        host_field_rules(&at, &name, host)?;
    }
    Ok(())
}

/// Host `name`'s address, user, bridge and pool, reported as `at`.
fn host_field_rules(at: &str, name: &str, host: &KvmHost) -> Result<(), String> {
    for (field, value) in [
        ("address", &host.address),
        ("user", &host.user),
        ("bridge", &host.bridge),
    ] {
        if value.is_empty() {
            return Err(format!("{at} {name}: {field} is required"));
        }
    }
    // Review M16: the address is dialled as it is; there is no default port.
    if !is_host_port(&host.address) {
        return Err(format!(
            "{at} {name}: address must be host:port (got {})",
            go_quote(&host.address)
        ));
    }
    // Review L12: the bridge and pool go into libvirt documents and calls as they are.
    for (field, value) in [("bridge", &host.bridge), ("pool", &host.pool)] {
        if !value.is_empty() && !is_identifier(value) {
            return Err(format!(
                "{at} {name}: {field} {} must be letters, digits, dots, dashes or underscores",
                go_quote(value)
            ));
        }
    }
    Ok(())
}

/// The largest overlay, in GiB (64 TiB).
pub const MAX_DISK_SIZE_GB: i64 = 65_536;
/// The most virtual CPUs a machine type may ask for.
pub const MAX_VCPUS: i32 = 1024;
/// The most memory a machine type may ask for, in MiB (4 TiB).
pub const MAX_MEMORY_MIB: i64 = 4 << 20;

/// Whether `host` is a bare host name or IP address (IPv6 with or without brackets), as a
/// URL's host part would be compared against it.
pub fn is_url_host(host: &str) -> bool {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|label| !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
}

/// Whether `url` (an http(s) URL) carries `userinfo@` before its host.
fn url_has_userinfo(url: &str) -> bool {
    let rest = url.split_once("//").map_or("", |(_, r)| r);
    rest.split(['/', '?', '#']).next().unwrap_or_default().contains('@')
}

/// `host:port` with a non-empty host and a numeric port (`[v6]:port` too).
fn is_host_port(address: &str) -> bool {
    match address.rsplit_once(':') {
        Some((host, port)) => {
            let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
            !host.is_empty()
                && !host.contains(['/', ' ', '@'])
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        }
        None => false,
    }
}

/// Whether cloud-init would use `vendor_data` as one part of a multipart: empty, or a first
/// line it recognises, and not itself MIME multipart.
fn vendor_data_recognised(vendor_data: &str) -> bool {
    let text = vendor_data.trim_start();
    if text.is_empty() {
        return true;
    }
    let first = text.lines().next().unwrap_or_default().trim_end();
    let known = [
        "#cloud-config",
        "#!",
        "#include",
        "#cloud-boothook",
        "#part-handler",
        "#upstart-job",
        "## template: jinja",
    ];
    let lower = text.to_ascii_lowercase();
    known.iter().any(|k| first.starts_with(k))
        && !lower.contains("content-type: multipart/")
        && !lower.starts_with("mime-version:")
}

/// `^[0-9a-fA-F]{64}$`.
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `raw` is an absolute `http`/`https` URL with a non-empty host,
/// the rule Go applied with `url.Parse` (no URL crate is available here).
///
/// Accepted shape: `scheme "://" [userinfo "@"] host [":" port] [path] ["?" query] ["#" fragment]`
/// with the scheme compared case-insensitively, a registered name or a
/// bracketed IPv6 literal as host and a port of digits only. Slightly
/// stricter than Go on exotic hosts (`%` escapes in a host are refused).
pub fn is_http_url(raw: &str) -> bool {
    // Go's parser refuses ASCII control characters anywhere in a URL.
    if raw.chars().any(|c| c.is_ascii_control()) {
        return false;
    }
    let Some((scheme, rest)) = raw.split_once(':') else {
        return false;
    };
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return false;
    }
    // Without `//` there is no authority (`http:host` is an opaque URL), so no host.
    let Some(rest) = rest.strip_prefix("//") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // Userinfo ends at the last `@`: a password may itself contain `@`
    // only escaped, but Go splits at the last one too.
    let host_port = match authority.rsplit_once('@') {
        Some((userinfo, host_port)) => {
            if !userinfo.chars().all(is_userinfo_char) {
                return false;
            }
            host_port
        }
        None => authority,
    };
    valid_host_port(host_port)
}

/// Characters Go's `validUserinfo` accepts.
fn is_userinfo_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c) || !c.is_ascii()
}

/// `host [":" port]`, with a non-empty host.
fn valid_host_port(host_port: &str) -> bool {
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        // IPv6 literal: `[addr]` or `[addr]:port`.
        let Some((addr, after)) = bracketed.split_once(']') else {
            return false;
        };
        // Hex digits and colons, plus an optional `%zone` (letters, digits, `-._~`).
        let addr_char = |c: char| c.is_ascii_alphanumeric() || ":.%-_~".contains(c);
        if addr.is_empty() || !addr.chars().all(addr_char) {
            return false;
        }
        match after.strip_prefix(':') {
            Some(port) => (addr, Some(port)),
            None if after.is_empty() => (addr, None),
            None => return false,
        }
    } else {
        let (host, port) = match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        };
        let host_char = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=".contains(c) || !c.is_ascii();
        if !host.chars().all(host_char) {
            return false;
        }
        (host, port)
    };
    // Go accepts an empty port after the colon (`host:`); so do we.
    let port_ok = port.is_none_or(|p| p.bytes().all(|b| b.is_ascii_digit()));
    !host.is_empty() && port_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_hosts() {
        for good in ["mirror.example", "MIRROR", "10.0.0.5", "fd00::5", "[fd00::5]", "a-b.c"] {
            assert!(is_url_host(good), "{good}");
        }
        for bad in ["", "https://m", "m:80", "m/x", "m .x", "a..b", "[m]", "user@m"] {
            assert!(!is_url_host(bad), "{bad}");
        }
    }

    #[test]
    fn http_urls() {
        for good in [
            "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-generic-amd64.qcow2",
            "http://example.com",
            "HTTPS://Example.COM/x",
            "http://user:pass@host:8080/p?q=1#f",
            "http://host:",
            "http://host?x=1",
            "http://[::1]:80/img",
            "http://[fe80::1%25eth0]/",
            "http://10.0.0.1/img.raw",
            "https://bücher.example/x",
        ] {
            assert!(is_http_url(good), "{good}");
        }
        for bad in [
            "",
            "ftp://x",
            "http://",
            "https:///path",
            "http://:80/",
            "http://user@/x",
            "not a url",
            "http:host",
            "http:/host/x",
            "//host/path",
            "file:///etc/passwd",
            "http://host:port/",
            "http://a b/",
            "http://host/a\nb",
            "http://[::1/",
            "http://[]/",
            "http://[::1]x/",
            "http://us er@host/",
            "http://ho%41st/",
        ] {
            assert!(!is_http_url(bad), "{bad}");
        }
    }
}
