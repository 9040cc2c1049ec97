//! Who may call the API, and as which client. A client is a name with up to 16 bearer tokens
//! (more than one at a time, so a rotation can overlap), read from files the operator follows
//! while it serves. A request's token is looked up by its SHA-256 digest; tokens are never shown
//! in a `Debug`, a log or an error.

mod follow;
mod name;
mod table;
mod token_file;

use std::sync::Arc;

pub use follow::{ClientFiles, DEFAULT_REVOKE_GRACE, MAX_CLIENTS};
pub use name::ClientName;
pub(crate) use name::is_dns_label;
pub use table::TokenSet;
pub use token_file::{FileTokens, MAX_TOKEN_BYTES, MAX_TOKENS, TokenError, parse_tokens, read_token_file};

/// How requests to the API are authenticated.
#[derive(Clone)]
pub enum Auth {
    /// Every request is served, as the client `default` (`--discovery-auth=none`).
    None,
    /// A request to any route but `GET /healthz` needs `Authorization: Bearer <token>` with one
    /// of the set's tokens, and is its client's. An empty set refuses everything: the API never
    /// falls open.
    Tokens(Arc<TokenSet>),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("Auth::None"),
            Self::Tokens(set) => write!(f, "Auth::Tokens({set:?})"),
        }
    }
}

impl Auth {
    /// The client a request with this `Authorization` header is; `None` when it may not be
    /// served.
    pub fn client(&self, authorization: Option<&[u8]>) -> Option<ClientName> {
        match self {
            Self::None => Some(ClientName::default()),
            Self::Tokens(set) => authorization
                .and_then(|h| h.strip_prefix(b"Bearer "))
                .and_then(|given| set.client(given)),
        }
    }

    /// Whether a request with this `Authorization` header may be served.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        self.client(authorization).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let set = Arc::new(TokenSet::new(vec!["new-token".into()]));
        let auth = Auth::Tokens(set);
        assert!(!auth.allows(Some(b"Bearer old-token")));
        let auth = Auth::Tokens(Arc::new(TokenSet::new(Vec::new())));
        assert!(!auth.allows(Some(b"Bearer new-token")));
        assert!(!auth.allows(Some(b"Bearer ")));
        assert!(Auth::None.allows(None));
    }

    #[test]
    fn a_caller_is_the_client_its_token_belongs_to_and_everyone_is_default_without_auth() {
        let auth = Auth::Tokens(Arc::new(TokenSet::new(vec!["t1".into()])));
        assert_eq!(auth.client(Some(b"Bearer t1")), Some(ClientName::default()));
        assert_eq!(auth.client(Some(b"Bearer t2")), None);
        assert_eq!(Auth::None.client(None), Some(ClientName::default()));
        assert_eq!(Auth::None.client(Some(b"Bearer anything")), Some(ClientName::default()));
    }

    #[test]
    fn nothing_shows_a_token() {
        let set = Arc::new(TokenSet::new(vec!["sentinel-token-value".into()]));
        let shown = format!("{set:?} {:?}", Auth::Tokens(set.clone()));
        assert!(!shown.contains("sentinel"), "{shown}");
        assert!(set.client(b"sentinel-token-value").is_some());
    }
}
