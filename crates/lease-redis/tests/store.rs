//! The lease store suite (`egress_lease::testing`) against a real redis-server: the one
//! `cargo xtask test` starts and names in `EGRESS_TEST_REDIS_URL`. Without it the cases are
//! skipped, unless real backends are required (`egress_testkit::real`, as under `cargo xtask
//! test`), where they fail.

use egress_lease::testing as suite;

use std::sync::Arc;
use std::time::Duration;

use egress_lease::{LeaseStore, ManualClock};
use egress_lease_redis::RedisStore;

mod common;
use common::{cluster_url, fresh_prefix, nodes_of, redis_url};

/// Suite stores on the test Redis or on the test cluster, the unpooled proxies over `shards`
/// shards; each pool has a shard of its own whatever `shards` is.
struct Redis {
    cluster: bool,
    shards: u16,
}

/// One Redis, the unpooled proxies in one shard.
const ONE: Redis = Redis {
    cluster: false,
    shards: 1,
};
/// The cluster (three masters), the unpooled proxies in one shard.
const CLUSTER: Redis = Redis {
    cluster: true,
    shards: 1,
};

impl Redis {
    fn url(&self) -> Option<String> {
        if self.cluster { cluster_url() } else { redis_url() }
    }

    /// A suite store under `prefix`.
    fn store_under(&self, url: &str, prefix: &str, clock: &ManualClock, cooldown: Duration) -> Arc<dyn LeaseStore> {
        Arc::new(
            RedisStore::new(url, prefix, cooldown)
                .and_then(|s| s.with_unpooled_shards(self.shards))
                .expect("a store")
                .with_clock(Arc::new(clock.clone()))
                .with_max_ended(suite::MAX_ENDED),
        )
    }
}

impl suite::Backend for Redis {
    fn store_with_cooldown(&self, clock: ManualClock, cooldown: Duration) -> Option<Arc<dyn LeaseStore>> {
        Some(self.store_under(&self.url()?, &fresh_prefix(), &clock, cooldown))
    }

    /// Two stores on the same keys, each with its own connection: two replicas of the API.
    fn replicas(&self, clock: ManualClock) -> Option<[Arc<dyn LeaseStore>; 2]> {
        let (url, prefix) = (self.url()?, fresh_prefix());
        Some([0, 1].map(|_| self.store_under(&url, &prefix, &clock, suite::COOLDOWN)))
    }

    fn keeps_pools_apart(&self) -> bool {
        true
    }
}

egress_lease::lease_store_suite!(ONE);

/// Each shard's keys in a slot of their own on a Redis Cluster: the same cases there.
mod cluster {
    egress_lease::lease_store_suite!(super::CLUSTER);

    mod indexed {
        egress_lease::lease_store_suite!(egress_lease::testing::Indexed(super::super::CLUSTER));
    }
}

/// The same cases answered from the installation's index of the published view.
mod indexed {
    egress_lease::lease_store_suite!(egress_lease::testing::Indexed(super::ONE));
}

/// The unpooled proxies over four shards, on one Redis and on the cluster.
mod sharded {
    const ONE: super::Redis = super::Redis {
        cluster: false,
        shards: 4,
    };
    const CLUSTER: super::Redis = super::Redis {
        cluster: true,
        shards: 4,
    };
    egress_lease::lease_store_suite!(sharded: ONE);

    mod cluster {
        egress_lease::lease_store_suite!(sharded: super::CLUSTER);
    }

    mod indexed {
        egress_lease::lease_store_suite!(sharded: egress_lease::testing::Indexed(super::ONE));
    }
}

/// Every key of the store under `prefix` starts with this (its hash tag).
fn tag(prefix: &str) -> String {
    format!("{{{prefix}}}")
}

/// A connection of the test's own, and every key of the store under `prefix`.
async fn keys_under(url: &str, prefix: &str) -> (redis::aio::MultiplexedConnection, Vec<String>) {
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", tag(prefix)))
        .query_async(&mut c)
        .await
        .unwrap();
    (c, keys)
}

/// A connection of the test's own, and every key of the store under `prefix` in any shard.
async fn keys_under_every_shard(url: &str, prefix: &str) -> (redis::aio::MultiplexedConnection, Vec<String>) {
    let (mut c, mut keys) = keys_under(url, prefix).await;
    let others: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}|s*"))
        .query_async(&mut c)
        .await
        .unwrap();
    keys.extend(others);
    (c, keys)
}

/// A store on the keys under `prefix`, on `clock`.
fn on_clock(url: &str, prefix: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::new(url, prefix, suite::COOLDOWN)
        .expect("a store")
        .with_clock(Arc::new(clock.clone()))
}

/// Two replicas' stores on the same keys, both on `clock`.
fn two_replicas(url: &str, prefix: &str, clock: &ManualClock) -> (RedisStore, RedisStore) {
    (on_clock(url, prefix, clock), on_clock(url, prefix, clock))
}

fn one(id: &str, max: i32) -> Vec<suite::P> {
    vec![suite::proxy(id, 1, max)]
}

