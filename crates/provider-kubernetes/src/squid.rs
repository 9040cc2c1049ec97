//! The Squid config each Pod runs (spec/providers.md §4.6), generated from the port, the
//! entry's access rules and whether the Proxy has credentials.
//!
//! The rules, in the order Squid checks them (the first that matches decides):
//!
//! 1. a client outside `allowedSources` is refused (403, before any credentials are asked for);
//! 2. with credentials, a client without the right ones gets 407;
//! 3. Squid's own cache manager (`cache_object:` and `/squid-internal-mgr/` URLs) is refused;
//! 4. a `CONNECT` to a port outside `connectPorts`, or a plain request to one outside
//!    `httpPorts`, is refused;
//! 5. the metadata services (by name, then by address), loopback, link-local, the IPv6 ranges
//!    that reach IPv4 addresses through a translator or a tunnel (NAT64 and 6to4, which would
//!    carry a request to any refused IPv4 address) and the `deniedDestinations` ranges are
//!    refused, each by a rule of its own;
//! 6. anything else is allowed.
//!
//! Each refusal in 1, 3, 4 and 5 annotates the transaction, so the access log says which rule
//! refused it (`egress-deny=source`, `manager`, `port`, `metadata`, `localhost`, `link-local`,
//! `translated`, `denied-range`).

use std::fmt::Write as _;

// Always refused, from the one list of internal destinations the operator keeps.
use egress_netguard::{LINK_LOCAL, LOCALHOST, METADATA_ADDRESSES, METADATA_NAMES, TRANSLATED};

use crate::config::{ProxyAccess, canonical_range};

/// The cap on Squid's descriptors. Squid sizes per-descriptor tables from its open-file limit,
/// and container runtimes often grant a million or more, which once made Squid run out of
/// memory in its Pod; a bound keeps it small (two descriptors per tunnelled connection).
pub const MAX_FILEDESCRIPTORS: u32 = 4096;

/// Squid's htpasswd checker in Debian and Ubuntu packages (and so in the default image).
pub const BASIC_NCSA_AUTH: &str = "/usr/lib/squid/basic_ncsa_auth";

/// The access-log annotation that names the rule that refused a request.
pub const DENY_NOTE: &str = "egress-deny";

/// The entry's rules with defaults applied and ranges in canonical form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessRules {
    pub connect_ports: Vec<u16>,
    pub http_ports: Vec<u16>,
    pub denied_destinations: Vec<String>,
    /// `None`: any client.
    pub allowed_sources: Option<Vec<String>>,
}

impl Default for AccessRules {
    fn default() -> Self {
        Self::from_config(None)
    }
}

impl AccessRules {
    /// The rules of `kubernetes.access` (validated at load; a range that still does not parse
    /// is left out of the allowed sources and kept as written among the refused ranges, where
    /// Squid then refuses to start rather than allow more).
    pub fn from_config(access: Option<&ProxyAccess>) -> Self {
        let access = access.cloned().unwrap_or_default();
        let canonical = |r: &String| canonical_range(r).unwrap_or_else(|_| r.clone());
        Self {
            connect_ports: access.effective_connect_ports(),
            http_ports: access.effective_http_ports(),
            denied_destinations: access.effective_denied_destinations().iter().map(canonical).collect(),
            allowed_sources: access
                .allowed_sources
                .as_ref()
                .map(|s| s.iter().filter_map(|r| canonical_range(r).ok()).collect()),
        }
    }
}

/// Where Squid reads the htpasswd file in the Pod: the Pod mounts its credentials Secret's
/// htpasswd key here (read-only).
pub const CREDENTIALS_DIR: &str = "/etc/squid/egress-auth";

/// Where Squid's files are. The Pod's are [`SquidFiles::POD`]; tests run Squid elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SquidFiles {
    /// The htpasswd file (used only when the Proxy has credentials).
    pub htpasswd: String,
    pub access_log: String,
    pub cache_log: String,
    /// `none`, or a path.
    pub pid: String,
    pub coredump_dir: String,
}

impl SquidFiles {
    /// In the Pod: logs to the container's streams, no pid file (the root filesystem is
    /// read-only), the htpasswd file from the mounted Secret.
    pub fn pod() -> Self {
        Self {
            htpasswd: format!("{CREDENTIALS_DIR}/{}", egress_credentials::HTPASSWD_KEY),
            access_log: "stdio:/dev/stdout".into(),
            cache_log: "/dev/stderr".into(),
            pid: "none".into(),
            coredump_dir: "/tmp".into(),
        }
    }

