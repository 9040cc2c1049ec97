//! Who is asking: a client's proxy credentials, its username (the routing it asks for) and its
//! password (a discovery token, which the gateway only passes on to the discovery API). Nothing
//! is dialled for a request without them.

/// A client's proxy credentials.
#[derive(Clone)]
pub struct ClientAuth {
    pub username: String,
    token: String,
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is the client's secret: never printed.
        f.debug_struct("ClientAuth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl ClientAuth {
    /// Credentials from a username and a password (SOCKS5's sub-negotiation); `None` without a
    /// password.
    pub fn new(username: String, password: String) -> Option<Self> {
        (!password.is_empty()).then_some(Self {
            username,
            token: password,
        })
    }

    /// The credentials of a `Proxy-Authorization: Basic ...` header's value; `None` for any
    /// other scheme, bad base64 or UTF-8, no colon, or an empty password.
    pub fn from_basic(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?.trim();
        let (scheme, encoded) = text.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let decoded = data_encoding::BASE64.decode(encoded.trim().as_bytes()).ok()?;
        let (username, password) = String::from_utf8(decoded)
            .ok()?
            .split_once(':')
            .map(|(u, p)| (u.to_owned(), p.to_owned()))?;
        Self::new(username, password)
    }

    /// The discovery token.
    pub fn token(&self) -> &str {
        &self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user_password: &str) -> Vec<u8> {
        format!("Basic {}", data_encoding::BASE64.encode(user_password.as_bytes())).into_bytes()
    }

    #[test]
    fn basic_credentials_give_the_username_and_the_token() {
        let c = ClientAuth::from_basic(&basic("pool=blue,geo=eu:tok-1")).expect("credentials");
        assert_eq!((c.username.as_str(), c.token()), ("pool=blue,geo=eu", "tok-1"));
        let colon = ClientAuth::from_basic(&basic("any:to:ken")).expect("the first colon splits");
        assert_eq!(colon.token(), "to:ken");
        let lower = format!("basic {}", data_encoding::BASE64.encode(b":tok"));
        assert_eq!(
            ClientAuth::from_basic(lower.as_bytes()).map(|c| c.username),
            Some(String::new())
        );
    }

    #[test]
    fn anything_else_is_no_credentials() {
        for bad in [
            b"Bearer tok".to_vec(),
            b"Basic".to_vec(),
            b"Basic !!!".to_vec(),
            basic("no-colon"),
            basic("user:"),
            b"Basic /w==".to_vec(),
        ] {
            assert!(
                ClientAuth::from_basic(&bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(&bad)
            );
        }
    }

    #[test]
    fn the_token_is_never_printed() {
        let c = ClientAuth::new("any".into(), "tok-sentinel".into()).unwrap();
        assert!(!format!("{c:?}").contains("tok-sentinel"));
    }
}
