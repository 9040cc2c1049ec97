//! The lease state in shards, on the test Redis and on the test cluster: an acquire without a
//! pool walks every shard, one with a pool goes to the pool's, a lease id leads every later
//! call to its shard, and on a cluster the shards land on different masters.

use std::collections::BTreeSet;
use std::sync::Arc;

use egress_lease::testing as suite;
use egress_lease::{Grant, LeaseRequest, LeaseStore, ManualClock, NoMatch, Scope, ViewEntry};
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
async fn on_a_cluster_sixteen_pools_land_on_more_than_one_master() {
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
    assert_eq!(homes.len(), 16, "{homes:?}");
    let masters: BTreeSet<&str> = homes.iter().map(|h| h.master.as_str()).collect();
    // 16 shards in random slots all on one of three masters: about one chance in 14 million.
    assert!(masters.len() > 1, "every shard on {masters:?}");
}
