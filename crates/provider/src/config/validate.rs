//! Validation rules: the per-entry checks every type shares, and the block
//! validators the registry attaches to each type.
//!
//! Messages are part of the contract (operators grep logs for them), so they
//! follow providers.md §3.3 and kvm.md §1.2 word for word. Every message is
//! one line; the loader only adds the file name in front.
//!
//! Long file: every message the providers file can get is here, in the order the loader checks, so
//! the wording reads against the spec in one place.

use std::collections::HashSet;

use super::ProviderConfig;
use crate::Registry;
use crate::naming::{is_dns1123_label, is_dns1123_subdomain};

/// Checks every entry in file order and returns the first problem as a full
/// message (`providers[<i>] "<name>": ...`), or the warnings worth logging.
pub(super) fn validate_entries(entries: &[ProviderConfig], registry: &Registry) -> Result<Vec<String>, String> {
    let mut seen = HashSet::new();
    let mut warnings = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        // 1. Name: present and unique. It should be a DNS-1123 label (it
        // names a ProviderHealth object, and `spec.provider` only takes
        // labels), but the Go operator loaded other names, so a file that
        // ran there must not make this one exit: warn (providers.md §3.4).
        if entry.name.is_empty() {
            return Err(format!("providers[{i}]: name is required"));
        }
        let prefix = entry_prefix(i, &entry.name);
        if !is_dns1123_label(&entry.name) {
            // A dotted name can still name an object (a subdomain), just not a Proxy's provider.
            let health = if is_dns1123_subdomain(&entry.name) {
                ""
            } else {
                " and no ProviderHealth object is written for it"
            };
            warnings.push(format!(
                "{prefix}: name is not a lowercase DNS-1123 label (lowercase letters, digits and '-', \
                 starting and ending with a letter or digit, at most 63 characters), so no Proxy can \
                 name this provider{health}; rename the entry"
            ));
        }
        if !seen.insert(entry.name.as_str()) {
            return Err(format!("{prefix}: duplicate provider name"));
        }

        // 2. Type: the registry is the allow-list, so a type the loader
        // accepts is always one the process can build.
        if entry.type_name.is_empty() {
            return Err(format!("{prefix}: type is required"));
        }
        let Some(provider_type) = registry.get(&entry.type_name) else {
            return Err(format!(
                "{prefix}: unknown provider type {}",
                go_quote(&entry.type_name)
            ));
        };

        // 3. Set-blocks rule: only the block named by the type may be set,
        // so porting an entry means changing both `type` and the block key.
        if let Some(block) = entry.blocks_present().into_iter().find(|b| *b != entry.type_name) {
            return Err(format!(
                "{prefix}: type is {} but a {block} block is set",
                entry.type_name
            ));
        }

        // 4. The type's own rules.
        provider_type
            .validate(entry)
            .map_err(|tail| format!("{prefix}: {tail}"))?;
    }
    Ok(warnings)
}

/// `providers[<i>] "<name>"`, the prefix of every per-entry message.
pub(super) fn entry_prefix(index: usize, name: &str) -> String {
    format!("providers[{index}] {}", go_quote(name))
}

/// Quotes `s` the way Go's `%q` does, so messages stay byte-identical with
/// the original operator's: double quotes, `\"` and `\\`, the short escapes
/// for common control characters, and `\x`/`\u`/`\U` for anything else that
/// does not print. Printable non-ASCII text is kept as is.
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// An approximation of Go's `unicode.IsPrint` without Unicode tables:
/// rejects control characters, every space but U+0020, the common invisible
/// format characters (bidi overrides, zero-width characters, BOM) and
/// private-use code points. Unassigned code points are not detected; they
/// are printed as is, which is harmless in a log line.
fn is_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(c as u32,
        0xAD
        | 0x600..=0x605
        | 0x61C
        | 0x6DD
        | 0x70F
        | 0x180E
        | 0x200B..=0x200F
        | 0x202A..=0x202E
        | 0x2060..=0x206F
        | 0xE000..=0xF8FF
        | 0xFEFF
        | 0xFFF9..=0xFFFB
        | 0xE0001
        | 0xE0020..=0xE007F
        | 0xF0000..)
}