#[tokio::test]
async fn the_published_view_decides_capacity_and_health_for_every_replica() {
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let clock = ManualClock::new(suite::start());
    let (a, b) = two_replicas(&url, &prefix, &clock);
    // The leader published capacity 1; a replica with a stale view of 5 still grants only 1.
    a.publish_view(&[egress_lease::ViewEntry {
        id: "ns/p".into(),
        healthy: true,
        latency_millis: 7,
        max_leases: 1,
        offered: true,
        indexed: Vec::new(),
        pool: None,
    }])
    .await
    .expect("publish");
    suite::acquire(&b, &one("ns/p", 5), &suite::req(None))
        .await
        .expect("the one slot");
    let refused = suite::acquire(&b, &one("ns/p", 5), &suite::req(None))
        .await
        .expect_err("full");
    assert_eq!(refused.at_capacity, 1);
    // Published unhealthy: nobody leases it, whatever a replica believes.
    a.publish_view(&[egress_lease::ViewEntry {
        id: "ns/p".into(),
        healthy: false,
        latency_millis: 7,
        max_leases: 5,
        offered: true,
        indexed: Vec::new(),
        pool: None,
    }])
    .await
    .expect("publish");
    let refused = suite::acquire(&b, &one("ns/p", 5), &suite::req(None))
        .await
        .expect_err("unhealthy");
    assert_eq!(refused.unhealthy, 1);
    // Published as held back (a pool's standby or draining member): a replica that still
    // believes it active cannot lease it, and it is no candidate in the counts.
    a.publish_view(&[egress_lease::ViewEntry {
        id: "ns/p".into(),
        healthy: true,
        latency_millis: 7,
        max_leases: 5,
        offered: false,
        indexed: Vec::new(),
        pool: None,
    }])
    .await
    .expect("publish");
    let refused = suite::acquire(&b, &one("ns/p", 5), &suite::req(None))
        .await
        .expect_err("held back");
    assert_eq!(refused, egress_lease::NoMatch::default());
    // An empty view: the replicas' own values again.
    a.publish_view(&[]).await.expect("publish");
    suite::acquire(&b, &one("ns/p", 5), &suite::req(None))
        .await
        .expect("capacity 5 again");
}

#[tokio::test]
async fn an_unreachable_redis_is_a_store_error_without_the_password() {
    // Nothing listens on port 1.
    let s = RedisStore::new("redis://:s3cret-pw@127.0.0.1:1/0", "x:", suite::COOLDOWN)
        .expect("a store: it connects lazily");
    let e = s.release("L").await.expect_err("no Redis");
    assert!(!e.to_string().contains("s3cret-pw"), "{e}");
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    assert!(!format!("{s:?}").contains("s3cret-pw"));
}

#[tokio::test]
async fn a_fleet_larger_than_a_batch_is_searched_whole() {
    let Some(url) = redis_url() else { return };
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &fresh_prefix(), &clock);
    let n = egress_lease_redis::BATCH * 2 + 10;
    // One lease each, in order: past the first batch the idle proxies are found by the second
    // run, which gets every candidate.
    let fleet: Vec<suite::P> = (0..n)
        .map(|i| suite::proxy(&format!("ns/p{i:04}"), i as i64, 2))
        .collect();
    let mut granted = std::collections::HashSet::new();
    for _ in 0..n {
        let g = suite::acquire(&s, &fleet, &suite::req(None)).await.expect("a lease");
        assert!(
            granted.insert(g.proxy_id.clone()),
            "{} twice before every proxy had one",
            g.proxy_id
        );
    }
    // All hold one: the fewest leases, then the lowest latency.
    let g = suite::acquire(&s, &fleet, &suite::req(None))
        .await
        .expect("a second lease");
    assert_eq!((g.proxy_id.as_str(), g.active_leases), ("ns/p0000", 2));
    for _ in 1..n {
        suite::acquire(&s, &fleet, &suite::req(None))
            .await
            .expect("a second lease");
    }
    let refused = suite::acquire(&s, &fleet, &suite::req(None))
        .await
        .expect_err("all full");
    assert_eq!((refused.considered, refused.at_capacity), (n, n));
}

#[tokio::test]
async fn every_key_has_a_ttl_of_its_kind() {
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let s = RedisStore::new(&url, &prefix, suite::COOLDOWN).expect("a store");
    let fleet = one("ns/p", 5);
    let g = suite::acquire(&s, &fleet, &suite::req(Some("t")))
        .await
        .expect("a lease");
    s.report(&g.lease_id, egress_lease::ReportResult::Banned, None)
        .await
        .expect("answers")
        .expect("known");
    let ended = suite::acquire(&s, &fleet, &suite::req(None)).await.expect("a lease");
    s.release(&ended.lease_id).await.expect("answers");
    suite::in_session(&s, &fleet, &suite::req(None), "team-a", "login", 10)
        .await
        .expect("a session's lease");
    s.publish_view(&[egress_lease::ViewEntry {
        id: "ns/p".into(),
        healthy: true,
        latency_millis: 1,
        max_leases: 5,
        offered: true,
        indexed: Vec::new(),
        pool: None,
    }])
    .await
    .expect("publish");
    let (mut c, keys) = keys_under(&url, &prefix).await;
    let ttl = suite::req(None).ttl.as_millis() as i64;
    let window = suite::COOLDOWN.as_millis() as i64;
    let grace = egress_lease_redis::EXPIRY_GRACE.as_millis() as i64;
    let view = egress_lease_redis::VIEW_LIFETIME.as_millis() as i64;
    let mut kinds = Vec::new();
    for key in keys {
        let left: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut c).await.unwrap();
        let kind = key[tag(&prefix).len()..].split(':').next().unwrap().to_owned();
        let most = match kind.as_str() {
            "lease" | "lsess" => ttl + window.max(grace),
            "active" | "all" | "session" | "sessions" | "session-clients" => ttl + grace,
            "cool" => window,
            // As long as the longest-lived record it names.
            "ended" => ttl + window.max(grace),
            // The view, its index and the directory of shards.
            "view" | "count" | "free" | "indexes" | "shards" => view,
            other => panic!("a key of unknown kind: {key} ({other})"),
        };
        assert!(left > 0 && left <= most, "{key}: {left} ms left, at most {most}");
        // A lease's traces outlive its expiry: its proxy goes back into the index only when an
        // acquire or the sweep reads them.
        if matches!(
            kind.as_str(),
            "lease" | "active" | "all" | "session" | "lsess" | "sessions" | "session-clients"
        ) {
            assert!(
                left > ttl,
                "{key}: {left} ms left, gone before its lease's expiry is noticed"
            );
        }
        kinds.push(kind);
    }
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "active",
            "all",
            "cool",
            "count",
            "ended",
            "free",
            "lease",
            "lsess",
            "session",
            "session-clients",
            "sessions",
            "shards",
            "view"
        ]
    );
}

