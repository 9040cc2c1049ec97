//! The clients config file (`--discovery-clients-config`): per-client overrides of the default
//! budget, and client scopes. Followed while the manager runs; a file that cannot be used keeps
//! the budgets and scopes in force (the caller logs why).
//!
//! ```yaml
//! clients:
//!   team-a:              # a client name: its token file's name
//!     requestsPerSecond: 200
//!     burst: 400         # omitted: twice requestsPerSecond when that is given, else the default
//!     concurrency: 16
//!     scope:             # omitted: every proxy the operator serves
//!       namespaces: [crawlers]   # omitted: every namespace the operator serves
//!       pools: [eu-pool]         # omitted: any proxy of those namespaces; given: only members
//!                                # of these pools (in those namespaces)
//!   crawler-b: {}        # every field omitted: the defaults, every proxy
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

use crate::admission::{Budget, Budgets};
use crate::auth::{ClientName, MAX_CLIENTS};
use crate::scope::{ClientScope, ScopeTable};

/// The largest clients config file read.
pub const MAX_FILE_BYTES: usize = 64 * 1024;
/// The largest value of `requestsPerSecond` and `burst` (as the flags take them).
const MAX_RATE: u32 = 1_000_000;
/// The largest value of `concurrency`.
const MAX_CONCURRENCY: u32 = 1024;

/// What a clients config file gives: every client's budget, and the scopes of the clients
/// that have one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientsFile {
    pub budgets: Budgets,
    pub scopes: ScopeTable,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    clients: Option<BTreeMap<String, Option<Entry>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    requests_per_second: Option<u32>,
    burst: Option<u32>,
    concurrency: Option<u32>,
    /// Outer `None`: left out; `Some(None)`: written with nothing under it.
    #[serde(default, deserialize_with = "present")]
    scope: Option<Option<ScopeEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScopeEntry {
    #[serde(default, deserialize_with = "present")]
    namespaces: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    pools: Option<Option<Vec<String>>>,
}

/// A field that is present, even as `null`: told apart from one left out (`#[serde(default)]`
/// gives `None` for that), so that a key written with nothing under it is an error rather than
/// "everything".
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// The budgets and scopes a clients config file's text gives, budgets on top of `default`. An
/// empty file gives every client the default budget and no scope.
///
/// # Errors
/// Why the text cannot be used: invalid YAML, an unknown key, a name that is not a client
/// name, a value out of range, too many clients, a scope that is not one (see
/// [`ClientScope::new`]) or one given to the client `default`. Never quotes more than names and
/// numbers.
pub fn parse_clients_config(text: &str, default: Budget) -> Result<ClientsFile, String> {
    if text.len() > MAX_FILE_BYTES {
        return Err(format!("the file is over {MAX_FILE_BYTES} bytes"));
    }
    let entries = entries(text)?;
    if entries.len() > MAX_CLIENTS {
        return Err(format!(
            "{} clients are named; at most {MAX_CLIENTS} may be",
            entries.len()
        ));
    }
    let mut clients = BTreeMap::new();
    let mut scopes = ScopeTable::new();
    for (name, entry) in entries {
        if ClientName::parse(&name).is_none() {
            return Err(format!(
                "{name:?} is not a client name (a DNS label: 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
            ));
        }
        let entry = entry.unwrap_or_default();
        let in_client = |e: String| format!("client {name:?}: {e}");
        clients.insert(name.clone(), budget(&entry, default).map_err(in_client)?);
        if let Some(scope) = scope(&name, entry.scope).map_err(in_client)? {
            scopes.insert(name, Arc::new(scope));
        }
    }
    Ok(ClientsFile {
        budgets: Budgets { default, clients },
        scopes,
    })
}

/// The file's entries by client name, as written.
fn entries(text: &str) -> Result<BTreeMap<String, Option<Entry>>, String> {
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        with_snippet: false,
        strict_booleans: true,
    };
    let file: Option<File> = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let rendered = e.render_with_options(serde_saphyr::render_options! {
            formatter: &serde_saphyr::UserMessageFormatter,
            snippets: serde_saphyr::SnippetMode::Off,
        });
        format!("invalid YAML: {rendered}")
    })?;
    Ok(file.and_then(|f| f.clients).unwrap_or_default())
}

