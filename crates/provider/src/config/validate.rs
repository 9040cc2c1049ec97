//! Validation rules: the per-entry checks every type shares. Each type's
//! own rules come from the backend crate that registered it.
//!
//! Messages are part of the contract (operators grep logs for them), so they
//! follow providers.md §3.3 and kvm.md §1.2 word for word. Every message is
//! one line; the loader only adds the file name in front.

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
        // Checked in registration order, so the block named is the same on every run.
        if let Some(block) = registry
            .block_keys()
            .find(|b| *b != entry.type_name && entry.blocks.contains_key(*b))
        {
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

    // 5. Entries that share something outside the process (a hypervisor's storage pool) must
    // not get in each other's way.
    for (check, types) in registry.shared_checks() {
        let members: Vec<(usize, &ProviderConfig)> = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| types.contains(&e.type_name.as_str()))
            .collect();
        check(&members).map_err(|(i, tail)| {
            let name = entries.get(i).map_or("", |e| e.name.as_str());
            format!("{}: {tail}", entry_prefix(i, name))
        })?;
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
pub fn go_quote(s: &str) -> String {
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

/// Validators for types registered with [`ProviderType::new`](crate::ProviderType::new), which
/// have no block. A type with a block gets its rules from its [`Block`](super::Block) type.
pub mod validators {
    use crate::config::ProviderConfig;

    /// For types without settings to check.
    ///
    /// # Errors
    /// Never.
    pub fn none(_entry: &ProviderConfig) -> Result<(), String> {
        Ok(())
    }
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
}
