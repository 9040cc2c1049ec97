//! Token files: one token a line, bounded, read without waiting on whatever is in the file's
//! place. The same rules hold for `--discovery-token-file` and every client's file.

/// The most tokens one file holds, and the longest token: a token file is bounded input.
pub const MAX_TOKENS: usize = 16;
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Tokens that cannot be used, and why (never quoting them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("more than {MAX_TOKENS} tokens")]
    TooMany,
    #[error("a token is longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error("a token holds a character a header cannot carry (only visible ASCII is allowed)")]
    NotVisibleAscii,
}

/// The tokens of a token file's text: one per line, surrounding whitespace ignored, blank lines
/// skipped, duplicates kept once.
///
/// # Errors
///
/// Too many tokens, one too long, or one with a character outside visible ASCII.
pub fn parse_tokens(text: &str) -> Result<Vec<String>, TokenError> {
    let mut tokens: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLong);
        }
        if !line.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotVisibleAscii);
        }
        if !tokens.iter().any(|t| t == line) {
            tokens.push(line.to_owned());
        }
        if tokens.len() > MAX_TOKENS {
            return Err(TokenError::TooMany);
        }
    }
    Ok(tokens)
}

/// The largest token file read.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// What a token file gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileTokens {
    /// The file is not there (yet: a Secret volume fills in once the Secret exists).
    Missing,
    /// The file's tokens (none when it is empty).
    Tokens(Vec<String>),
    /// The file cannot be used; the reason never quotes it.
    Unusable(String),
}

/// Reads the token file at `path` with the one bounded read ([`egress_files::read_regular_file`]):
/// symlinks are followed (a Secret volume's file is one, through `..data`, which the kubelet
/// swaps whole on an update), and a pipe or a directory in the file's place is refused without
/// waiting. Blocking.
pub fn read_token_file(path: &std::path::Path) -> FileTokens {
    use egress_files::Problem;
    let bytes = match egress_files::read_regular_file(path, MAX_FILE_BYTES) {
        Ok(bytes) => bytes,
        Err(e) if e.is_not_found() => return FileTokens::Missing,
        Err(e) => {
            return FileTokens::Unusable(match e.problem {
                Problem::NotRegular => format!("{} is not a regular file", path.display()),
                Problem::TooLarge { .. } => format!("{} is over {MAX_FILE_BYTES} bytes", path.display()),
                Problem::Io(e) => format!("reading {}: {}", path.display(), e.kind()),
            });
        }
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return FileTokens::Unusable(format!("{} is not UTF-8 text", path.display()));
    };
    match parse_tokens(&text) {
        Ok(tokens) => FileTokens::Tokens(tokens),
        Err(e) => FileTokens::Unusable(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_are_one_token_a_line_and_bounded() {
        assert_eq!(
            parse_tokens("  a1 \n\nb2\r\na1\n").unwrap(),
            vec!["a1".to_owned(), "b2".to_owned()]
        );
        assert!(parse_tokens("").unwrap().is_empty());
        assert_eq!(parse_tokens("has space"), Err(TokenError::NotVisibleAscii));
        assert_eq!(parse_tokens(&"x".repeat(MAX_TOKEN_BYTES + 1)), Err(TokenError::TooLong));
        let many: String = (0..=MAX_TOKENS).map(|i| format!("t{i}\n")).collect();
        assert_eq!(parse_tokens(&many), Err(TokenError::TooMany));
    }
}
