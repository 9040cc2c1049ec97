//! The lease state in shards, on the test Redis and on the test cluster: an acquire without a
//! pool walks every shard, one with a pool goes to the pool's, a pool's shard is chosen once for
//! every replica, a lease id leads every later call to its shard, and on a cluster the pools
//! spread evenly over the masters.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use egress_lease::testing as suite;
use egress_lease::{Candidate, Grant, LeaseRequest, LeaseStore, ManualClock, NoMatch, Scope, ViewEntry};
use egress_lease_redis::RedisStore;

mod common;
use common::{cluster_url, fresh_prefix, redis_url};

/// A store on `url` under `prefix`, the unpooled proxies over four shards.
fn sharded(url: &str, prefix: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::new(url, prefix, suite::COOLDOWN)
        .and_then(|s| s.with_unpooled_shards(4))
        .expect("a store")
        .with_clock(Arc::new(clock.clone()))
}

/// A healthy proxy of capacity 1 in `pool` (none: unpooled), in its pool's index.
fn entry(id: &str, pool: Option<&str>) -> ViewEntry {
    ViewEntry {
        id: id.into(),
        healthy: true,
        latency_millis: 1,
        max_leases: 1,
        offered: true,
        indexed: pool.map(|p| vec![format!("pool={p}")]).unwrap_or_default(),
        pool: pool.map(str::to_owned),
    }
}

/// An acquire scoped to `scope`, without candidates: what the published view alone answers.
async fn from_view(s: &RedisStore, scope: Scope) -> Result<Grant, NoMatch> {
    let req = LeaseRequest {
        scope,
        ..suite::req(None)
    };
    s.acquire(&mut std::iter::empty(), &req)
        .await
        .expect("the store answers")
}

/// Four pools of one proxy and eight unpooled ones.
fn fleet() -> Vec<ViewEntry> {
    let pooled = (0..4).map(|i| entry(&format!("ns/pool-{i}"), Some(&format!("pool-{i}"))));
    let unpooled = (0..8).map(|i| entry(&format!("ns/free-{i}"), None));
    pooled.chain(unpooled).collect()
}

#[tokio::test]
async fn acquires_without_a_pool_walk_every_shard_and_add_up_their_refusals() {
    for url in [redis_url(), cluster_url()].into_iter().flatten() {
        let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
        let a = sharded(&url, &prefix, &clock);
        a.publish_view(&fleet()).await.expect("publish");
        let mut granted = BTreeSet::new();
        let mut leases = Vec::new();
        for _ in 0..12 {
            let g = from_view(&a, Scope::Installation)
                .await
                .expect("a proxy with room somewhere");
            assert!(granted.insert(g.proxy_id.clone()), "{url}: {} leased twice", g.proxy_id);
            leases.push(g);
        }
        assert_eq!(
            from_view(&a, Scope::Installation)
                .await
                .expect_err("every proxy is full"),
            NoMatch {
                considered: 12,
                at_capacity: 12,
                in_cooldown: 0,
                unhealthy: 0
            },
            "{url}: the refusal counts every shard's proxies"
        );
        // The leases are spread over the shards: the four pools' and the unpooled four.
        let shards: BTreeSet<&str> = leases.iter().map(|g| &g.lease_id[24..]).collect();
        assert!(shards.len() >= 6, "{url}: leases in {} shards", shards.len());
        // Another replica, which has used no shard yet, releases one by its id alone.
        let b = sharded(&url, &prefix, &clock);
        let freed = &leases[0];
        b.release(&freed.lease_id).await.expect("released");
        assert_eq!(
            from_view(&b, Scope::Installation)
                .await
                .expect("the freed one")
                .proxy_id,
            freed.proxy_id
        );
        assert_eq!(b.active_total().await.expect("answers"), 12, "{url}");
    }
}

#[tokio::test]
async fn a_pool_selector_is_answered_by_its_pools_shard_alone() {
    for url in [redis_url(), cluster_url()].into_iter().flatten() {
        let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
        let s = sharded(&url, &prefix, &clock);
        s.publish_view(&fleet()).await.expect("publish");
        let pool_2 = Scope::Indexed(vec!["pool=pool-2".into()]);
        let g = from_view(&s, pool_2.clone()).await.expect("pool-2's proxy");
        assert_eq!(g.proxy_id, "ns/pool-2");
        let refused = from_view(&s, pool_2).await.expect_err("pool-2 is full");
        assert_eq!(
            (refused.considered, refused.at_capacity),
            (1, 1),
            "{url}: only the pool's proxy counts"
        );
        // Its lease is in a shard of its own, as is its proxy's active set.
        let tags = s.shard_tags();
        assert!(tags.len() >= 5, "{url}: {tags:?}");
        let placed = egress_lease::ProxyRef {
            id: "ns/pool-2",
            pool: Some("pool-2"),
        };
        assert_eq!(s.active_leases(&[placed]).await.expect("answers"), [1]);
        let unpooled = egress_lease::ProxyRef::unpooled("ns/pool-2");
        assert_eq!(
            s.active_leases(&[unpooled]).await.expect("answers"),
            [0],
            "{url}: not where an unpooled proxy of that id would be"
        );
    }
}

