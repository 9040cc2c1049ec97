//! What the state directory holds for one instance, and the pure rules
//! around it: the record's JSON shape, the id, the loopback address an
//! instance listens on, and the tinyproxy config it runs with.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::SystemTime;

use egress_provider::{LABEL_MANAGED, LABEL_MANAGED_YES, LABEL_UID, is_dns1123_label};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The one location of this provider: the machine the operator runs on.
pub const LOCATION: &str = "local";

/// One instance as `<stateDir>/<name>.json` records it. Written by create,
/// in the call that makes the instance exist, and by delete (the `deleting`
/// flag). The process started for it is the machine's business.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The instance name (`name_from_uid`).
    pub name: String,
    /// The GC marks under the same keys other backends use as labels:
    /// managed, UID and, when set, installation.
    #[serde(default)]
    pub marks: BTreeMap<String, String>,
    /// When the instance was created, RFC 3339. Anything else reads as unknown.
    #[serde(default)]
    pub created_at: String,
    /// The loopback address tinyproxy listens on.
    pub address: Ipv4Addr,
    /// The port tinyproxy listens on (`spec.port`).
    pub port: u16,
    /// Set by delete before it stops the process and removes the files.
    #[serde(default)]
    pub deleting: bool,
}

impl Record {
    /// Where tinyproxy listens.
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::from((self.address, self.port))
    }

    /// Whether the managed mark is set.
    pub fn is_managed(&self) -> bool {
        self.marks.get(LABEL_MANAGED).is_some_and(|v| v == LABEL_MANAGED_YES)
    }

    /// The UID mark, empty when absent.
    pub fn uid(&self) -> &str {
        self.marks.get(LABEL_UID).map_or("", String::as_str)
    }

    /// The creation time; `None` when missing or unparsable (GC reads that as very old).
    pub fn created(&self) -> Option<SystemTime> {
        let at: jiff::Timestamp = self.created_at.parse().ok()?;
        Some(SystemTime::from(at))
    }

    /// The record as stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A struct of strings, numbers and a string map always serialises.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Parses a stored record.
    ///
    /// # Errors
    /// What is wrong with the JSON (the text itself is never quoted back).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| {
            let what = match e.classify() {
                serde_json::error::Category::Io => "i/o error",
                serde_json::error::Category::Syntax => "not JSON",
                serde_json::error::Category::Data => "wrong fields",
                serde_json::error::Category::Eof => "truncated",
            };
            format!("unreadable record ({what} at line {})", e.line())
        })
    }
}

/// RFC 3339 text of `at`, as records store it.
pub fn timestamp(at: SystemTime) -> String {
    jiff::Timestamp::try_from(at).map_or_else(|_| String::new(), |t| t.to_string())
}

/// The id of instance `name`: `local/<name>`.
pub fn id_of(name: &str) -> String {
    format!("{LOCATION}/{name}")
}

/// What an id names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedId {
    /// An instance of this machine.
    Here(String),
    /// A well-formed id of another location (another machine's state).
    Elsewhere(String),
}

/// Parses `<location>/<name>`: two non-empty segments, the name a DNS-1123
/// label (so an id can never point outside the state directory).
pub fn parse_id(id: &str) -> Option<ParsedId> {
    let (location, name) = id.split_once('/')?;
    if location.is_empty() || !is_dns1123_label(name) || !is_dns1123_label(location) {
        return None;
    }
    Some(if location == LOCATION {
        ParsedId::Here(name.to_owned())
    } else {
        ParsedId::Elsewhere(location.to_owned())
    })
}

/// The `attempt`-th loopback address candidate for instance `name` under
/// state directory `salt`: 127.a.b.c with a in 1..=254 (never 127.0.x.x,
/// where local services live) and c in 1..=254. Derived from a hash, so a
/// repeated create picks the same first candidate, and instances of
/// different state directories rarely meet; create skips a candidate that
/// is already in use.
pub fn address_candidate(salt: &str, name: &str, attempt: u32) -> Ipv4Addr {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update([0]);
    h.update(name.as_bytes());
    h.update(attempt.to_be_bytes());
    let d = h.finalize();
    Ipv4Addr::new(127, 1 + d[0] % 254, d[1], 1 + d[2] % 254)
}

/// What one instance's tinyproxy enforces beyond its address.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    /// The ports a `CONNECT` may reach (one `ConnectPort` line each).
    pub connect_ports: &'a [u16],
    /// The one user and password it takes (`BasicAuth`), when the Proxy has credentials. Both
    /// must be [plain](egress_provider::Credentials::is_plain): the config line has no quoting.
    pub credentials: Option<&'a egress_provider::Credentials>,
}