/// The scope of the client `name`, if the entry gives one.
fn scope(name: &str, written: Option<Option<ScopeEntry>>) -> Result<Option<ClientScope>, String> {
    let Some(written) = written else {
        return Ok(None);
    };
    if name == ClientName::DEFAULT {
        // Every caller is `default` with authentication off, and it is the install's own
        // client: it sees every proxy.
        return Err(
            "the client default has no scope: it sees every proxy (give a team a client of its own)".to_owned(),
        );
    }
    let entry = written.ok_or("scope is given with nothing under it (leave it out for every proxy)")?;
    let list = |field: &str, l: Option<Option<Vec<String>>>| match l {
        Some(None) => Err(format!(
            "scope.{field} is given with nothing under it (list some, or leave it out for every one)"
        )),
        Some(Some(names)) => Ok(Some(names)),
        None => Ok(None),
    };
    let namespaces = list("namespaces", entry.namespaces)?;
    let pools = list("pools", entry.pools)?;
    ClientScope::new(namespaces, pools).map(Some)
}

/// One entry's budget, its omitted fields taken from `default`.
fn budget(entry: &Entry, default: Budget) -> Result<Budget, String> {
    let within = |field: &str, value: Option<u32>, max: u32| match value {
        Some(v) if v == 0 || v > max => Err(format!("{field} must be between 1 and {max} (got {v})")),
        _ => Ok(value),
    };
    let rate = within("requestsPerSecond", entry.requests_per_second, MAX_RATE)?;
    let burst = within("burst", entry.burst, MAX_RATE)?;
    let concurrency = within("concurrency", entry.concurrency, MAX_CONCURRENCY)?;
    Ok(Budget {
        requests_per_second: rate.unwrap_or(default.requests_per_second),
        // A client given a rate of its own and no burst gets a burst in proportion to it,
        // not the default's (which may be far larger).
        burst: burst
            .or(rate.map(|r| r.saturating_mul(2).min(MAX_RATE)))
            .unwrap_or(default.burst),
        concurrency: concurrency.unwrap_or(default.concurrency),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: Budget = Budget {
        requests_per_second: 1000,
        burst: 2000,
        concurrency: 32,
    };

    #[test]
    fn a_file_overrides_the_fields_it_gives() {
        let text = "clients:\n  team-a:\n    requestsPerSecond: 200\n    concurrency: 4\n  crawler-b: {}\n  bare:\n  burst-only:\n    burst: 10\n";
        let ClientsFile { budgets, scopes } = parse_clients_config(text, DEFAULT).unwrap();
        assert!(scopes.is_empty(), "nobody is scoped unless the file says so");
        assert_eq!(
            budgets.of("team-a"),
            Budget {
                requests_per_second: 200,
                burst: 400,
                concurrency: 4
            }
        );
        assert_eq!(budgets.of("crawler-b"), DEFAULT);
        assert_eq!(budgets.of("bare"), DEFAULT);
        assert_eq!(budgets.of("burst-only").burst, 10);
        assert_eq!(budgets.of("unnamed"), DEFAULT);
    }

    #[test]
    fn an_empty_file_gives_everyone_the_default() {
        for text in ["", "# nothing yet\n", "clients:\n", "clients: {}\n"] {
            assert_eq!(
                parse_clients_config(text, DEFAULT),
                Ok(ClientsFile {
                    budgets: Budgets::uniform(DEFAULT),
                    scopes: ScopeTable::new()
                }),
                "{text:?}"
            );
        }
    }

    #[test]
    fn bad_files_are_refused_with_what_is_wrong() {
        let refused = |text: &str| parse_clients_config(text, DEFAULT).unwrap_err();
        assert!(refused("clients: [a, b]\n").starts_with("invalid YAML"));
        assert!(
            refused("client:\n  a: {}\n").contains("client"),
            "an unknown top-level key"
        );
        assert!(
            refused("clients:\n  a:\n    rate: 5\n").contains("rate"),
            "an unknown field"
        );
        assert!(refused("clients:\n  Team_A: {}\n").contains("not a client name"));
        assert!(refused("clients:\n  a:\n    concurrency: 0\n").contains("concurrency must be between 1 and 1024"));
        assert!(refused("clients:\n  a:\n    burst: 2000000\n").contains("burst must be between"));
        assert!(refused("clients:\n  a:\n    requestsPerSecond: -1\n").starts_with("invalid YAML"));
        assert!(
            refused("clients:\n  a: {}\n  a: {}\n").starts_with("invalid YAML"),
            "a name twice"
        );
        let many: String = (0..=MAX_CLIENTS).map(|i| format!("  c{i}: {{}}\n")).collect();
        assert!(refused(&format!("clients:\n{many}")).contains("at most 64"));
        assert!(refused(&"#".repeat(MAX_FILE_BYTES + 1)).contains("over"));
    }

    fn scopes(text: &str) -> Result<ScopeTable, String> {
        parse_clients_config(text, DEFAULT).map(|f| f.scopes)
    }

    #[test]
    fn a_client_s_scope_is_read_beside_its_budget() {
        let text = "clients:\n  team-a:\n    requestsPerSecond: 200\n    scope:\n      namespaces: [crawlers]\n      pools: [eu-pool, us.pool]\n  team-b:\n    scope:\n      pools: [eu-pool]\n  team-c:\n    scope: {namespaces: [team-c]}\n  team-d: {}\n";
        let file = parse_clients_config(text, DEFAULT).unwrap();
        assert_eq!(file.budgets.of("team-a").requests_per_second, 200);
        let names = |list: &[&str]| Some(list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>());
        let expected = [
            (
                "team-a",
                ClientScope::new(names(&["crawlers"]), names(&["us.pool", "eu-pool"])),
            ),
            ("team-b", ClientScope::new(None, names(&["eu-pool"]))),
            ("team-c", ClientScope::new(names(&["team-c"]), None)),
        ];
        let expected: ScopeTable = expected
            .into_iter()
            .map(|(n, s)| (n.to_owned(), Arc::new(s.unwrap())))
            .collect();
        assert_eq!(file.scopes, expected, "team-d has none");
    }

    #[test]
    fn a_scope_that_narrows_nothing_or_is_not_one_is_refused_naming_the_client() {
        let refused = |scope: &str| scopes(&format!("clients:\n  team-a:\n    scope:{scope}\n")).unwrap_err();
        let cases = [
            ("", "scope is given with nothing under it"),
            (" {}", "scope lists neither namespaces nor pools"),
            ("\n      namespaces: []", "scope.namespaces is empty"),
            ("\n      namespaces:", "scope.namespaces is given with nothing under it"),
            ("\n      pools: []", "scope.pools is empty"),
            (
                "\n      pools: ~\n      namespaces: [a]",
                "scope.pools is given with nothing under it",
            ),
            ("\n      namespaces: [Crawlers]", "is not a namespace name"),
            ("\n      pools: [eu_pool]", "is not a pool name"),
            ("\n      pools: [a, a]", "lists \"a\" twice"),
            ("\n      namespace: [a]", "namespace"),
        ];
        for (scope, why) in cases {
            let message = refused(scope);
            assert!(message.contains(why), "{scope:?}: {message}");
            let named = message.starts_with("client \"team-a\": ") || message.starts_with("invalid YAML");
            assert!(named, "{scope:?}: {message}");
        }
        assert!(refused("\n      namespaces: [a]\n      other: 1").starts_with("invalid YAML"));
        let many: Vec<String> = (0..=crate::scope::MAX_NAMESPACES).map(|i| format!("n{i}")).collect();
        let message = refused(&format!(" {{namespaces: [{}]}}", many.join(", ")));
        assert!(message.contains("at most 32"), "{message}");
    }

    #[test]
    fn the_default_client_has_no_scope() {
        let message = scopes("clients:\n  default:\n    scope: {pools: [eu]}\n").unwrap_err();
        assert!(message.starts_with("client \"default\": "), "{message}");
        assert!(message.contains("sees every proxy"), "{message}");
        let file = parse_clients_config("clients:\n  default:\n    concurrency: 2\n", DEFAULT).unwrap();
        assert_eq!(file.budgets.of("default").concurrency, 2, "a budget it may have");
    }
}
