//! What both HTTP users of the crate (the Compute [`client`](crate::client) and the token
//! source in [`auth`](crate::auth)) do with a reqwest answer and its failures: a transport error
//! as redacted text, or as a [`RequestFailure`], and a body read with a cap.

use crate::classify::RequestFailure;

/// A transport error as text: what failed, never a credential.
pub fn transport_text(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    egress_provider::redact(&text)
}

/// A transport error as a [`RequestFailure`], telling a timeout apart.
pub fn transport(e: &reqwest::Error) -> RequestFailure {
    RequestFailure::Transport {
        message: transport_text(e),
        timed_out: e.is_timeout(),
    }
}

/// The body of `response`, refusing more than `limit` bytes.
///
/// # Errors
/// The body broke off or timed out ([`RequestFailure::Transport`]), or is too large
/// ([`RequestFailure::Undecodable`]).
pub async fn read_capped(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, RequestFailure> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport(&e))? {
        if body.len() + chunk.len() > limit {
            return Err(RequestFailure::Undecodable(format!("answer over {limit} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
