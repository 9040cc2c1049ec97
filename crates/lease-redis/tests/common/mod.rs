//! What the Redis test files share: the test servers `cargo xtask test` starts, and key
//! prefixes no other case uses.
#![allow(dead_code)] // each test file uses its own part

use std::sync::atomic::{AtomicU64, Ordering};

/// The test Redis, or `None` (skip) when there is none and none is required.
pub(crate) fn redis_url() -> Option<String> {
    test_url("EGRESS_TEST_REDIS_URL", "redis-server")
}

/// The test Redis Cluster (three masters), or `None` (skip) when there is none and none is
/// required.
pub(crate) fn cluster_url() -> Option<String> {
    test_url("EGRESS_TEST_REDIS_CLUSTER_URL", "a Redis Cluster")
}

fn test_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            egress_testkit::real::skip_or_fail(
                &format!("a case on {what}"),
                &format!("{var} is not set (`cargo xtask test` starts {what} and sets it)"),
            );
            None
        }
    }
}

/// A prefix no other test uses, so cases share one Redis.
pub(crate) fn fresh_prefix() -> String {
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

/// The plain `redis://` URL of every node `url` names (one for a single server).
pub(crate) fn nodes_of(url: &str) -> Vec<String> {
    match url.strip_prefix(egress_lease_redis::CLUSTER_SCHEME) {
        Some(hosts) => hosts.split(',').map(|h| format!("redis://{h}")).collect(),
        None => vec![url.to_owned()],
    }
}