/// Abuse: acquire/release pairs with distinct maximal targets, some leases never released,
/// report spam. Redis holds at most the active leases plus the ended ones kept, 64 targets per
/// proxy, and every key has a TTL.
#[tokio::test]
async fn what_abuse_leaves_in_redis_is_bounded() {
    use egress_lease::{MAX_COOLDOWN_TARGETS, MAX_TARGET_BYTES, ReportResult};
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &prefix, &clock).with_max_ended(100);
    let fleet: Vec<suite::P> = (0..4).map(|i| suite::proxy(&format!("ns/p{i}"), i, 5)).collect();
    let long = "x".repeat(MAX_TARGET_BYTES - 8);
    for round in 0..1_000u32 {
        let target = format!("{round:08}{long}");
        let g = suite::acquire(&s, &fleet, &suite::req(Some(&target)))
            .await
            .unwrap_or_else(|n| panic!("a lease at round {round}: {n:?}"));
        s.report(&g.lease_id, ReportResult::Banned, None)
            .await
            .unwrap()
            .unwrap();
        if round % 10 != 0 {
            s.release(&g.lease_id).await.unwrap();
        }
        // Unreleased leases (one in ten) expire as the clock moves: at most 10 live at once.
        if round % 20 == 0 {
            clock.advance(std::time::Duration::from_secs(60));
            s.sweep().await.unwrap();
        }
    }
    let (mut c, keys) = keys_under(&url, &prefix).await;
    let active = s.active_total().await.unwrap();
    let leases = keys
        .iter()
        .filter(|k| k.starts_with(&format!("{}lease:", tag(&prefix))))
        .count();
    assert!(leases <= active + 100, "{leases} lease records, {active} active");
    let ended: usize = redis::cmd("LLEN")
        .arg(format!("{}ended", tag(&prefix)))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(ended <= 100, "{ended} ended");
    for key in keys.iter().filter(|k| k.starts_with(&format!("{}cool:", tag(&prefix)))) {
        let fields: usize = redis::cmd("HLEN").arg(key).query_async(&mut c).await.unwrap();
        assert!(fields <= MAX_COOLDOWN_TARGETS + 1, "{key}: {fields} cooldowns");
    }
    for key in &keys {
        let left: i64 = redis::cmd("PTTL").arg(key).query_async(&mut c).await.unwrap();
        assert!(left > 0, "{key} has no TTL");
        let size: usize = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(size < 64 * 1024, "{key} holds {size} bytes");
    }
    assert!(s.cooldowns_dropped() > 0, "the cap was never reached");
}

/// Abuse of sessions: a thousand names, a third of their leases never released, renewals of
/// every lease. Each client's set holds at most its cap, a released session leaves no key, and
/// every key has a TTL (an expired session's keys go six minutes after its lease's expiry, in
/// Redis's time: this test's clock moves only the scripts').
#[tokio::test]
async fn what_session_abuse_leaves_in_redis_is_bounded() {
    const CAP: usize = 30;
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &prefix, &clock);
    let fleet: Vec<suite::P> = (0..4).map(|i| suite::proxy(&format!("ns/p{i}"), i, 50)).collect();
    let (mut refused, mut kept) = (0, std::collections::HashSet::new());
    for round in 0..1_000u32 {
        match suite::in_session(&s, &fleet, &suite::req(None), "team-a", &format!("s{round}"), CAP).await {
            Ok(g) => {
                s.renew(&g.lease_id, Duration::from_secs(300), &|_: &str| true)
                    .await
                    .unwrap()
                    .unwrap();
                if round % 3 == 0 {
                    kept.insert(g.lease_id);
                } else {
                    s.release(&g.lease_id).await.unwrap();
                }
            }
            Err(egress_lease::SessionRefused::TooMany { held, cap }) => {
                assert_eq!((held, cap), (CAP, CAP));
                refused += 1;
            }
            Err(other) => panic!("round {round}: {other:?}"),
        }
        if round % 20 == 0 {
            clock.advance(Duration::from_secs(60));
            s.sweep().await.unwrap();
        }
    }
    assert!(refused > 0, "the cap was never reached");
    let (mut c, keys) = keys_under(&url, &prefix).await;
    let held: usize = redis::cmd("ZCARD")
        .arg(format!("{}sessions:team-a", tag(&prefix)))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(held <= CAP, "{held} sessions");
    let of_kind = |kind: &str| {
        keys.iter()
            .filter(|k| k.starts_with(&format!("{}{kind}:", tag(&prefix))))
            .count()
    };
    for key in keys
        .iter()
        .filter(|k| k.starts_with(&format!("{}session:", tag(&prefix))))
    {
        let held: String = redis::cmd("GET").arg(key).query_async(&mut c).await.unwrap();
        let lease = held.split(',').next().unwrap();
        assert!(kept.contains(lease), "{key} names {lease}, which was released");
    }
    assert!(
        of_kind("lsess") <= of_kind("lease"),
        "a note outlived its lease's record"
    );
    for key in &keys {
        let left: i64 = redis::cmd("PTTL").arg(key).query_async(&mut c).await.unwrap();
        assert!(left > 0, "{key} has no TTL");
    }
    assert_eq!(s.sessions_now().len(), 1, "one client with sessions");
}

