//! How long moving an image may take: the base-image download and its upload grow with the
//! image's announced size, so a large image on a slow but working link is not cut off at a
//! fixed budget (a silent host is caught sooner, by the SSH transport's stall limit).

use std::time::Duration;

/// The least any image transfer gets: enough for a cloud image on a slow link.
pub const TRANSFER_FLOOR: Duration = Duration::from_secs(20 * 60);
/// The slowest transfer rate, in bytes per second, a transfer is allowed above the floor.
pub const MIN_TRANSFER_RATE: u64 = 2 << 20;

/// The budget of moving `bytes` bytes: [`TRANSFER_FLOOR`], or the time [`MIN_TRANSFER_RATE`]
/// takes over them when that is longer.
pub fn transfer_budget(bytes: u64) -> Duration {
    TRANSFER_FLOOR.max(Duration::from_secs(bytes.div_ceil(MIN_TRANSFER_RATE)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_the_floor_until_the_minimum_rate_needs_more() {
        assert_eq!(transfer_budget(0), TRANSFER_FLOOR);
        assert_eq!(transfer_budget(512 << 20), TRANSFER_FLOOR);
        // 1200 s at 2 MiB/s (2.4 GiB): the floor exactly.
        assert_eq!(transfer_budget(1200 * MIN_TRANSFER_RATE), TRANSFER_FLOOR);
        assert_eq!(transfer_budget(1200 * MIN_TRANSFER_RATE + 1), Duration::from_secs(1201));
        // The largest image accepted (64 GiB): about nine hours.
        assert_eq!(transfer_budget(64 << 30), Duration::from_secs(32_768));
    }
}
