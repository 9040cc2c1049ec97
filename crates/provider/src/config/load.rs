//! Reading and strictly parsing the file.
//!
//! Parsing happens in two steps so each problem gets the best message:
//!
//! 1. YAML text to a generic tree (`serde_json::Value`) with serde-saphyr:
//!    syntax errors and duplicate keys are reported there, with line and
//!    column, and its alias and size budgets stay on.
//! 2. The tree to the model, one entry at a time through
//!    `serde_path_to_error`, so an unknown key or a wrongly typed value names
//!    the entry and the path inside it (`providers[2] "kvm-home": kvm.hosts[0]: ...`).
//!    The tree is read with the Go operator's rules (`egress-go-decode`), so
//!    every file it loaded still loads: keys match fields without regard to
//!    case, `yes`/`no`/`on`/`off` are booleans in boolean fields (and text
//!    everywhere else), and a number in a string field is its text.
//!
//! As in Go, an empty file, `{}`, `providers:` and `providers: []` all mean
//! no providers (a warning, not an error), and an entry name that is not a
//! DNS-1123 label is a warning too.
//!
//! Then [`validate`](super::validate) applies the per-entry rules.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_saphyr::{DuplicateKeyPolicy, SnippetMode, UserMessageFormatter};

use super::validate::{entry_prefix, go_quote, validate_entries};
use super::{MAX_CREATES_PER_MINUTE, ProviderConfig, ProvidersConfig};
use crate::Registry;

/// The largest file [`ProvidersConfig::load`] reads (1 MiB). A providers
/// file is a few kilobytes; anything near a mebibyte is a mistake (wrong
/// path, a binary), and refusing it bounds the memory spent on it.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// A problem with the providers config file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    /// The file (or source name) the problem is in.
    pub file: String,
    /// One line naming the entry and the field.
    pub message: String,
}

/// A parsed and validated config, with the warnings worth logging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The validated config.
    pub config: ProvidersConfig,
    /// Problems that do not stop the process (e.g. no provider configured).
    pub warnings: Vec<String>,
}

impl ProvidersConfig {
    /// Parses and validates the text of a providers file. `file` only names
    /// the source in messages; `registry` supplies the accepted types and
    /// their block validators.
    ///
    /// # Errors
    /// The first problem found, as one line.
    pub fn parse(text: &str, file: &str, registry: &Registry) -> Result<Loaded, ConfigError> {
        let fail = |message: String| ConfigError {
            file: file.to_owned(),
            message: one_line(&message),
        };
        let entries = top_level_entries(text).map_err(fail)?;
        // Like the original, every entry is decoded before any is validated:
        // shape problems anywhere come before rule violations.
        let providers = entries
            .iter()
            .enumerate()
            .map(|(i, value)| decode_entry(i, value, registry))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let mut warnings = validate_entries(&providers, registry).map_err(fail)?;
        if providers.is_empty() {
            // Accepted on purpose: Proxies in External mode need no provider.
            warnings.push("no providers are configured; only External proxies can be used".to_owned());
        }
        Ok(Loaded {
            config: ProvidersConfig { providers },
            warnings,
        })
    }

    /// Reads, parses and validates the providers file at `path`, logging
    /// each warning.
    ///
    /// # Errors
    /// An unreadable file, a file over 1 MiB, or the first
    /// problem [`ProvidersConfig::parse`] finds.
    pub fn load(path: &Path, registry: &Registry) -> Result<ProvidersConfig, ConfigError> {
        let file = path.display().to_string();
        let text = read_capped(path).map_err(|message| ConfigError {
            file: file.clone(),
            message,
        })?;
        let loaded = Self::parse(&text, &file, registry)?;
        for warning in &loaded.warnings {
            tracing::warn!(file = %file, "{warning}");
        }
        Ok(loaded.config)
    }
}

/// Reads the file with the one bounded read ([`egress_files::read_regular_file`]): at most
/// [`MAX_FILE_BYTES`], so a huge file is never buffered whole, and only a regular file, so a pipe
/// at the path (which would hang the start until something wrote to it) or a directory is
/// refused at once.
fn read_capped(path: &Path) -> Result<String, String> {
    let bytes = egress_files::read_regular_file(path, MAX_FILE_BYTES).map_err(|e| match e.problem {
        egress_files::Problem::TooLarge { .. } => {
            format!("the file is larger than the {MAX_FILE_BYTES}-byte (1 MiB) limit for a providers config")
        }
        problem => format!("cannot read the providers config: {problem}"),
    })?;
    String::from_utf8(bytes).map_err(|e| format!("the file is not valid UTF-8: {e}"))
}