/// An acquire scoped to the installation, with `fleet` as its candidates.
async fn scoped(s: &RedisStore, fleet: &[suite::P]) -> Result<egress_lease::Grant, egress_lease::NoMatch> {
    let mut candidates = fleet.iter().map(|p| egress_lease::Candidate {
        id: &p.id,
        healthy: p.healthy,
        latency_millis: p.latency_millis,
        max_leases: p.max_leases,
        pool: p.pool(),
    });
    let req = egress_lease::LeaseRequest {
        scope: egress_lease::Scope::Installation,
        ..suite::req(None)
    };
    s.acquire(&mut candidates, &req).await.expect("the store answers")
}

fn entry(id: &str, healthy: bool, latency_millis: i64, max_leases: i32) -> egress_lease::ViewEntry {
    egress_lease::ViewEntry {
        id: id.into(),
        healthy,
        latency_millis,
        max_leases,
        offered: true,
        indexed: Vec::new(),
        pool: None,
    }
}

#[tokio::test]
async fn the_index_answers_from_the_view_without_reading_the_candidates() {
    let Some(url) = redis_url() else { return };
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &fresh_prefix(), &clock);
    // Before any view there is no index: the candidates decide.
    assert_eq!(
        scoped(&s, &[]).await.expect_err("no view, no candidates"),
        egress_lease::NoMatch::default()
    );
    s.publish_view(&[
        entry("ns/slow", true, 50, 1),
        entry("ns/fast", true, 10, 1),
        entry("ns/sick", false, 1, 1),
        entry("ns/zero", true, 1, 0),
    ])
    .await
    .expect("publish");
    // No candidates given: the index alone answers, in the store's order.
    assert_eq!(scoped(&s, &[]).await.expect("a lease").proxy_id, "ns/fast");
    assert_eq!(scoped(&s, &[]).await.expect("a lease").proxy_id, "ns/slow");
    assert_eq!(
        scoped(&s, &[]).await.expect_err("all full"),
        egress_lease::NoMatch {
            considered: 4,
            at_capacity: 3,
            in_cooldown: 0,
            unhealthy: 1,
        }
    );
}

/// An acquire scoped to the indexes `names`, without candidates: what the indexes alone answer.
async fn from_indexes(s: &RedisStore, names: &[&str]) -> Result<egress_lease::Grant, egress_lease::NoMatch> {
    let req = egress_lease::LeaseRequest {
        scope: egress_lease::Scope::Indexed(names.iter().map(|n| (*n).to_owned()).collect()),
        ..suite::req(None)
    };
    s.acquire(&mut std::iter::empty(), &req)
        .await
        .expect("the store answers")
}

/// `entry` in the indexes `names`, and in the pool a `pool=` one names.
fn in_indexes(entry: egress_lease::ViewEntry, names: &[&str]) -> egress_lease::ViewEntry {
    egress_lease::ViewEntry {
        indexed: names.iter().map(|n| (*n).to_owned()).collect(),
        pool: names.iter().find_map(|n| n.strip_prefix("pool=")).map(str::to_owned),
        ..entry
    }
}

#[tokio::test]
async fn attribute_indexes_answer_from_the_view_and_follow_its_changes() {
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &prefix, &clock);
    s.publish_view(&[
        in_indexes(entry("ns/a", true, 10, 1), &["pool=x", "geo=eu"]),
        in_indexes(entry("ns/b", true, 5, 1), &["pool=x", "geo=us"]),
        in_indexes(entry("ns/c", false, 1, 1), &["pool=x", "geo=eu"]),
        entry("ns/d", true, 0, 1),
    ])
    .await
    .expect("publish");
    // No candidates given: the indexes alone answer.
    assert_eq!(from_indexes(&s, &["pool=x", "geo=eu"]).await.unwrap().proxy_id, "ns/a");
    assert_eq!(from_indexes(&s, &["pool=x"]).await.unwrap().proxy_id, "ns/b");
    assert_eq!(
        from_indexes(&s, &["pool=x"])
            .await
            .expect_err("a and b full, c unhealthy"),
        egress_lease::NoMatch {
            considered: 3,
            at_capacity: 2,
            in_cooldown: 0,
            unhealthy: 1
        }
    );
    // An index the view does not know, and several with no proxy in all: the candidates (none
    // here) decide.
    assert_eq!(
        from_indexes(&s, &["pool=y"]).await,
        Err(egress_lease::NoMatch::default())
    );
    // A change of attributes moves the proxy between indexes: d joins pool=y, b leaves pool=x
    // for it.
    s.publish_view(&[
        in_indexes(entry("ns/a", true, 10, 1), &["pool=x", "geo=eu"]),
        in_indexes(entry("ns/b", true, 5, 1), &["pool=y"]),
        in_indexes(entry("ns/c", false, 1, 1), &["pool=x", "geo=eu"]),
        in_indexes(entry("ns/d", true, 0, 1), &["pool=y"]),
    ])
    .await
    .expect("publish");
    assert_eq!(from_indexes(&s, &["pool=y"]).await.unwrap().proxy_id, "ns/d");
    assert_eq!(
        from_indexes(&s, &["pool=x"]).await.expect_err("a full, c unhealthy"),
        egress_lease::NoMatch {
            considered: 2,
            at_capacity: 1,
            in_cooldown: 0,
            unhealthy: 1
        }
    );
    // Every index key lives as the view does, and one nobody is in is gone: in every shard.
    let (mut c, keys) = keys_under_every_shard(&url, &prefix).await;
    let indexes: Vec<&String> = keys.iter().filter(|k| k.contains("}free:")).collect();
    for key in &indexes {
        let left: i64 = redis::cmd("PTTL").arg(*key).query_async(&mut c).await.unwrap();
        let view = egress_lease_redis::VIEW_LIFETIME.as_millis() as i64;
        assert!(left > 0 && left <= view, "{key}: {left} ms");
    }
    let mut names = Vec::new();
    for key in keys.iter().filter(|k| k.ends_with("}indexes")) {
        let in_shard: Vec<String> = redis::cmd("SMEMBERS").arg(key).query_async(&mut c).await.unwrap();
        names.extend(in_shard);
    }
    names.sort();
    assert_eq!(names, ["geo=eu", "pool=x", "pool=y"], "geo=us has no proxy left");
    // Each pool's view is in a shard of its own (d, the unpooled one, joined pool y).
    let views: Vec<&String> = keys.iter().filter(|k| k.ends_with("}view")).collect();
    assert_eq!(views.len(), 2, "{keys:?}");
    assert!(views.iter().all(|k| k.contains("|s")), "{views:?}");
}