/// The tinyproxy config of one instance: listen on its own loopback address and port, and
/// leave from that address too (`Bind`), so each proxy has its own exit as in a real fleet and a
/// target can tell them apart; CONNECT only to `rules.connect_ports`, the credentials when given, long tunnels, its log in the
/// instance directory. `drop_to` names the user and group tinyproxy switches to when started as
/// root. The text holds the password when there are credentials: it is written readable by its
/// owner only.
pub fn tinyproxy_config(record: &Record, dir: &Path, drop_to: Option<(&str, &str)>, rules: &Rules<'_>) -> String {
    let mut text = format!(
        "# Written by egress-provider-local for {name}; rewritten at every start.\n\
         Listen {address}\n\
         Bind {address}\n\
         Port {port}\n\
         Timeout 600\n\
         MaxClients 100\n\
         LogFile \"{dir}/tinyproxy.log\"\n\
         LogLevel Notice\n\
         DisableViaHeader Yes\n",
        name = record.name,
        address = record.address,
        port = record.port,
        dir = dir.display(),
    );
    for port in rules.connect_ports {
        text.push_str(&format!("ConnectPort {port}\n"));
    }
    if let Some(c) = rules.credentials {
        text.push_str(&format!("BasicAuth {} {}\n", c.username(), c.password()));
    }
    if let Some((user, group)) = drop_to {
        text.push_str(&format!("User {user}\nGroup {group}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            name: "proxy-abc".into(),
            marks: BTreeMap::from([
                (LABEL_MANAGED.to_owned(), LABEL_MANAGED_YES.to_owned()),
                (LABEL_UID.to_owned(), "u-1".to_owned()),
            ]),
            created_at: "2026-11-30T01:02:03Z".into(),
            address: Ipv4Addr::new(127, 9, 8, 7),
            port: 3128,
            deleting: false,
        }
    }

    #[test]
    fn a_record_round_trips_and_garbage_is_refused_without_echo() {
        let r = record();
        assert_eq!(Record::from_bytes(&r.to_bytes()), Ok(r.clone()));
        assert!(r.is_managed());
        assert_eq!(r.uid(), "u-1");
        assert_eq!(r.listen_addr().to_string(), "127.9.8.7:3128");
        let err = Record::from_bytes(b"secret-ish {").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn creation_time_missing_or_garbage_is_unknown() {
        let mut r = record();
        assert_eq!(r.created().map(timestamp).as_deref(), Some("2026-11-30T01:02:03Z"));
        r.created_at = String::new();
        assert_eq!(r.created(), None);
        r.created_at = "yesterday".into();
        assert_eq!(r.created(), None);
    }

    #[test]
    fn ids() {
        assert_eq!(id_of("proxy-a"), "local/proxy-a");
        assert_eq!(parse_id("local/proxy-a"), Some(ParsedId::Here("proxy-a".into())));
        assert_eq!(parse_id("laptop/proxy-a"), Some(ParsedId::Elsewhere("laptop".into())));
        for bad in [
            "",
            "proxy-a",
            "local/",
            "/proxy-a",
            "local/a/b",
            "local/../etc",
            "local/A",
            "lo cal/a",
        ] {
            assert_eq!(parse_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn address_candidates_are_loopback_stable_and_spread() {
        let a = address_candidate("/s", "proxy-a", 0);
        assert_eq!(a, address_candidate("/s", "proxy-a", 0));
        assert_ne!(a, address_candidate("/s", "proxy-a", 1));
        assert_ne!(a, address_candidate("/t", "proxy-a", 0));
        for i in 0..2000 {
            let c = address_candidate("/s", &format!("p{i}"), 0);
            let [x, y, _, z] = c.octets();
            assert!(c.is_loopback() && y != 0 && z != 0 && z != 255, "{c}");
            assert_eq!(x, 127);
        }
    }

    #[test]
    fn tinyproxy_config_listens_and_leaves_on_the_record_address_and_drops_root() {
        let open = Rules {
            connect_ports: &[443],
            credentials: None,
        };
        let text = tinyproxy_config(
            &record(),
            Path::new("/state/proxy-abc"),
            Some(("nobody", "nogroup")),
            &open,
        );
        for line in [
            "Listen 127.9.8.7",
            "Bind 127.9.8.7",
            "Port 3128",
            "LogFile \"/state/proxy-abc/tinyproxy.log\"",
            "User nobody",
            "Group nogroup",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(text.lines().any(|l| l == "ConnectPort 443"), "{text}");
        assert!(!text.contains("Allow") && !text.contains("BasicAuth"));
        assert!(!tinyproxy_config(&record(), Path::new("/s"), None, &open).contains("User"));
    }

    #[test]
    fn tinyproxy_config_takes_the_credentials_and_each_port() {
        let c = egress_provider::Credentials::new("u1", "pw2").unwrap();
        let rules = Rules {
            connect_ports: &[443, 8443],
            credentials: Some(&c),
        };
        let text = tinyproxy_config(&record(), Path::new("/s"), None, &rules);
        for line in ["ConnectPort 443", "ConnectPort 8443", "BasicAuth u1 pw2"] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