/// Parses the YAML and returns the `providers` list, checking the top level
/// by hand so its messages say what is expected rather than quoting a Rust
/// type name.
fn top_level_entries(text: &str) -> Result<Vec<Value>, String> {
    let options = serde_saphyr::options! {
        // The default already, but strictness is the point: say it.
        duplicate_keys: DuplicateKeyPolicy::Error,
        // Snippets are multi-line; we want one line with line and column.
        with_snippet: false,
        // Only `true`/`false` are booleans (YAML 1.2). Step 1 infers types
        // without knowing the model, so with YAML 1.1 rules a host named
        // `no` or `on` would turn into a boolean and be refused as a name.
        strict_booleans: true,
    };
    let doc: Value = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let rendered = e.render_with_options(serde_saphyr::render_options! {
            formatter: &UserMessageFormatter,
            snippets: SnippetMode::Off,
        });
        format!("invalid YAML: {rendered}")
    })?;

    let map = match doc {
        // An empty file, only comments, or a lone `null`: no providers, as Go read it.
        Value::Null => return Ok(Vec::new()),
        Value::Object(map) => map,
        other => {
            return Err(format!(
                "the top level must be a mapping with a `providers` list (got {})",
                kind(&other)
            ));
        }
    };
    // The key in any case, as Go's decoder matched it.
    if let Some(key) = map.keys().find(|k| !k.eq_ignore_ascii_case("providers")) {
        return Err(format!(
            "unknown top-level key {}; only `providers` is allowed",
            go_quote(key)
        ));
    }
    if map.len() > 1 {
        return Err("`providers` is given more than once (in different cases); keep one".to_owned());
    }
    match map.into_iter().next().map(|(_, v)| v) {
        // No `providers` key, or `providers:` with every entry commented out: an empty list.
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(entries)) => Ok(entries),
        Some(other) => Err(format!("`providers` must be a list of entries (got {})", kind(&other))),
    }
}

/// Decodes one list element into an entry, naming the entry and the path
/// inside it on failure.
///
/// The keys an entry may have are `name`, `type`, `createsPerMinute` and the
/// block key of each registered type that has a block; they match without regard to case, and
/// a key given `null` is as good as absent, as in Go. Each block's shape is
/// checked here by its type (so every shape problem, in any entry, comes
/// before any rule); the block itself is kept undecoded.
fn decode_entry(index: usize, value: &Value, registry: &Registry) -> Result<ProviderConfig, String> {
    let name = value
        .as_object()
        .and_then(|m| m.iter().find(|(k, _)| k.eq_ignore_ascii_case("name")))
        .and_then(|(_, v)| v.as_str());
    let prefix = match name {
        Some(name) => entry_prefix(index, name),
        None => format!("providers[{index}]"),
    };
    let Some(map) = value.as_object() else {
        return Err(format!(
            "{prefix}: an entry must be a mapping with `name` and `type` (got {})",
            kind(value)
        ));
    };
    let mut fields = vec!["name", "type", CREATES_PER_MINUTE];
    fields.extend(registry.block_keys());
    let mut entry = ProviderConfig::default();
    let mut seen = Vec::new();
    // serde_json's map is sorted, so with several bad keys the first in sorted order is named.
    for (key, value) in map.iter().filter(|(_, v)| !v.is_null()) {
        let Some(field) = field_for(key, &fields) else {
            return Err(format!("{prefix}: {key}: unknown field `{key}`, {}", expected(&fields)));
        };
        if seen.contains(&field) {
            return Err(format!("{prefix}: duplicate field `{field}`"));
        }
        seen.push(field);
        let at = |(path, message): (String, String)| format!("{prefix}: {field}{path}: {message}");
        match field {
            "name" => entry.name = decode_block(value).map_err(at)?,
            "type" => entry.type_name = decode_block(value).map_err(at)?,
            CREATES_PER_MINUTE => {
                entry.creates_per_minute =
                    Some(creates_per_minute(value).map_err(|m| format!("{prefix}: {field}: {m}"))?);
            }
            block => {
                if let Some(shape) = registry.get(block).and_then(|t| t.shape()) {
                    shape(value).map_err(at)?;
                }
                entry.blocks.insert(block.to_owned(), value.clone());
            }
        }
    }
    Ok(entry)
}

