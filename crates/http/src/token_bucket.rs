//! A token bucket: bursts up to its capacity go at once, and it refills at a steady rate. Pure:
//! every method takes the time, so callers decide where it comes from (tests freeze it).
//! The discovery API's request budgets and the operator's create budget are both one.

use std::time::{Duration, Instant};

/// Float error in the refill must not turn "one token, exactly when it was promised" into
/// "0.999999 tokens, come back in a nanosecond".
const EPSILON: f64 = 1e-9;

/// A bucket of `capacity` tokens, refilled with `refill` tokens every `every` (spread evenly),
/// starting full.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    capacity: f64,
    refill: f64,
    every_nanos: f64,
    tokens: f64,
    /// The time `tokens` was counted at. Never moves backwards: a clock that does leaves the
    /// bucket as it was until the clock passes this again.
    counted_at: Instant,
}

impl TokenBucket {
    /// A full bucket. A capacity or a refill of 0 is taken as 1, and a period of zero as a
    /// nanosecond: no bucket may be one that never lets anything through.
    pub fn full(capacity: u32, refill: u32, every: Duration, now: Instant) -> Self {
        let capacity = f64::from(capacity.max(1));
        Self {
            capacity,
            refill: f64::from(refill.max(1)),
            every_nanos: every.as_nanos().max(1) as f64,
            tokens: capacity,
            counted_at: now,
        }
    }

    /// A bucket of `n` tokens refilled at `n` a minute.
    pub fn per_minute(n: u32, now: Instant) -> Self {
        Self::full(n, n, Duration::from_secs(60), now)
    }

    /// The tokens there at `now` (fractions included).
    pub fn tokens(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.counted_at).as_nanos() as f64;
        (self.tokens + elapsed * self.refill / self.every_nanos).min(self.capacity)
    }

    /// Takes one token at `now`, or answers how long until one is there.
    ///
    /// # Errors
    /// The wait until the next token, when there is none now.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens + EPSILON < 1.0 {
            return Err(self.wait_for(1.0, now));
        }
        self.tokens = (self.tokens - 1.0).max(0.0);
        Ok(())
    }

    /// How long from `now` until `needed` tokens are there (zero if they are), to the nearest
    /// nanosecond: coming back after it finds them, within [`EPSILON`] (rounding up instead
    /// would turn float noise into a nanosecond more).
    pub fn wait_for(&self, needed: f64, now: Instant) -> Duration {
        let missing = needed - self.tokens(now);
        if missing <= EPSILON {
            return Duration::ZERO;
        }
        let nanos = (missing * self.every_nanos / self.refill).round();
        // The cast saturates: a wait beyond u64 nanoseconds (centuries) is the longest one.
        Duration::from_nanos(nanos as u64)
    }

    fn refill(&mut self, now: Instant) {
        if now > self.counted_at {
            self.tokens = self.tokens(now);
            self.counted_at = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn start() -> Instant {
        Instant::now()
    }

    #[test]
    fn a_new_bucket_is_full() {
        let t0 = start();
        let bucket = TokenBucket::per_minute(60, t0);
        assert_eq!(bucket.tokens(t0), 60.0);
        assert_eq!(bucket.wait_for(60.0, t0), Duration::ZERO);
    }

    #[test]
    fn a_burst_up_to_the_capacity_goes_at_once_and_the_next_waits() {
        let t0 = start();
        let mut bucket = TokenBucket::per_minute(3, t0);
        for i in 0..3 {
            assert_eq!(bucket.try_take(t0), Ok(()), "create {i}");
        }
        // 3 a minute: one token every 20 s.
        assert_eq!(bucket.try_take(t0), Err(20 * SEC));
    }

    #[test]
    fn tokens_come_back_at_the_rate_and_never_beyond_the_capacity() {
        let t0 = start();
        let mut bucket = TokenBucket::per_minute(60, t0);
        for _ in 0..60 {
            bucket.try_take(t0).unwrap();
        }
        let rows = [
            (Duration::ZERO, 0.0),
            (Duration::from_millis(500), 0.5),
            (SEC, 1.0),
            (30 * SEC, 30.0),
            (60 * SEC, 60.0),
            (3600 * SEC, 60.0),
        ];
        for (after, want) in rows {
            let got = bucket.tokens(t0 + after);
            assert!((got - want).abs() < 1e-6, "after {after:?}: {got}, want {want}");
        }
        assert_eq!(
            bucket.try_take(t0 + 999 * Duration::from_millis(1)),
            Err(Duration::from_millis(1))
        );
        assert_eq!(bucket.try_take(t0 + SEC), Ok(()));
    }

    #[test]
    fn the_wait_answered_is_until_the_next_token() {
        let t0 = start();
        let mut bucket = TokenBucket::per_minute(6, t0);
        for _ in 0..6 {
            bucket.try_take(t0).unwrap();
        }
        // 6 a minute: one every 10 s; 4 s in, 6 s are left.
        assert_eq!(bucket.try_take(t0 + 4 * SEC), Err(6 * SEC));
        // Coming back exactly then finds the token.
        assert_eq!(bucket.try_take(t0 + 10 * SEC), Ok(()));
        assert_eq!(bucket.wait_for(3.0, t0 + 10 * SEC), 30 * SEC);
    }

    #[test]
    fn a_clock_that_goes_backwards_adds_nothing_and_takes_nothing_away() {
        let t0 = start() + 3600 * SEC;
        let mut bucket = TokenBucket::per_minute(2, t0);
        bucket.try_take(t0).unwrap();
        let earlier = t0 - 600 * SEC;
        assert_eq!(bucket.tokens(earlier), 1.0);
        assert_eq!(bucket.try_take(earlier), Ok(()));
        assert_eq!(
            bucket.try_take(earlier),
            Err(30 * SEC),
            "measured from where the bucket last counted"
        );
        // Time resumes from where the bucket last counted, not from the earlier reading.
        assert_eq!(bucket.try_take(t0 + 30 * SEC), Ok(()));
    }

    #[test]
    fn a_budget_of_zero_is_taken_as_one() {
        let t0 = start();
        let mut bucket = TokenBucket::per_minute(0, t0);
        assert_eq!(bucket.try_take(t0), Ok(()));
        assert_eq!(bucket.try_take(t0), Err(60 * SEC));
    }

    #[test]
    fn a_burst_larger_than_the_rate_refills_at_the_rate() {
        let t0 = start();
        // 100 at once, then 10 a second.
        let mut bucket = TokenBucket::full(100, 10, SEC, t0);
        for _ in 0..100 {
            bucket.try_take(t0).unwrap();
        }
        assert_eq!(bucket.try_take(t0), Err(Duration::from_millis(100)));
        assert_eq!(bucket.try_take(t0 + Duration::from_millis(100)), Ok(()));
        assert!((bucket.tokens(t0 + 3600 * SEC) - 100.0).abs() < 1e-9);
    }
}
