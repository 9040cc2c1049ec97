//! The clients config file (`--discovery-clients-config`): per-client overrides of the default
//! budget. Followed while the manager runs; a file that cannot be used keeps the budgets in
//! force (the caller logs why).
//!
//! ```yaml
//! clients:
//!   team-a:              # a client name: its token file's name
//!     requestsPerSecond: 200
//!     burst: 400         # omitted: twice requestsPerSecond when that is given, else the default
//!     concurrency: 16
//!   crawler-b: {}        # every field omitted: the defaults
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::admission::{Budget, Budgets};
use crate::auth::{ClientName, MAX_CLIENTS};

/// The largest clients config file read.
pub const MAX_FILE_BYTES: usize = 64 * 1024;
/// The largest value of `requestsPerSecond` and `burst` (as the flags take them).
const MAX_RATE: u32 = 1_000_000;
/// The largest value of `concurrency`.
const MAX_CONCURRENCY: u32 = 1024;

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
}

/// The budgets a clients config file's text gives, on top of `default`. An empty file gives
/// every client the default.
///
/// # Errors
/// Why the text cannot be used: invalid YAML, an unknown key, a name that is not a client
/// name, a value out of range, too many clients. Never quotes more than names and numbers.
pub fn parse_clients_config(text: &str, default: Budget) -> Result<Budgets, String> {
    if text.len() > MAX_FILE_BYTES {
        return Err(format!("the file is over {MAX_FILE_BYTES} bytes"));
    }
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
    let entries = file.and_then(|f| f.clients).unwrap_or_default();
    if entries.len() > MAX_CLIENTS {
        return Err(format!(
            "{} clients are named; at most {MAX_CLIENTS} may be",
            entries.len()
        ));
    }
    let mut clients = BTreeMap::new();
    for (name, entry) in entries {
        if ClientName::parse(&name).is_none() {
            return Err(format!(
                "{name:?} is not a client name (a DNS label: 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
            ));
        }
        let budget = budget(&entry.unwrap_or_default(), default).map_err(|e| format!("client {name:?}: {e}"))?;
        clients.insert(name, budget);
    }
    Ok(Budgets { default, clients })
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
        let budgets = parse_clients_config(text, DEFAULT).unwrap();
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
                Ok(Budgets::uniform(DEFAULT)),
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
}