/// The entry key of the create budget (beside `name` and `type`: it is the
/// operator's rule for the entry, whatever its type).
const CREATES_PER_MINUTE: &str = "createsPerMinute";

/// `createsPerMinute`: a whole number from 1 to [`MAX_CREATES_PER_MINUTE`],
/// read by the Go operator's rules as every number of the file is. Its range
/// is checked here, with its shape, because the model keeps a `u32`: 0 would
/// let no Proxy of the entry be created ever, and a negative is no count.
fn creates_per_minute(value: &Value) -> Result<u32, String> {
    let refused = || {
        format!(
            "must be a whole number from 1 to {MAX_CREATES_PER_MINUTE} (got {})",
            one_line(&value.to_string())
        )
    };
    let n: i64 = decode_block(value).map_err(|_| refused())?;
    u32::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_CREATES_PER_MINUTE).contains(n))
        .ok_or_else(refused)
}

/// Decodes one value of the file as `T` by the Go operator's rules. On
/// failure, the path inside the value (empty, or starting with `.` or `[`)
/// and the problem.
pub(crate) fn decode_block<T: DeserializeOwned>(value: &Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(egress_go_decode::GoValue::new(value, egress_go_decode::Rules::Yaml)).map_err(
        |e| {
            let path = e.path().to_string();
            let message = readable_serde_message(&e.inner().to_string());
            let path = match path.as_str() {
                "." => String::new(),
                p if p.starts_with('[') => p.to_owned(),
                p => format!(".{p}"),
            };
            (path, message)
        },
    )
}

/// The field `key` fills: the one of that exact name, else the first that
/// differs only in ASCII case (the rule `egress-go-decode` applies inside blocks).
fn field_for<'f>(key: &str, fields: &[&'f str]) -> Option<&'f str> {
    fields
        .iter()
        .find(|f| **f == key)
        .or_else(|| fields.iter().find(|f| f.eq_ignore_ascii_case(key)))
        .copied()
}

/// serde's wording for the keys a mapping may have, so an entry's unknown key
/// reads as a block's does.
fn expected(fields: &[&str]) -> String {
    let quoted: Vec<String> = fields.iter().map(|f| format!("`{f}`")).collect();
    match quoted.as_slice() {
        [] => "there are no fields".to_owned(),
        [one] => format!("expected {one}"),
        [a, b] => format!("expected {a} or {b}"),
        all => format!("expected one of {}", all.join(", ")),
    }
}

/// serde names the Rust struct it expected (`expected struct KvmHost`);
/// users wrote YAML, so say "a mapping" instead.
fn readable_serde_message(message: &str) -> String {
    match message.split_once(", expected struct ") {
        Some((head, _)) => format!("{head}, expected a mapping"),
        None => message.to_owned(),
    }
}

/// What a YAML value is, in words, for "got ..." messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Collapses line breaks (and the indentation after them) into single
/// spaces: a config error is one log line.
fn one_line(message: &str) -> String {
    if !message.contains(['\n', '\r']) {
        return message.to_owned();
    }
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_collapses_breaks() {
        assert_eq!(one_line("a\n   b\r\n\nc"), "a b c");
        assert_eq!(one_line("plain  text"), "plain  text");
    }

    #[test]
    fn expected_keys_read_as_serde_words_them() {
        assert_eq!(expected(&["a"]), "expected `a`");
        assert_eq!(expected(&["a", "b"]), "expected `a` or `b`");
        assert_eq!(expected(&["a", "b", "c"]), "expected one of `a`, `b`, `c`");
    }

    #[test]
    fn exact_keys_win_over_folded_ones() {
        assert_eq!(field_for("Name", &["name", "type"]), Some("name"));
        assert_eq!(field_for("kvm2", &["kvm", "kvm2"]), Some("kvm2"));
        assert_eq!(field_for("KVM2", &["kvm", "kvm2"]), Some("kvm2"));
        assert_eq!(field_for("region", &["name"]), None);
    }

    #[test]
    fn struct_names_become_mapping() {
        assert_eq!(
            readable_serde_message(r#"invalid type: string "x", expected struct GcpConfig"#),
            r#"invalid type: string "x", expected a mapping"#
        );
        assert_eq!(readable_serde_message("missing field `x`"), "missing field `x`");
    }
}
