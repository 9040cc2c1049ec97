//! Client names: what a file in the token dir is called, and who a request is.

use std::ffi::OsStr;
use std::fmt;
use std::sync::{Arc, LazyLock};

/// The name of a discovery client: a DNS label (RFC 1123), taken from its file's name in the
/// token dir. `default` is the client of `--discovery-token-file` and `DISCOVERY_TOKEN`, and of
/// every caller when authentication is off. Cloning shares the text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientName(Arc<str>);

/// The longest DNS label.
const MAX_LABEL: usize = 63;

/// Shared, so that a request of the default client allocates nothing.
static DEFAULT: LazyLock<ClientName> = LazyLock::new(|| ClientName(Arc::from(ClientName::DEFAULT)));

impl ClientName {
    /// The default client's name.
    pub const DEFAULT: &'static str = "default";

    /// `name` as a client's name, if it is a DNS label: 1 to 63 of `a-z`, `0-9` and `-`,
    /// starting and ending with a letter or digit.
    pub fn parse(name: &str) -> Option<Self> {
        is_dns_label(name).then(|| Self(Arc::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for ClientName {
    /// The client `default`.
    fn default() -> Self {
        DEFAULT.clone()
    }
}

impl fmt::Display for ClientName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ClientName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientName({:?})", &*self.0)
    }
}

/// Whether `name` is a DNS label (RFC 1123): 1 to 63 of `a-z`, `0-9` and `-`, starting and
/// ending with a letter or digit.
pub(crate) fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    bytes.len() <= MAX_LABEL && edge(bytes.first()) && edge(bytes.last()) && bytes.iter().all(inner)
}

/// What a file in the token dir stands for, by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The kubelet's own entries (`..data`, `..2026_12_01_...`) and any other dot file: not a
    /// client, and nothing to warn about.
    Hidden,
    /// A client of its own, or `default` (whose file adds to the default client's tokens).
    Client(ClientName),
    /// A name no client may have: skipped, with a warning.
    NotALabel,
}

/// What the dir entry called `file_name` is.
pub(crate) fn entry(file_name: &OsStr) -> Entry {
    let Some(name) = file_name.to_str() else {
        return Entry::NotALabel;
    };
    if name.starts_with('.') {
        return Entry::Hidden;
    }
    ClientName::parse(name).map_or(Entry::NotALabel, Entry::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_name_is_a_dns_label() {
        for ok in ["a", "crawler-eu", "team7", "7", "a-b-c", &"x".repeat(63), "default"] {
            assert_eq!(
                ClientName::parse(ok).map(|n| n.to_string()).as_deref(),
                Some(ok),
                "{ok:?}"
            );
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Crawler",
            "crawler_eu",
            "crawler.eu",
            "a b",
            "é",
            "token\n",
            &"x".repeat(64),
        ] {
            assert_eq!(ClientName::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_kubelet_s_entries_are_hidden_and_other_bad_names_are_not_labels() {
        for hidden in ["..data", "..2026_12_01_00_00_01.1001", "..data_tmp", ".hidden"] {
            assert_eq!(entry(OsStr::new(hidden)), Entry::Hidden, "{hidden}");
        }
        assert_eq!(
            entry(OsStr::new("team-a")),
            Entry::Client(ClientName::parse("team-a").unwrap())
        );
        assert_eq!(entry(OsStr::new("default")), Entry::Client(ClientName::default()));
        for bad in ["Team", "team_a", "tokens.txt", "-x"] {
            assert_eq!(entry(OsStr::new(bad)), Entry::NotALabel, "{bad}");
        }
        use std::os::unix::ffi::OsStrExt as _;
        assert_eq!(entry(OsStr::from_bytes(b"te\xffam")), Entry::NotALabel);
    }

    #[test]
    fn the_default_client_is_shared_and_named_default() {
        let (a, b) = (ClientName::default(), ClientName::default());
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a.as_str(), ClientName::DEFAULT);
        assert_eq!(format!("{a:?}"), r#"ClientName("default")"#);
    }
}