#[tokio::test]
async fn a_publication_sends_what_changed_and_anothers_makes_the_next_whole() {
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let clock = ManualClock::new(suite::start());
    let (a, b) = two_replicas(&url, &prefix, &clock);
    a.publish_view(&[entry("ns/p", true, 1, 1), entry("ns/q", true, 2, 1)])
        .await
        .expect("publish");
    // A change: p unhealthy. Only q is left to lease.
    a.publish_view(&[entry("ns/p", false, 1, 1), entry("ns/q", true, 2, 1)])
        .await
        .expect("publish");
    assert_eq!(scoped(&a, &[]).await.expect("a lease").proxy_id, "ns/q");
    let refused = scoped(&a, &[]).await.expect_err("q is full, p unhealthy");
    assert_eq!((refused.considered, refused.unhealthy, refused.at_capacity), (2, 1, 1));
    // Another replica publishes r alone; a's next publication (p healthy again, q gone) cannot
    // apply as changes over b's, so a publishes its whole view: r is gone.
    b.publish_view(&[entry("ns/r", true, 0, 1)]).await.expect("publish");
    assert_eq!(scoped(&b, &[]).await.expect("a lease").proxy_id, "ns/r");
    a.publish_view(&[entry("ns/p", true, 1, 1)]).await.expect("publish");
    assert_eq!(scoped(&a, &[]).await.expect("a lease").proxy_id, "ns/p");
    assert_eq!(
        scoped(&a, &[]).await.expect_err("p is full"),
        egress_lease::NoMatch {
            considered: 1,
            at_capacity: 1,
            in_cooldown: 0,
            unhealthy: 0,
        }
    );
}

#[tokio::test]
async fn cooldowns_beyond_the_indexs_look_fall_back_to_the_candidates() {
    let Some(url) = redis_url() else { return };
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &fresh_prefix(), &clock);
    let n = egress_lease_redis::INDEX_LOOK + 10;
    let fleet: Vec<suite::P> = (0..n)
        .map(|i| suite::proxy(&format!("ns/p{i:04}"), i as i64, 1))
        .collect();
    let view: Vec<_> = fleet.iter().map(|p| entry(&p.id, true, p.latency_millis, 1)).collect();
    s.publish_view(&view).await.expect("publish");
    // The first INDEX_LOOK + 1 proxies cool down for everything.
    for _ in 0..=egress_lease_redis::INDEX_LOOK {
        let g = scoped(&s, &fleet).await.expect("a lease");
        s.report(&g.lease_id, egress_lease::ReportResult::Banned, None)
            .await
            .expect("answers")
            .expect("known");
        s.release(&g.lease_id).await.expect("answers");
    }
    // The index gives up after its look; the candidates, read whole, find the next one.
    let expected = format!("ns/p{:04}", egress_lease_redis::INDEX_LOOK + 1);
    assert_eq!(scoped(&s, &fleet).await.expect("a lease").proxy_id, expected);
    // Without candidates, giving up shows: nothing is considered.
    assert_eq!(scoped(&s, &[]).await.expect_err("no candidates").considered, 0);
}

#[tokio::test]
async fn every_expired_lease_is_counted_out_before_the_index_chooses() {
    let Some(url) = redis_url() else { return };
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &fresh_prefix(), &clock);
    // More expired leases than one run moves (1 000), all on the best proxy.
    s.publish_view(&[entry("ns/best", true, 1, 5000), entry("ns/other", true, 9, 5000)])
        .await
        .expect("publish");
    for _ in 0..2500 {
        scoped(&s, &[]).await.expect("a lease");
    }
    clock.advance(suite::req(None).ttl);
    let g = scoped(&s, &[]).await.expect("a lease");
    assert_eq!((g.proxy_id.as_str(), g.active_leases), ("ns/best", 1));
    assert_eq!(s.active_total().await.expect("answers"), 1);
}