#[tokio::test]
async fn on_a_cluster_sixteen_pools_split_evenly_over_the_masters() {
    let Some(url) = cluster_url() else { return };
    let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
    let s = sharded(&url, &prefix, &clock);
    let pools: Vec<ViewEntry> = (0..16)
        .map(|i| entry(&format!("ns/m{i:02}"), Some(&format!("pool-{i:02}"))))
        .collect();
    s.publish_view(&pools).await.expect("publish");
    for i in 0..16 {
        let scope = Scope::Indexed(vec![format!("pool=pool-{i:02}")]);
        from_view(&s, scope).await.expect("each pool's proxy");
    }
    let homes = s.shard_homes().await.expect("the cluster tells");
    assert_eq!(homes.len(), 16, "a shard each: {homes:?}");
    let mut per_master: BTreeMap<&str, usize> = BTreeMap::new();
    for h in &homes {
        *per_master.entry(h.master.as_str()).or_default() += 1;
    }
    let mut counts: Vec<usize> = per_master.into_values().collect();
    counts.sort_unstable();
    assert_eq!(counts, [5, 5, 6], "{homes:?}");
}

#[tokio::test]
async fn a_pools_shard_is_chosen_once_and_every_replica_places_the_pool_alike() {
    for url in [redis_url(), cluster_url()].into_iter().flatten() {
        let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
        // Replica a leases blue's proxy among its candidates before any publication: the
        // acquire chooses blue's shard.
        let a = sharded(&url, &prefix, &clock);
        let member = Candidate {
            id: "ns/blue-0",
            healthy: true,
            latency_millis: 1,
            max_leases: 1,
            pool: Some("blue"),
        };
        let g = a
            .acquire(&mut std::iter::once(member), &suite::req(None))
            .await
            .expect("answers")
            .expect("blue's proxy");
        // Replica b publishes blue among many other pools, whose load would have sent a new
        // blue elsewhere on the cluster: blue stays where a chose, so b finds a's lease.
        let b = sharded(&url, &prefix, &clock);
        let mut view: Vec<ViewEntry> = (0..24)
            .map(|i| entry(&format!("ns/m{i}"), Some(&format!("other-{i}"))))
            .collect();
        view.push(entry("ns/blue-0", Some("blue")));
        b.publish_view(&view).await.expect("publish");
        let blue = egress_lease::ProxyRef {
            id: "ns/blue-0",
            pool: Some("blue"),
        };
        assert_eq!(b.active_leases(&[blue]).await.expect("answers"), [1], "{url}");
        let refused = from_view(&b, Scope::Indexed(vec!["pool=blue".into()]))
            .await
            .expect_err("blue's only proxy is a's");
        assert_eq!((refused.considered, refused.at_capacity), (1, 1), "{url}");
        b.release(&g.lease_id).await.expect("released");
        let again = from_view(&b, Scope::Indexed(vec!["pool=blue".into()])).await;
        assert_eq!(again.expect("free again").proxy_id, "ns/blue-0", "{url}");
    }
}

#[tokio::test]
async fn a_pool_selector_naming_no_pool_stores_nothing() {
    for url in [redis_url(), cluster_url()].into_iter().flatten() {
        let (prefix, clock) = (fresh_prefix(), ManualClock::new(suite::start()));
        let s = sharded(&url, &prefix, &clock);
        s.publish_view(&fleet()).await.expect("publish");
        let published = s.shard_tags();
        for i in 0..20 {
            let made_up = Scope::Indexed(vec![format!("pool=made-up-{i}")]);
            let refused = from_view(&s, made_up).await.expect_err("no such pool");
            assert_eq!(refused.considered, 0, "{url}");
        }
        assert_eq!(s.shard_tags(), published, "{url}: no shard called for a made-up pool");
    }
    let Some(url) = redis_url() else { return };
    let prefix = fresh_prefix();
    let s = sharded(&url, &prefix, &ManualClock::new(suite::start()));
    s.publish_view(&fleet()).await.expect("publish");
    for i in 0..20 {
        let made_up = Scope::Indexed(vec![format!("pool=made-up-{i}")]);
        from_view(&s, made_up).await.expect_err("no such pool");
    }
    let mut c = redis::Client::open(url.as_str())
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    let mut stored: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{prefix}}}pool:*"))
        .query_async(&mut c)
        .await
        .expect("answers");
    stored.sort();
    let fleets: Vec<String> = (0..4).map(|i| format!("{{{prefix}}}pool:pool-{i}")).collect();
    assert_eq!(
        stored, fleets,
        "the fleet's pools' shards, and nothing for a made-up one"
    );
}
