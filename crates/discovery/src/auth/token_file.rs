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

/// Reads the token file at `path`, following symlinks (a Secret volume's file is one, through
/// `..data`, which the kubelet swaps whole on an update).
pub async fn read_token_file(path: &std::path::Path) -> FileTokens {
    use tokio::io::AsyncReadExt as _;
    let unreadable = |e: std::io::Error| FileTokens::Unusable(format!("reading {}: {}", path.display(), e.kind()));
    // Opened without waiting (a pipe in the file's place would otherwise hold the open, and
    // every later reload, until something wrote to it), then looked at.
    let file = match tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits().cast_signed())
        .open(path)
        .await
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return FileTokens::Missing,
        Err(e) => return unreadable(e),
    };
    match file.metadata().await {
        Ok(metadata) if metadata.is_file() => {}
        Ok(_) => return FileTokens::Unusable(format!("{} is not a regular file", path.display())),
        Err(e) => return unreadable(e),
    }
    // Read through the cap itself, so a file that grows while it is read stays bounded.
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).await {
        return unreadable(e);
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return FileTokens::Unusable(format!("{} is over {MAX_FILE_BYTES} bytes", path.display()));
    }
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