#[tokio::test]
async fn a_mass_expiry_beyond_the_runs_falls_back_to_the_candidates() {
    let Some(url) = redis_url() else { return };
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &fresh_prefix(), &clock);
    let fleet = [suite::proxy("ns/best", 1, 9000)];
    s.publish_view(&[entry("ns/best", true, 1, 9000)])
        .await
        .expect("publish");
    let expired = egress_lease_redis::EXPIRY_RUNS * 1000 + 500;
    for _ in 0..expired {
        scoped(&s, &[]).await.expect("a lease");
    }
    clock.advance(suite::req(None).ttl);
    // The index's runs leave 500 expired leases unmoved: the candidates decide, their own
    // expired leases moved as they are looked at.
    let g = scoped(&s, &fleet).await.expect("a lease");
    assert_eq!((g.proxy_id.as_str(), g.active_leases), ("ns/best", 1));
    assert_eq!(s.active_total().await.expect("answers"), 1);
}

/// A server that has lost the store's functions (restarted without its data, or a node new to
/// the cluster) gets them loaded by the next call, which is answered as if nothing happened.
#[tokio::test]
async fn a_server_that_lost_the_functions_gets_them_again() {
    for url in [redis_url(), cluster_url()].into_iter().flatten() {
        let s = RedisStore::new(&url, &fresh_prefix(), suite::COOLDOWN).expect("a store");
        let fleet = one("ns/a", 2);
        assert_eq!(scoped(&s, &fleet).await.expect("granted").active_leases, 1);
        for node in nodes_of(&url) {
            let mut c = redis::Client::open(node.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            // Other cases share this Redis: one of theirs may find the library missing first
            // and load it, and a broken reload then fails that case instead.
            let _: () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut c).await.unwrap();
        }
        let again = scoped(&s, &fleet).await.expect("granted after the functions were lost");
        assert_eq!(again.active_leases, 2, "{url}: the first lease still counts");
    }
}

/// Leases recorded by the build before records were strings (a hash each) still report,
/// release and expire after an upgrade.
/// The suite's start time, in ms since the epoch (what the scripts get from a manual clock).
fn start_millis() -> u64 {
    u64::try_from(
        suite::start()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[tokio::test]
async fn leases_recorded_as_hashes_by_the_previous_build_still_end() {
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let clock = ManualClock::new(suite::start());
    let s = on_clock(&url, &prefix, &clock);
    let now = start_millis();
    let (mut c, _) = keys_under(&url, &prefix).await;
    // What that build wrote: a live lease on ns/a and one on ns/b past its expiry.
    let t = tag(&prefix);
    for (lease, proxy, expires) in [("old-live", "ns/a", now + 60_000), ("old-due", "ns/b", now - 1)] {
        let _: () = redis::pipe()
            .cmd("HSET")
            .arg(format!("{t}lease:{lease}"))
            .arg("proxy")
            .arg(proxy)
            .arg("target")
            .arg("")
            .arg("expires")
            .arg(expires)
            .cmd("ZADD")
            .arg(format!("{t}all"))
            .arg(expires)
            .arg(lease)
            .cmd("ZADD")
            .arg(format!("{t}active:{proxy}"))
            .arg(expires)
            .arg(lease)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    assert_eq!(
        s.active_leases(&["ns/a", "ns/b"].map(egress_lease::ProxyRef::unpooled))
            .await
            .unwrap(),
        vec![1, 0]
    );
    // The due one is moved out of the index of all leases and its proxy's set by the sweep.
    s.sweep().await.expect("the sweep reads the old record");
    assert_eq!(s.active_total().await.unwrap(), 1);
    let left: usize = redis::cmd("ZCARD")
        .arg(format!("{t}active:ns/b"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(left, 0, "the record named its proxy");
    // A report on the live one cools its proxy down.
    s.report("old-live", egress_lease::ReportResult::Banned, None)
        .await
        .unwrap()
        .expect("a known lease");
    let refused = scoped(&s, &one("ns/a", 5)).await.expect_err("ns/a cools down");
    assert_eq!(refused.in_cooldown, 1);
    s.release("old-live").await.expect("released");
    assert_eq!(
        s.active_leases(&["ns/a"].map(egress_lease::ProxyRef::unpooled))
            .await
            .unwrap(),
        vec![0]
    );
    assert_eq!(s.active_total().await.unwrap(), 0);
}

/// A value as text: integers and strings as they are, arrays in brackets.
fn shown(v: &redis::Value) -> String {
    match v {
        redis::Value::Int(n) => n.to_string(),
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::Array(items) => format!("[{}]", items.iter().map(shown).collect::<Vec<_>>().join(" ")),
        other => format!("{other:?}"),
    }
}

/// One call carrying many acquires (as a replica gathers those that arrive together) grants
/// them in turn, as if they came one after another; one carrying many releases ends each lease
/// once, whatever it names twice or does not know.
#[tokio::test]
async fn a_call_of_many_requests_answers_each_as_if_they_came_in_turn() {
    let Some(url) = redis_url() else { return };
    let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
    let s = on_clock(&url, &prefix, &clock);
    s.publish_view(&[
        entry("ns/a", true, 10, 1),
        entry("ns/b", true, 20, 2),
        entry("ns/sick", false, 1, 1),
    ])
    .await
    .expect("publish");
    let function: std::collections::HashMap<_, _> = s.function_names().into_iter().collect();
    let (mut c, _) = keys_under(&url, &prefix).await;
    let now = start_millis();
    let retention = suite::COOLDOWN.as_millis().to_string();
    // Five acquires from the installation's index: ttl, target, lease id, and no index name
    // each. The third reuses the second's id.
    let mut acquires = redis::cmd("FCALL");
    acquires
        .arg(&function["acquire_indexed"])
        .arg(1)
        .arg(tag(&prefix))
        .arg(now)
        .arg(&retention)
        .arg(100)
        .arg(128);
    for lease in ["l1", "l2", "l2", "l3", "l4"] {
        acquires.arg(60_000).arg("").arg(lease).arg(0);
    }
    let answer: redis::Value = acquires.query_async(&mut c).await.unwrap();
    let t = now + 60_000;
    assert_eq!(
        shown(&answer),
        format!("[3 [1 ns/a 1 {t}] [1 ns/b 1 {t}] [2] [1 ns/b 2 {t}] [0 3 2 0 1]]"),
        "all active; then the fastest, the next with room, the id taken, the last slot, none left"
    );
    let total: i64 = redis::cmd("FCALL")
        .arg(&function["release"])
        .arg(1)
        .arg(tag(&prefix))
        .arg(now)
        .arg(100)
        .arg(&retention)
        .arg(&["l1", "l1", "l3", "unknown"])
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(total, 1, "l2 is left");
    let ended: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("{}ended", tag(&prefix)))
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(ended, ["l1", "l3"], "each ended once, in order");
    assert_eq!(
        s.active_leases(&["ns/a", "ns/b"].map(egress_lease::ProxyRef::unpooled))
            .await
            .unwrap(),
        vec![0, 1]
    );
    assert_eq!(scoped(&s, &[]).await.expect("ns/a is free again").proxy_id, "ns/a");
}

/// Many acquires at once on two replicas, each replica gathering those that arrive together:
/// every slot is granted once, the fewest-leases order holds across the batches, and the rest
/// are refused with the counts of one after another.
#[tokio::test]
async fn acquires_that_arrive_together_fill_the_fleet_evenly_and_exactly() {
    let Some(url) = redis_url() else { return };
    let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
    let (a, b) = two_replicas(&url, &prefix, &clock);
    let (a, b) = (Arc::new(a), Arc::new(b));
    let view: Vec<_> = (0..8).map(|i| entry(&format!("ns/p{i}"), true, i * 10, 4)).collect();
    a.publish_view(&view).await.expect("publish");
    let mut calls = Vec::new();
    for i in 0..40 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        calls.push(tokio::spawn(async move { scoped(&s, &[]).await }));
    }
    let (mut per_proxy, mut refused) = (std::collections::BTreeMap::new(), Vec::new());
    for call in calls {
        match call.await.unwrap() {
            Ok(grant) => *per_proxy.entry(grant.proxy_id).or_insert(0) += 1,
            Err(no) => refused.push(no),
        }
    }
    assert_eq!(per_proxy.len(), 8);
    assert!(per_proxy.values().all(|&n| n == 4), "{per_proxy:?}");
    let full = egress_lease::NoMatch {
        considered: 8,
        at_capacity: 8,
        in_cooldown: 0,
        unhealthy: 0,
    };
    assert_eq!(refused, vec![full; 8]);
}

/// Releases and acquires that arrive together go in one round, the releases first: on a full
/// fleet, the acquires get the slots the releases free (an acquire run first would find none).
/// All are queued before the round's sender first runs (the test's runtime has one thread).
#[tokio::test]
async fn releases_and_acquires_that_arrive_together_free_before_they_grant() {
    let Some(url) = redis_url() else { return };
    let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
    let s = Arc::new(on_clock(&url, &prefix, &clock));
    s.publish_view(&[entry("ns/a", true, 10, 2), entry("ns/b", true, 20, 2)])
        .await
        .expect("publish");
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(scoped(&s, &[]).await.expect("a free slot").lease_id);
    }
    scoped(&s, &[]).await.expect_err("the fleet is full");
    let releases: Vec<_> = held
        .into_iter()
        .map(|id| {
            let s = s.clone();
            tokio::spawn(async move { s.release(&id).await })
        })
        .collect();
    let acquires: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { scoped(&s, &[]).await })
        })
        .collect();
    for release in releases {
        release.await.unwrap().expect("released");
    }
    let mut granted = std::collections::BTreeMap::new();
    for acquire in acquires {
        let grant = acquire.await.unwrap().expect("a slot freed in the same round");
        *granted.entry(grant.proxy_id).or_insert(0) += 1;
    }
    assert_eq!(granted, [("ns/a".to_owned(), 2), ("ns/b".to_owned(), 2)].into());
    assert_eq!(s.active_total().await.unwrap(), 4);
}