/// Whether `raw` is an absolute `http`/`https` URL with a non-empty host,
/// the rule Go applied with `url.Parse` (no URL crate is available here).
///
/// Accepted shape: `scheme "://" [userinfo "@"] host [":" port] [path] ["?" query] ["#" fragment]`
/// with the scheme compared case-insensitively, a registered name or a
/// bracketed IPv6 literal as host and a port of digits only. Slightly
/// stricter than Go on exotic hosts (`%` escapes in a host are refused).
pub(super) fn is_http_url(raw: &str) -> bool {
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

/// Block validators to register with each [`ProviderType`](crate::ProviderType).
/// Each returns the message tail; the loader adds `providers[<i>] "<name>": `.
pub mod validators {
    use super::{go_quote, is_http_url};
    use crate::config::ProviderConfig;
    use crate::naming::is_identifier;

    /// For types without settings to check (`kubernetes`, `local`, ...).
    ///
    /// # Errors
    /// Never.
    pub fn none(_entry: &ProviderConfig) -> Result<(), String> {
        Ok(())
    }

    /// The `local` block: an absolute state directory, and an absolute tinyproxy path when
    /// one is given. Both end up quoted in a tinyproxy config file, so neither may hold a
    /// double quote or a line break.
    ///
    /// # Errors
    /// `local block is required`, `local.stateDir is required`, `local.stateDir must be an
    /// absolute path`, and the same for `local.tinyproxyPath`.
    pub fn local(entry: &ProviderConfig) -> Result<(), String> {
        let Some(local) = entry.local.as_ref() else {
            return Err("local block is required".to_owned());
        };
        if local.state_dir.is_empty() {
            return Err("local.stateDir is required".to_owned());
        }
        let usable = |field: &str, path: &str| {
            if !path.starts_with('/') {
                Err(format!(
                    "local.{field} must be an absolute path (got {})",
                    go_quote(path)
                ))
            } else if path.contains(['"', '\n', '\r']) {
                Err(format!(
                    "local.{field} must not contain a double quote or a line break (got {})",
                    go_quote(path)
                ))
            } else {
                Ok(())
            }
        };
        usable("stateDir", &local.state_dir)?;
        if let Some(ports) = &local.connect_ports {
            if ports.is_empty() {
                return Err("local.connectPorts must list at least one port".to_owned());
            }
            if ports.contains(&0) {
                return Err("local.connectPorts: 0 is not a port".to_owned());
            }
        }
        match local.tinyproxy_path.as_deref() {
            None | Some("") => Ok(()),
            Some(path) => usable("tinyproxyPath", path),
        }
    }

    /// The `gcp` block: a project is mandatory.
    ///
    /// # Errors
    /// `gcp.project is required`, `gcp.diskSizeGb must not be negative`.
    pub fn gcp(entry: &ProviderConfig) -> Result<(), String> {
        let Some(gcp) = entry.gcp.as_ref().filter(|g| !g.project.is_empty()) else {
            return Err("gcp.project is required".to_owned());
        };
        if gcp.disk_size_gb.is_some_and(|size| size < 0) {
            return Err("gcp.diskSizeGb must not be negative".to_owned());
        }
        Ok(())
    }

    /// The `kubernetes` block: `namespace` a DNS-1123 label; resource names and quantities of
    /// `resources`, in sorted order.
    ///
    /// # Errors
    /// The first bad entry, e.g. `kubernetes.resources.limits["memory"] must be a quantity such as 100m or 64Mi (got "lots")`.
    pub fn kubernetes(entry: &ProviderConfig) -> Result<(), String> {
        if let Some(namespace) = entry.kubernetes.as_ref().and_then(|k| k.namespace.as_deref())
            && !crate::naming::is_dns1123_label(namespace)
        {
            return Err(format!(
                "kubernetes.namespace must be a namespace name (a DNS-1123 label), got {}",
                go_quote(namespace)
            ));
        }
        if let Some(access) = entry.kubernetes.as_ref().and_then(|k| k.access.as_ref()) {
            super::access_rules(access)?;
        }
        let Some(resources) = entry.kubernetes.as_ref().and_then(|k| k.resources.as_ref()) else {
            return Ok(());
        };
        for (kind, map) in [("requests", &resources.requests), ("limits", &resources.limits)] {
            for (name, value) in map {
                let at = format!("kubernetes.resources.{kind}[{}]", go_quote(name));
                if !matches!(name.as_str(), "cpu" | "memory" | "ephemeral-storage") {
                    return Err(format!("{at}: the resource must be cpu, memory or ephemeral-storage"));
                }
                if !is_quantity(value) {
                    return Err(format!(
                        "{at} must be a quantity such as 100m or 64Mi (got {})",
                        go_quote(value)
                    ));
                }
            }
        }
        Ok(())
    }

    /// A Kubernetes quantity: digits (a decimal point allowed) and an optional suffix.
    fn is_quantity(s: &str) -> bool {
        let digits_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (number, suffix) = s.split_at(digits_end);
        !number.is_empty()
            && number.bytes().filter(|b| *b == b'.').count() <= 1
            && number.bytes().any(|b| b.is_ascii_digit())
            && matches!(
                suffix,
                "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
            )
    }

    /// The `kvm` and `kvm2` blocks (one shape; the block name is the type),
    /// checked in the order of kvm.md §1.2, stopping at the first problem.
    ///
    /// # Errors
    /// The first failing rule, e.g. `kvm2.sshKeyFile is required`.
    pub fn kvm(entry: &ProviderConfig) -> Result<(), String> {
        let b = entry.type_name.as_str();
        let Some(cfg) = entry.libvirt_block() else {
            return Err(format!("{b} block is required"));
        };
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

        // BTreeMap: keys in sorted order, so the reported key is deterministic.
        for (key, image) in &cfg.images {
            let at = format!("{b}.images[{}]", go_quote(key));
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
        }

        for (j, host) in cfg.image_url_hosts.iter().flatten().enumerate() {
            if !is_url_host(host) {
                return Err(format!(
                    "{b}.imageUrlHosts[{j}] must be a host name or an IP address, without scheme, port or path (got {})",
                    go_quote(host)
                ));
            }
        }

        if cfg.machine_types.is_empty() {
            return Err(format!("{b}.machineTypes must define at least one profile"));
        }
        for (key, machine) in &cfg.machine_types {
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

        if cfg.hosts.is_empty() {
            return Err(format!("{b}.hosts must list at least one host"));
        }
        let mut seen = std::collections::HashSet::new();
        for (j, host) in cfg.hosts.iter().enumerate() {
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
    pub(super) fn is_url_host(host: &str) -> bool {
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
}

/// `kubernetes.access`: port lists not empty and without 0; every range an address or
/// `address/prefix` without host bits; `allowedSources` neither empty nor a whole address family
/// (leave it out for any client).
fn access_rules(access: &crate::config::ProxyAccess) -> Result<(), String> {
    for (field, ports) in [
        ("connectPorts", &access.connect_ports),
        ("httpPorts", &access.http_ports),
    ] {
        let Some(ports) = ports else { continue };
        if ports.is_empty() {
            return Err(format!("kubernetes.access.{field} must list at least one port"));
        }
        if ports.contains(&0) {
            return Err(format!("kubernetes.access.{field}: 0 is not a port"));
        }
    }
    for (field, ranges) in [
        ("deniedDestinations", &access.denied_destinations),
        ("allowedSources", &access.allowed_sources),
    ] {
        for range in ranges.iter().flatten() {
            let canonical =
                crate::config::canonical_range(range).map_err(|why| format!("kubernetes.access.{field}: {why}"))?;
            if field == "allowedSources" && canonical.ends_with("/0") {
                return Err(format!(
                    "kubernetes.access.allowedSources: {range:?} is every address; leave allowedSources out to accept any client"
                ));
            }
        }
    }
    if access.allowed_sources.as_ref().is_some_and(Vec::is_empty) {
        return Err(
            "kubernetes.access.allowedSources is empty, which would refuse every client; leave it out to accept any"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_quote_matches_go() {
        // Expected values are what Go's fmt.Sprintf("%q", s) prints.
        let cases = [
            ("p1", r#""p1""#),
            ("", r#""""#),
            (r#"a"b"#, r#""a\"b""#),
            (r"a\b", r#""a\\b""#),
            ("a\nb\tc\r", r#""a\nb\tc\r""#),
            ("\u{7}\u{8}\u{b}\u{c}", r#""\a\b\v\f""#),
            ("\u{0}\u{1b}\u{7f}", r#""\x00\x1b\x7f""#),
            ("caf\u{e9} \u{2014}", "\"caf\u{e9} \u{2014}\""),
            ("a\u{a0}b", r#""a\u00a0b""#),
            ("\u{202e}x\u{feff}", r#""\u202ex\ufeff""#),
            ("\u{f0000}", r#""\U000f0000""#),
            ("\u{1f600}", "\"\u{1f600}\""),
        ];
        for (input, want) in cases {
            assert_eq!(go_quote(input), want, "{input:?}");
        }
    }

    #[test]
    fn url_hosts() {
        use super::validators::is_url_host;
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

    #[test]
    fn ranges_are_canonical_and_typos_are_refused() {
        use crate::config::canonical_range;
        for (input, want) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3", "10.1.2.3/32"),
            ("fd00::/8", "fd00::/8"),
            ("FD00:0::1", "fd00::1/128"),
            ("0.0.0.0/0", "0.0.0.0/0"),
        ] {
            assert_eq!(canonical_range(input).as_deref(), Ok(want), "{input}");
        }
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0.1/8",
            "fd00::/129",
            "host/8",
            "10.0.0.0/x",
            "10.0.0.0/8/1",
        ] {
            assert!(canonical_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn access_rules_refuse_what_would_lock_out_or_open_up() {
        use crate::config::ProxyAccess;
        let ok = ProxyAccess {
            connect_ports: Some(vec![443, 8443]),
            http_ports: Some(vec![80]),
            denied_destinations: Some(vec![]),
            allowed_sources: Some(vec!["10.8.0.0/16".into()]),
        };
        assert_eq!(super::access_rules(&ok), Ok(()));
        let cases = [
            (
                ProxyAccess {
                    connect_ports: Some(vec![]),
                    ..ProxyAccess::default()
                },
                "connectPorts must list at least one port",
            ),
            (
                ProxyAccess {
                    http_ports: Some(vec![0]),
                    ..ProxyAccess::default()
                },
                "httpPorts: 0 is not a port",
            ),
            (
                ProxyAccess {
                    denied_destinations: Some(vec!["10.0.0.1/8".into()]),
                    ..ProxyAccess::default()
                },
                "deniedDestinations: \"10.0.0.1/8\" has bits set",
            ),
            (
                ProxyAccess {
                    allowed_sources: Some(vec![]),
                    ..ProxyAccess::default()
                },
                "allowedSources is empty",
            ),
            (
                ProxyAccess {
                    allowed_sources: Some(vec!["::/0".into()]),
                    ..ProxyAccess::default()
                },
                "is every address",
            ),
        ];
        for (access, want) in cases {
            let err = super::access_rules(&access).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let defaults = ProxyAccess::default();
        assert_eq!(defaults.effective_connect_ports(), [443]);
        assert_eq!(defaults.effective_http_ports(), [80]);
        assert_eq!(defaults.effective_denied_destinations().len(), 5);
    }
}
