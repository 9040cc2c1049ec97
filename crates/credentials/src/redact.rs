//! Credentials that text tends to echo, masked: for error text from a backend, a flag's value
//! in an error line, anything that may carry a secret someone did not mean to show.

/// Query parameters whose values are credentials.
const SECRET_PARAMS: [&str; 9] = [
    "access_token",
    "token",
    "key",
    "api_key",
    "apikey",
    "password",
    "secret",
    "sig",
    "signature",
];

/// Replaces credentials that backend error text tends to echo with
/// `[REDACTED]`: `Authorization:` header values, `Bearer`/`Basic` tokens,
/// secret-looking query parameters and `user:password@` in URLs.
///
/// Use it on any backend message before it becomes a cause; it does not
/// know your secrets, so never put a credential in a message on purpose.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((pos, skip_to)) = next_secret(rest) {
        out.push_str(&rest[..pos]);
        out.push_str("[REDACTED]");
        rest = &rest[skip_to..];
    }
    out.push_str(rest);
    out
}

/// The next secret value in `s`: (start of value, end of value).
fn next_secret(s: &str) -> Option<(usize, usize)> {
    let lower = s.to_ascii_lowercase();
    let mut best: Option<(usize, usize)> = None;
    let mut consider = |start: usize, end: usize| {
        if end > start && best.is_none_or(|(b, _)| start < b) {
            best = Some((start, end));
        }
    };
    let value_end = |from: usize, stop: &dyn Fn(char) -> bool| s[from..].find(stop).map_or(s.len(), |i| from + i);
    for scheme in ["bearer ", "basic "] {
        if let Some(i) = lower.find(scheme) {
            let start = i + scheme.len();
            consider(
                start,
                value_end(start, &|c: char| c.is_whitespace() || c == '"' || c == '\''),
            );
        }
    }
    if let Some(i) = lower.find("authorization:") {
        let mut start = i + "authorization:".len();
        start += s[start..].len() - s[start..].trim_start().len();
        // The scheme word (Bearer/Basic) is handled above; redact the rest otherwise.
        let tail = &lower[start..];
        if !tail.starts_with("bearer ") && !tail.starts_with("basic ") {
            consider(start, value_end(start, &|c: char| c == '\n' || c == '"'));
        }
    }
    for param in SECRET_PARAMS {
        let mut from = 0;
        while let Some(i) = lower[from..].find(&format!("{param}=")) {
            let at = from + i;
            let boundary = at == 0 || matches!(lower.as_bytes()[at - 1], b'?' | b'&' | b' ' | b';' | b'"' | b'\'');
            let start = at + param.len() + 1;
            if boundary {
                consider(
                    start,
                    value_end(start, &|c: char| matches!(c, '&' | ' ' | '"' | '\'' | '\n' | ';' | '#')),
                );
                break;
            }
            from = start;
        }
    }
    if let Some(i) = lower.find("://") {
        let auth_start = i + 3;
        let auth_end = value_end(auth_start, &|c: char| matches!(c, '/' | ' ' | '?' | '#' | '"'));
        if let Some(at) = s[auth_start..auth_end].rfind('@')
            && let Some(colon) = s[auth_start..auth_start + at].find(':')
        {
            consider(auth_start + colon + 1, auth_start + at);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn tokens_in_headers_and_urls_are_removed() {
        let cases = [
            (
                "GET https://api/x?access_token=SENTINEL&alt=json failed",
                "GET https://api/x?access_token=[REDACTED]&alt=json failed",
            ),
            ("Authorization: Bearer SENTINEL", "Authorization: Bearer [REDACTED]"),
            ("authorization: Basic dXNlcjpwYXNz", "authorization: Basic [REDACTED]"),
            ("Authorization: SENTINEL-raw", "Authorization: [REDACTED]"),
            ("https://user:SENTINEL@host/path", "https://user:[REDACTED]@host/path"),
            ("x?key=SENTINEL&token=SENTINEL2", "x?key=[REDACTED]&token=[REDACTED]"),
            ("nothing secret here", "nothing secret here"),
            ("monkey=banana", "monkey=banana"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "input {input:?}");
        }
    }

    #[test]
    fn several_secrets_in_one_text_are_all_removed() {
        let text = "url https://h/?access_token=S1 header Authorization: Bearer S2 and https://u:S3@h";
        let out = redact(text);
        for s in ["S1", "S2", "S3"] {
            assert!(!out.contains(s), "{s} survived in {out}");
        }
    }
}