    /// Everything in `dir`: `htpasswd`, `access.log`, `cache.log`, core dumps; no pid file.
    /// For Squid run outside a Pod (tests, a bench).
    pub fn under(dir: &std::path::Path) -> Self {
        Self {
            htpasswd: dir.join("htpasswd").display().to_string(),
            access_log: format!("stdio:{}", dir.join("access.log").display()),
            cache_log: dir.join("cache.log").display().to_string(),
            pid: "none".into(),
            coredump_dir: dir.display().to_string(),
        }
    }
}

/// The config of a proxy listening on `port`, enforcing `rules`, and asking for the credentials
/// in `files.htpasswd` when `authenticate`. No cache; no headers naming the client.
pub fn squid_conf(port: u16, rules: &AccessRules, authenticate: bool, files: &SquidFiles) -> String {
    let mut c = String::new();
    let join = |items: &[String]| items.join(" ");
    let ports = |ports: &[u16]| ports.iter().map(u16::to_string).collect::<Vec<_>>().join(" ");
    let strs = |items: &[&str]| items.join(" ");
    // NB: writing to a String cannot fail.
    let _ = writeln!(c, "http_port {port}");
    if authenticate {
        let _ = writeln!(c, "auth_param basic program {BASIC_NCSA_AUTH} {}", files.htpasswd);
        c.push_str(
            "auth_param basic realm egress-proxy\n\
             auth_param basic children 4 startup=1 idle=1\n\
             auth_param basic credentialsttl 1 hour\n\
             acl egress_user proxy_auth REQUIRED\n",
        );
    }
    c.push_str("acl egress_connect method CONNECT\n");
    if let Some(sources) = &rules.allowed_sources {
        let _ = writeln!(c, "acl egress_sources src {}", join(sources));
    }
    let _ = writeln!(c, "acl egress_connect_ports port {}", ports(&rules.connect_ports));
    let _ = writeln!(c, "acl egress_http_ports port {}", ports(&rules.http_ports));
    // `-n`: compare the request's host name only. Without it Squid looks up the name of every
    // address-only request to compare it, which stalls each one on a reverse DNS lookup.
    let _ = writeln!(c, "acl egress_metadata_names dstdomain -n {}", strs(METADATA_NAMES));
    let _ = writeln!(c, "acl egress_metadata_addresses dst {}", strs(METADATA_ADDRESSES));
    let _ = writeln!(c, "acl egress_localhost dst {}", strs(LOCALHOST));
    let _ = writeln!(c, "acl egress_link_local dst {}", strs(LINK_LOCAL));
    let _ = writeln!(c, "acl egress_translated dst {}", strs(TRANSLATED));
    if !rules.denied_destinations.is_empty() {
        let _ = writeln!(c, "acl egress_denied_ranges dst {}", join(&rules.denied_destinations));
    }
    // Always-matching ACLs whose only effect is the note that names the refusing rule.
    for why in [
        "source",
        "manager",
        "port",
        "metadata",
        "localhost",
        "link-local",
        "translated",
        "denied-range",
    ] {
        let _ = writeln!(
            c,
            "acl egress_why_{} annotate_transaction {DENY_NOTE}={why}",
            why.replace('-', "_")
        );
    }
    if rules.allowed_sources.is_some() {
        c.push_str("http_access deny !egress_sources egress_why_source\n");
    }
    if authenticate {
        // The last ACL of the line is the credentials one, so the refusal is a 407 challenge.
        c.push_str("http_access deny !egress_user\n");
    }
    // `manager` is Squid's built-in ACL for its cache manager's URLs.
    c.push_str(
        "http_access deny manager egress_why_manager\n\
         http_access deny egress_connect !egress_connect_ports egress_why_port\n\
         http_access deny !egress_connect !egress_http_ports egress_why_port\n\
         http_access deny egress_metadata_names egress_why_metadata\n\
         http_access deny egress_metadata_addresses egress_why_metadata\n\
         http_access deny egress_localhost egress_why_localhost\n\
         http_access deny egress_link_local egress_why_link_local\n\
         http_access deny egress_translated egress_why_translated\n",
    );
    if !rules.denied_destinations.is_empty() {
        c.push_str("http_access deny egress_denied_ranges egress_why_denied_range\n");
    }
    c.push_str("http_access allow all\n");
    // The log names the client, the request and the refusing rule; never the user name.
    let _ = writeln!(
        c,
        "logformat egress %ts.%03tu %6tr %>a %Ss/%03>Hs %<st %rm %ru %{{{DENY_NOTE}}}note"
    );
    let _ = writeln!(c, "access_log {} egress", files.access_log);
    let _ = writeln!(c, "cache_log {}", files.cache_log);
    let _ = writeln!(c, "pid_filename {}", files.pid);
    let _ = writeln!(c, "coredump_dir {}", files.coredump_dir);
    let _ = writeln!(c, "max_filedescriptors {MAX_FILEDESCRIPTORS}");
    c.push_str(
        "cache deny all\n\
         via off\n\
         forwarded_for off\n",
    );
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(authenticate: bool) -> String {
        squid_conf(3130, &AccessRules::default(), authenticate, &SquidFiles::pod())
    }

    #[test]
    fn the_config_listens_on_the_port_and_bounds_descriptors() {
        let conf = conf(false);
        let lines: Vec<&str> = conf.lines().collect();
        assert!(lines.contains(&"http_port 3130"), "{conf}");
        // The regression this guards: Squid sized by a container's huge file limit.
        let fds = lines
            .iter()
            .find_map(|l| l.strip_prefix("max_filedescriptors "))
            .expect("a max_filedescriptors line");
        assert!(fds.parse::<u32>().is_ok_and(|n| n > 0 && n <= 65_536), "{fds}");
        assert!(lines.contains(&"pid_filename none"));
    }

    #[test]
    fn the_defaults_refuse_internal_targets_and_other_ports_and_end_in_allow() {
        let conf = conf(false);
        let lines: Vec<&str> = conf.lines().collect();
        for line in [
            "acl egress_connect_ports port 443",
            "acl egress_http_ports port 80",
            "acl egress_denied_ranges dst 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 100.64.0.0/10 fc00::/7",
            "acl egress_link_local dst 169.254.0.0/16 fe80::/10",
            "acl egress_translated dst 64:ff9b::/96 64:ff9b:1::/48 2002::/16",
            "http_access deny manager egress_why_manager",
            "http_access deny egress_translated egress_why_translated",
            "http_access deny egress_connect !egress_connect_ports egress_why_port",
            "http_access deny egress_denied_ranges egress_why_denied_range",
        ] {
            assert!(lines.contains(&line), "{line} missing from\n{conf}");
        }
        assert_eq!(lines.iter().filter(|l| l.starts_with("http_access allow")).count(), 1);
        let allow = lines.iter().position(|l| *l == "http_access allow all").unwrap();
        let last_access = lines.iter().rposition(|l| l.starts_with("http_access")).unwrap();
        assert_eq!(allow, last_access, "allow comes after every deny");
        // Without credentials nothing asks for them; without sources every client is taken.
        assert!(!conf.contains("auth_param") && !conf.contains("egress_user"));
        assert!(!conf.contains("egress_sources"));
    }

    #[test]
    fn credentials_are_asked_for_before_any_destination_rule() {
        let conf = conf(true);
        let lines: Vec<&str> = conf.lines().collect();
        assert!(
            lines.contains(&"auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/egress-auth/htpasswd")
        );
        let auth = lines
            .iter()
            .position(|l| *l == "http_access deny !egress_user")
            .unwrap();
        let first_rule = lines
            .iter()
            .position(|l| l.starts_with("http_access deny egress_connect"))
            .unwrap();
        assert!(auth < first_rule, "{conf}");
        assert!(!conf.contains("%un"), "the log never names the user");
    }

    #[test]
    fn configured_rules_are_written_canonically() {
        let access = ProxyAccess {
            connect_ports: Some(vec![443, 8443]),
            http_ports: Some(vec![80, 8080]),
            denied_destinations: Some(vec![]),
            allowed_sources: Some(vec!["10.8.0.0/16".into(), "FD00::5".into()]),
        };
        let rules = AccessRules::from_config(Some(&access));
        let conf = squid_conf(3128, &rules, true, &SquidFiles::pod());
        let lines: Vec<&str> = conf.lines().collect();
        assert!(lines.contains(&"acl egress_connect_ports port 443 8443"));
        assert!(lines.contains(&"acl egress_http_ports port 80 8080"));
        assert!(lines.contains(&"acl egress_sources src 10.8.0.0/16 fd00::5/128"));
        // Sources are checked first: a stranger learns nothing, not even that credentials exist.
        let source = lines
            .iter()
            .position(|l| l.starts_with("http_access deny !egress_sources"))
            .unwrap();
        let auth = lines
            .iter()
            .position(|l| *l == "http_access deny !egress_user")
            .unwrap();
        assert!(source < auth);
        // No extra ranges: no rule for them (an empty Squid ACL is an error).
        assert!(!conf.contains("egress_denied_ranges"));
    }
}