/// More acquires at once than one call carries: a round sends them in several calls, and
/// every caller gets its own answer, the fleet filled evenly and exactly.
#[tokio::test]
async fn a_round_of_more_acquires_than_a_call_carries_answers_each() {
    let Some(url) = redis_url() else { return };
    let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
    let s = Arc::new(on_clock(&url, &prefix, &clock));
    let view: Vec<_> = (0..4).map(|i| entry(&format!("ns/p{i}"), true, i * 10, 16)).collect();
    s.publish_view(&view).await.expect("publish");
    let calls: Vec<_> = (0..70)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { scoped(&s, &[]).await })
        })
        .collect();
    let (mut per_proxy, mut refused) = (std::collections::BTreeMap::new(), 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(grant) => *per_proxy.entry(grant.proxy_id).or_insert(0) += 1,
            Err(_) => refused += 1,
        }
    }
    assert_eq!(per_proxy.len(), 4);
    assert!(per_proxy.values().all(|&n| n == 16), "{per_proxy:?}");
    assert_eq!(refused, 70 - 64);
}

/// A view of several chunks (`PUBLISH_CHUNK` proxies each) lands whole, with its counts and
/// index; another replica's whole publication replaces it, removing every proxy of it in
/// chunks too, and the first replica's next one, which can no longer be sent as changes, puts
/// its own back whole.
#[tokio::test]
async fn a_view_of_many_chunks_lands_whole_and_is_taken_over_whole() {
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let clock = ManualClock::new(suite::start());
    let (a, b) = two_replicas(&url, &prefix, &clock);
    let n = 2 * egress_lease_redis::PUBLISH_CHUNK + 500;
    let fleet = |sick: Option<usize>| -> Vec<egress_lease::ViewEntry> {
        (0..n)
            .map(|i| entry(&format!("ns/p{i:05}"), Some(i) != sick, i64::try_from(i).unwrap(), 1))
            .collect()
    };
    let (mut c, _) = keys_under(&url, &prefix).await;
    let t = tag(&prefix);
    let mut state = async || -> (usize, usize, Vec<Option<usize>>) {
        let view: usize = redis::cmd("HLEN")
            .arg(format!("{t}view"))
            .query_async(&mut c)
            .await
            .unwrap();
        let free: usize = redis::cmd("ZCARD")
            .arg(format!("{t}free"))
            .query_async(&mut c)
            .await
            .unwrap();
        let counts: Vec<Option<usize>> = redis::cmd("HMGET")
            .arg(format!("{t}count"))
            .arg("offered")
            .arg("unhealthy")
            .query_async(&mut c)
            .await
            .unwrap();
        (view, free, counts)
    };
    a.publish_view(&fleet(None)).await.expect("publish");
    assert_eq!(state().await, (n, n, vec![Some(n), Some(0)]));
    assert_eq!(scoped(&a, &[]).await.expect("a lease").proxy_id, "ns/p00000");
    // p00000 is full now: out of the index.
    assert_eq!(state().await, (n, n - 1, vec![Some(n), Some(0)]));

    b.publish_view(&[entry("ns/r", true, 0, 1)]).await.expect("publish");
    assert_eq!(state().await, (1, 1, vec![Some(1), Some(0)]));

    a.publish_view(&fleet(Some(1))).await.expect("publish");
    assert_eq!(
        state().await,
        (n, n - 2, vec![Some(n), Some(1)]),
        "r gone, p00001 sick, p00000 full"
    );
    assert_eq!(scoped(&a, &[]).await.expect("a lease").proxy_id, "ns/p00002");
}

