//! The lease store suite (egress-lease's tests/suite) against a real redis-server: the one
//! `cargo xtask test` starts and names in `EGRESS_TEST_REDIS_URL`. Without it the cases are
//! skipped, unless `EGRESS_CONFORMANCE_REQUIRED=1` (CI), where they fail.

#[path = "../../lease/tests/suite/mod.rs"]
mod suite;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use egress_lease::{LeaseStore, ManualClock};
use egress_lease_redis::RedisStore;

/// The test Redis, or `None` (skip) when there is none and none is required.
pub fn redis_url() -> Option<String> {
    match std::env::var("EGRESS_TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("EGRESS_CONFORMANCE_REQUIRED").is_ok_and(|v| v == "1") => {
            panic!(
                "EGRESS_TEST_REDIS_URL is not set: run the tests through `cargo xtask test`, which starts redis-server"
            )
        }
        _ => {
            eprintln!("SKIPPED: no test Redis (EGRESS_TEST_REDIS_URL); `cargo xtask test` starts one");
            None
        }
    }
}

/// A prefix no other test uses, so cases share one Redis.
pub fn fresh_prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "test-{}-{}-{}:",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros()),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

struct Redis;

impl suite::Backend for Redis {
    fn store(&self, clock: ManualClock) -> Option<Arc<dyn LeaseStore>> {
        let url = redis_url()?;
        Some(Arc::new(
            RedisStore::new(&url, &fresh_prefix(), Arc::new(clock), suite::COOLDOWN).expect("a store"),
        ))
    }
}

lease_store_suite!(Redis);
