//! Go's `time.ParseDuration`, for every duration the Go operator read as one: flags, and the
//! Go-style durations of the ProxyPool resource (`maxAge`, `drainTimeout`).

use std::time::Duration;

/// Go's `time.ParseDuration` (`300ms`, `1h30m`, `1.5h`, `0`), limited to durations that are not
/// negative: every duration flag here is a period or an age.
///
/// # Errors
///
/// Go's wording: `time: invalid duration "x"`, `time: missing unit in duration "x"`,
/// `time: unknown unit "u" in duration "x"`; and `must not be negative`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("time: invalid duration {text:?}");
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let whole: u128 = if digits == 0 {
            0
        } else {
            rest[..digits].parse().map_err(|_| invalid())?
        };
        rest = &rest[digits..];
        let (mut fraction, mut scale, mut fraction_digits) = (0u128, 1u128, 0usize);
        if let Some(after_dot) = rest.strip_prefix('.') {
            fraction_digits = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            // Nanoseconds need at most 9 digits below the unit's smallest part; more are dropped.
            for b in after_dot[..fraction_digits].bytes().take(18) {
                fraction = fraction * 10 + u128::from(b - b'0');
                scale *= 10;
            }
            rest = &after_dot[fraction_digits..];
        }
        if digits == 0 && fraction_digits == 0 {
            return Err(invalid());
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(rest.len(), |(i, _)| i);
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos_per: u128 = match unit {
            "" => return Err(format!("time: missing unit in duration {text:?}")),
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            other => return Err(format!("time: unknown unit {other:?} in duration {text:?}")),
        };
        total = total
            .checked_add(whole.checked_mul(nanos_per).ok_or_else(invalid)?)
            .and_then(|t| t.checked_add(fraction * nanos_per / scale))
            .ok_or_else(invalid)?;
        // Go's durations are int64 nanoseconds.
        if total > i64::MAX as u128 {
            return Err(invalid());
        }
    }
    if negative && total > 0 {
        return Err("must not be negative".into());
    }
    Ok(Duration::from_nanos(u64::try_from(total).map_err(|_| invalid())?))
}
