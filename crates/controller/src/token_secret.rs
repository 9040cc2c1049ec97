//! The discovery API's token when the operator was given none: it makes a random one and keeps it
//! in the Secret `discovery-token` of its own namespace, so an install works as applied and
//! every replica serves with the same token. An existing Secret is used, never overwritten; two
//! replicas starting together agree (the loser of the create reads the winner's token).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};

/// The Secret's name (the Deployment mounts it, optionally, at the token file's directory).
pub const SECRET_NAME: &str = "discovery-token";
/// Its key.
pub const KEY: &str = "token";

/// A token as read or made. Its `Debug` never shows it.
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<not shown>)")
    }
}

/// Where the token came from.
#[derive(Debug)]
pub enum TokenOrigin {
    /// The Secret was there already (made by a person, or by another replica).
    Existing(Token),
    /// This call made it.
    Created(Token),
}

impl TokenOrigin {
    pub fn token(&self) -> &str {
        match self {
            Self::Existing(t) | Self::Created(t) => &t.0,
        }
    }
}

/// Why no token could be had; messages never hold a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenSecretError {
    /// The API server did not answer or refused (retry later).
    #[error("reading or creating Secret {SECRET_NAME}: {0}")]
    Api(String),
    /// The Secret exists without a usable token under `token`: a person's Secret, left as it is.
    #[error(
        "Secret {SECRET_NAME} exists but its key {KEY:?} holds no token (one per line, visible ASCII): fix or delete it"
    )]
    Unusable,
}

/// A new random token: 32 bytes from the OS's generator, as 52 lowercase base32 characters.
pub fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    data_encoding::BASE32_NOPAD.encode(&bytes).to_ascii_lowercase()
}

fn tokens_of(secret: &Secret) -> Result<Token, TokenSecretError> {
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .map(|b| b.0.clone())
        .ok_or(TokenSecretError::Unusable)?;
    let text = String::from_utf8(raw).map_err(|_| TokenSecretError::Unusable)?;
    // The first token of the file's format; the file watcher reads them all.
    let first = egress_discovery::parse_tokens(&text)
        .map_err(|_| TokenSecretError::Unusable)?
        .into_iter()
        .next()
        .ok_or(TokenSecretError::Unusable)?;
    Ok(Token(first))
}

fn api_error(e: &kube::Error) -> TokenSecretError {
    TokenSecretError::Api(e.to_string())
}

/// The token of the Secret in `secrets`' namespace, made (with `token`) when there is none.
///
/// # Errors
///
/// The API failed, or the Secret exists without a usable token.
pub async fn ensure(secrets: &Api<Secret>, token: String) -> Result<TokenOrigin, TokenSecretError> {
    if let Some(existing) = secrets.get_opt(SECRET_NAME).await.map_err(|e| api_error(&e))? {
        return tokens_of(&existing).map(TokenOrigin::Existing);
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET_NAME.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    egress_api::MANAGED_BY.to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        data: Some([(KEY.to_owned(), ByteString(token.clone().into_bytes()))].into()),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(TokenOrigin::Created(Token(token))),
        // Another replica made it first: its token is the one.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let made = secrets.get(SECRET_NAME).await.map_err(|e| api_error(&e))?;
            tokens_of(&made).map(TokenOrigin::Existing)
        }
        Err(e) => Err(api_error(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_differ_and_are_header_safe() {
        let (a, b) = (random_token(), random_token());
        assert_ne!(a, b);
        assert_eq!(a.len(), 52);
        assert!(a.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        assert_eq!(format!("{:?}", Token(a)), "Token(<not shown>)");
    }
}
