//! Scrubbing of credentials from backend error text before it is wrapped.

/// `text` with every line of `cloud_init` (and the whole of it, raw or escaped as a quoted
/// string would show it) replaced by `[cloud-init]`: for backend text that may echo what it was
/// sent. Lines under 6 bytes are left: they carry
/// nothing worth hiding and would match ordinary words.
pub fn scrub(text: &str, cloud_init: &[u8]) -> String {
    if cloud_init.is_empty() {
        return text.to_owned();
    }
    let whole = String::from_utf8_lossy(cloud_init);
    let mut out = text.replace(whole.as_ref(), "[cloud-init]");
    let escaped = format!("{whole:?}");
    out = out.replace(escaped.trim_matches('"'), "[cloud-init]");
    let mut lines: Vec<&str> = whole.lines().map(str::trim).filter(|l| l.len() >= 6).collect();
    // Longest first, so a line is not half-replaced through a shorter one inside it.
    lines.sort_by_key(|l| std::cmp::Reverse(l.len()));
    for line in lines {
        out = out.replace(line, "[cloud-init]");
        let escaped = format!("{line:?}");
        out = out.replace(escaped.trim_matches('"'), "[cloud-init]");
    }
    // A backend may quote part of a line (a value after its key): every word of 10 bytes or
    // more goes too. Shorter ones are ordinary words too often to be worth hiding.
    let mut words: Vec<&str> = whole
        .split(|c: char| c.is_whitespace() || "\"'`,:=;()[]{}<>".contains(c))
        .filter(|w| w.len() >= 10)
        .collect();
    words.sort_by_key(|w| std::cmp::Reverse(w.len()));
    words.dedup();
    for word in words {
        out = out.replace(word, "[cloud-init]");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_backend_quoting_part_of_a_cloud_init_line_is_scrubbed() {
        let ci = b"#cloud-config\nchpasswd: {list: 'root:Hunter2-secret-pw'}\n";
        let echoed = "invalid metadata near Hunter2-secret-pw in line 2";
        let out = super::scrub(echoed, ci);
        assert!(!out.contains("Hunter2"), "{out}");
        assert!(out.starts_with("invalid metadata near"), "{out}");
    }
}