/// A proxy's score in the index: its active leases × 2^32 + latency; `None` when not in it.
async fn score(c: &mut redis::aio::MultiplexedConnection, prefix: &str, id: &str) -> Option<u64> {
    redis::cmd("ZSCORE")
        .arg(format!("{}free", tag(prefix)))
        .arg(id)
        .query_async(c)
        .await
        .unwrap()
}

const SHIFT: u64 = 1 << 32;

/// Proxies written into the view by another replica while this one published (as two
/// replicas may around a change of leader) are removed by its next publication but one.
#[tokio::test]
async fn proxies_another_replica_wrote_into_the_view_are_removed() {
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let s = RedisStore::new(&url, &prefix, suite::COOLDOWN).expect("a store");
    let view = [entry("ns/a", true, 1, 2), entry("ns/b", true, 2, 2)];
    s.publish_view(&view).await.expect("publish");
    let (mut c, _) = keys_under(&url, &prefix).await;
    let t = tag(&prefix);
    let _: () = redis::cmd("HSET")
        .arg(format!("{t}view"))
        .arg("ns/stray")
        .arg("1,0,1,1")
        .query_async(&mut c)
        .await
        .unwrap();
    let held = async |c: &mut redis::aio::MultiplexedConnection| -> Vec<String> {
        let mut ids: Vec<String> = redis::cmd("HKEYS")
            .arg(format!("{t}view"))
            .query_async(c)
            .await
            .unwrap();
        ids.sort();
        ids
    };
    // The next publication sends changes (none), and finds the view larger than its own.
    s.publish_view(&view).await.expect("publish");
    assert_eq!(held(&mut c).await, ["ns/a", "ns/b", "ns/stray"]);
    // So the one after is whole, and removes it.
    s.publish_view(&view).await.expect("publish");
    assert_eq!(held(&mut c).await, ["ns/a", "ns/b"]);
}

/// A proxy's place in the index is counted from its active set again when that set changed
/// behind the scripts' back (its TTL ran out, Redis evicted it): at the release of a lease it
/// no longer holds, and at every whole publication.
#[tokio::test]
async fn an_index_that_drifted_from_the_active_sets_is_mended() {
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let (a, b) = (
        RedisStore::new(&url, &prefix, suite::COOLDOWN).expect("a store"),
        RedisStore::new(&url, &prefix, suite::COOLDOWN).expect("a store"),
    );
    a.publish_view(&[entry("ns/a", true, 7, 5)]).await.expect("publish");
    let (mut c, _) = keys_under(&url, &prefix).await;
    let t = tag(&prefix);
    let first = scoped(&a, &[]).await.expect("a lease");
    scoped(&a, &[]).await.expect("a lease");
    assert_eq!(score(&mut c, &prefix, "ns/a").await, Some(2 * SHIFT + 7));
    // The set goes; the release of a lease it held counts ns/a afresh: no lease.
    let _: () = redis::cmd("DEL")
        .arg(format!("{t}active:ns/a"))
        .query_async(&mut c)
        .await
        .unwrap();
    a.release(&first.lease_id).await.expect("released");
    assert_eq!(score(&mut c, &prefix, "ns/a").await, Some(7));
    // A score set wrong by hand is mended by another replica's whole publication.
    let _: () = redis::cmd("ZADD")
        .arg(format!("{t}free"))
        .arg(3 * SHIFT + 7)
        .arg("ns/a")
        .query_async(&mut c)
        .await
        .unwrap();
    b.publish_view(&[entry("ns/a", true, 7, 5)]).await.expect("publish");
    assert_eq!(score(&mut c, &prefix, "ns/a").await, Some(7));
}
