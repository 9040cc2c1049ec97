//! Reading a request body within a size cap and a deadline.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Limited};

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the body is over {0} bytes")]
    TooLarge(usize),
    #[error("the body did not arrive in time")]
    TooSlow,
    #[error("the body could not be read")]
    Broken,
}

/// Reads all of `body`, at most `max` bytes and within `deadline` for the whole body (not per
/// chunk: a client trickling a byte at a time is cut off all the same). A body over the cap
/// is never read whole.
///
/// # Errors
///
/// The body is larger than `max`, took longer than `deadline`, or the connection failed.
pub async fn read_body(body: crate::Body, max: usize, deadline: Duration) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(deadline, Limited::new(body, max).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge(max)),
        Ok(Err(_)) => Err(BodyError::Broken),
        Err(_) => Err(BodyError::TooSlow),
    }
}
