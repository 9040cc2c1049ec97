//! The lifetime a lease request asks for.

use std::time::Duration;

/// The TTL of a request that names none (or 0).
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// A TTL a request may not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    #[error("ttlSeconds must not be negative")]
    Negative,
    #[error("ttlSeconds must be at most {max} (the operator's --max-lease-ttl)")]
    TooLong { max: u64 },
}

/// The TTL for `ttlSeconds`: absent or 0 is the default (300 s); negative or above `max` is
/// refused.
///
/// # Errors
///
/// [`TtlError`] for a negative TTL or one above `max`.
pub fn effective_ttl(requested: Option<i64>, max: Duration) -> Result<Duration, TtlError> {
    let ttl = match requested {
        None | Some(0) => DEFAULT_TTL.min(max),
        Some(s) if s < 0 => return Err(TtlError::Negative),
        Some(s) => Duration::from_secs(s.unsigned_abs()),
    };
    if ttl > max {
        return Err(TtlError::TooLong { max: max.as_secs() });
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttl_rule() {
        let hour = Duration::from_secs(3600);
        assert_eq!(effective_ttl(None, hour), Ok(DEFAULT_TTL));
        assert_eq!(effective_ttl(Some(0), hour), Ok(DEFAULT_TTL));
        assert_eq!(effective_ttl(Some(60), hour), Ok(Duration::from_secs(60)));
        assert_eq!(effective_ttl(Some(3600), hour), Ok(hour));
        assert_eq!(effective_ttl(Some(3601), hour), Err(TtlError::TooLong { max: 3600 }));
        assert_eq!(effective_ttl(Some(-1), hour), Err(TtlError::Negative));
        assert_eq!(effective_ttl(Some(i64::MIN), hour), Err(TtlError::Negative));
        assert_eq!(
            effective_ttl(Some(i64::MAX), hour),
            Err(TtlError::TooLong { max: 3600 })
        );
        // A maximum below the default caps the default rather than refusing requests without a TTL.
        assert_eq!(
            effective_ttl(None, Duration::from_secs(60)),
            Ok(Duration::from_secs(60))
        );
    }
}
