//! Who may call the API: bearer tokens, one or more at a time (so a rotation can overlap), that
//! the operator replaces while it serves. Compared in constant time; never shown in a `Debug`,
//! a log or an error.

use std::sync::{Arc, RwLock};

/// The most tokens one set holds, and the longest token: a token file is bounded input.
pub const MAX_TOKENS: usize = 16;
pub const MAX_TOKEN_BYTES: usize = 4096;

/// How requests to the API are authenticated.
#[derive(Clone)]
pub enum Auth {
    /// Every request is served (`--discovery-auth=none`).
    None,
    /// A request to any route but `GET /healthz` needs `Authorization: Bearer <token>` with one
    /// of the set's tokens. An empty set refuses everything: the API never falls open.
    Tokens(Arc<TokenSet>),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("Auth::None"),
            Self::Tokens(set) => write!(f, "Auth::Tokens({} tokens)", set.len()),
        }
    }
}

impl Auth {
    /// Whether a request with this `Authorization` header may be served.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        match self {
            Self::None => true,
            Self::Tokens(set) => authorization
                .and_then(|h| h.strip_prefix(b"Bearer "))
                .is_some_and(|given| set.accepts(given)),
        }
    }
}

/// The tokens in force, replaced whole when their source changes.
#[derive(Default)]
pub struct TokenSet {
    tokens: RwLock<Arc<Vec<Vec<u8>>>>,
}

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenSet({} tokens)", self.len())
    }
}

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

/// Constant-time comparison of two tokens (the length is not secret).
fn same_token(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

impl TokenSet {
    /// A set holding `tokens`.
    pub fn new(tokens: Vec<String>) -> Self {
        let set = Self::default();
        set.replace(tokens);
        set
    }

    /// Puts `tokens` in force, in place of the ones before.
    pub fn replace(&self, tokens: Vec<String>) {
        let tokens: Vec<Vec<u8>> = tokens.into_iter().map(String::into_bytes).collect();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
    }

    /// Puts `tokens` in force only if none is (checked and replaced under one lock, so tokens
    /// another task just put in force stay).
    pub fn replace_if_empty(&self, tokens: Vec<String>) {
        let mut current = self.tokens.write().unwrap_or_else(|p| p.into_inner());
        if current.is_empty() {
            *current = Arc::new(tokens.into_iter().map(String::into_bytes).collect());
        }
    }

    /// How many tokens are in force.
    pub fn len(&self) -> usize {
        self.current().len()
    }

    /// Whether no token is in force (every request is refused).
    pub fn is_empty(&self) -> bool {
        self.current().is_empty()
    }

    fn current(&self) -> Arc<Vec<Vec<u8>>> {
        self.tokens.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether `given` is one of the tokens. Every token is compared, whichever matches.
    pub fn accepts(&self, given: &[u8]) -> bool {
        self.current()
            .iter()
            .fold(false, |found, token| found | same_token(given, token))
    }

    /// Whether the set holds exactly `tokens` (a reload that changes nothing is not logged).
    pub fn holds(&self, tokens: &[String]) -> bool {
        let current = self.current();
        current.len() == tokens.len() && current.iter().zip(tokens).all(|(a, b)| a.as_slice() == b.as_bytes())
    }
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

/// The tokens in force for what the file gave and the fixed ones (`DISCOVERY_TOKEN`): the file's
/// first, then the fixed ones it lacks. `None` when the file gives none: the tokens in force
/// stay, so a file that goes away or goes empty never leaves the API open or shut by surprise.
pub fn tokens_in_force(file: &FileTokens, fixed: &[String]) -> Option<Vec<String>> {
    let FileTokens::Tokens(from_file) = file else {
        return None;
    };
    if from_file.is_empty() {
        return None;
    }
    let mut all = from_file.clone();
    all.extend(fixed.iter().filter(|t| !from_file.contains(t)).cloned());
    Some(all)
}

/// Keeps `set` in step with the token file at `path`, read every `every` until `shutdown`: a
/// rotation of the Secret reaches the API without a restart. Changes are logged by count, never
/// by token.
pub async fn follow_token_file(
    path: std::path::PathBuf,
    fixed: Vec<String>,
    set: Arc<TokenSet>,
    every: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut last_problem: Option<String> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let file = read_token_file(&path).await;
        match &file {
            FileTokens::Unusable(why) if last_problem.as_deref() != Some(why) => {
                tracing::warn!(target: "discovery", problem = %why, "the discovery token file cannot be used; the tokens in force stay");
                last_problem = Some(why.clone());
            }
            FileTokens::Unusable(_) => {}
            _ => last_problem = None,
        }
        if let Some(tokens) = tokens_in_force(&file, &fixed)
            && !set.holds(&tokens)
        {
            set.replace(tokens);
            tracing::info!(target: "discovery", tokens = set.len(), path = %path.display(), "discovery tokens reloaded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token(b"secret", b"secret"));
        assert!(!same_token(b"secreT", b"secret"));
        assert!(!same_token(b"secret2", b"secret"));
        assert!(!same_token(b"", b"secret"));
    }

    #[test]
    fn any_token_of_the_set_is_accepted_and_an_empty_set_accepts_nothing() {
        let set = Arc::new(TokenSet::new(vec!["old-token".into(), "new-token".into()]));
        let auth = Auth::Tokens(set.clone());
        assert!(auth.allows(Some(b"Bearer old-token")));
        assert!(auth.allows(Some(b"Bearer new-token")));
        assert!(!auth.allows(Some(b"Bearer other")));
        assert!(!auth.allows(Some(b"bearer new-token")));
        assert!(!auth.allows(Some(b"new-token")));
        assert!(!auth.allows(None));
        set.replace(vec!["new-token".into()]);
        assert!(!auth.allows(Some(b"Bearer old-token")));
        set.replace(Vec::new());
        assert!(!auth.allows(Some(b"Bearer new-token")));
        assert!(!auth.allows(Some(b"Bearer ")));
        assert!(Auth::None.allows(None));
    }

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

    #[test]
    fn the_file_s_tokens_come_first_and_an_empty_or_missing_file_changes_nothing() {
        let fixed = vec!["env-token".to_owned()];
        assert_eq!(
            tokens_in_force(&FileTokens::Tokens(vec!["f1".into(), "env-token".into()]), &fixed),
            Some(vec!["f1".to_owned(), "env-token".to_owned()])
        );
        assert_eq!(
            tokens_in_force(&FileTokens::Tokens(vec!["f1".into()]), &fixed),
            Some(vec!["f1".to_owned(), "env-token".to_owned()])
        );
        assert_eq!(tokens_in_force(&FileTokens::Tokens(Vec::new()), &fixed), None);
        assert_eq!(tokens_in_force(&FileTokens::Missing, &fixed), None);
        assert_eq!(tokens_in_force(&FileTokens::Unusable("x".into()), &fixed), None);
    }

    #[test]
    fn nothing_shows_a_token() {
        let set = Arc::new(TokenSet::new(vec!["sentinel-token-value".into()]));
        let shown = format!("{set:?} {:?}", Auth::Tokens(set.clone()));
        assert!(!shown.contains("sentinel"), "{shown}");
        assert!(set.holds(&["sentinel-token-value".to_owned()]));
    }
}
