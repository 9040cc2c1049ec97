//! Two discovery servers sharing one real redis-server (with the append-only file the docs
//! recommend): 64 clients split across them never push a proxy past its capacity, stopping
//! one server loses none of its leases, and a Redis crash mid-run gives 503s while it is down,
//! no double grant, and service again once it is back.
//!
//! The redis-server is this test's own (it is killed and started again). Without the binary the
//! tests skip, unless `EGRESS_REAL_BACKENDS_REQUIRED=1` (`cargo xtask test`, CI).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixed, info, serve_on_loopback};
use egress_discovery::client::{AcquireRequest, Client, ClientError, ListFilter, ReportResult};
use egress_discovery::{DiscoveryApi, ProxyInfo};
use egress_lease::LeaseStore;
use egress_lease_redis::RedisStore;
use egress_lease_redis::local::LocalRedis;
use tokio_util::sync::DropGuard;

const CAPACITY: i32 = 3;

fn local_redis() -> Option<LocalRedis> {
    if egress_lease_redis::local::binary().is_none() {
        assert!(
            !std::env::var("EGRESS_REAL_BACKENDS_REQUIRED").is_ok_and(|v| v == "1"),
            "redis-server is required here (cargo xtask test installs it)"
        );
        eprintln!("SKIPPED: no redis-server");
        return None;
    }
    Some(LocalRedis::start().expect("redis-server starts"))
}

fn fleet() -> Vec<ProxyInfo> {
    (0..8)
        .map(|i| {
            info(
                &format!("crawl/p{i}"),
                true,
                i64::from(i) * 10,
                CAPACITY,
                &[("geo", "eu")],
            )
        })
        .collect()
}

fn store(url: &str, prefix: &str) -> Arc<dyn LeaseStore> {
    Arc::new(RedisStore::new(url, prefix, Duration::from_secs(900)).expect("a store"))
}

/// A discovery server over its own store object (its own connection) on the shared Redis.
async fn replica(url: &str, prefix: &str) -> (Client, DropGuard) {
    let api = DiscoveryApi {
        directory: Arc::new(Fixed::new(fleet())),
        store: store(url, prefix),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::None,
        refusals: None,
    };
    let (base, guard) = serve_on_loopback(api).await;
    (Client::new(&base, None).expect("a client"), guard)
}

/// Leases the test holds, by proxy: never more than the capacity if nothing is granted twice.
#[derive(Default)]
struct Held(Mutex<HashMap<String, i32>>);

impl Held {
    fn take(&self, proxy: &str) {
        let mut held = self.0.lock().unwrap();
        let n = held.entry(proxy.to_owned()).or_default();
        *n += 1;
        assert!(*n <= CAPACITY, "{proxy} granted past its capacity: {n}");
    }
    fn give_back(&self, proxy: &str) {
        *self.0.lock().unwrap().entry(proxy.to_owned()).or_default() -= 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_clients_on_two_replicas_never_exceed_any_capacity() {
    let Some(redis) = local_redis() else { return };
    let (a, _a) = replica(&redis.url(), "two:").await;
    let (b, _b) = replica(&redis.url(), "two:").await;
    let (held, granted, refused) = (
        Arc::new(Held::default()),
        Arc::new(Mutex::new(0)),
        Arc::new(Mutex::new(0)),
    );
    let mut clients = Vec::new();
    for i in 0..64 {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (held, granted, refused) = (held.clone(), granted.clone(), refused.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..20 {
                match client.acquire(&AcquireRequest::default()).await {
                    Ok(lease) => {
                        held.take(&lease.proxy.id);
                        assert!(lease.proxy.active_leases <= CAPACITY as u64, "{lease:?}");
                        *granted.lock().unwrap() += 1;
                        // Held a while so grants overlap. Counted down before the release is
                        // sent: the count never runs ahead of what Redis holds, so a count over
                        // the capacity is a double grant, never the test's own lag.
                        for _ in 0..3 {
                            tokio::task::yield_now().await;
                        }
                        held.give_back(&lease.proxy.id);
                        client.release(&lease.lease_id).await.expect("release");
                    }
                    Err(ClientError::NoMatch { at_capacity, .. }) => {
                        assert_eq!(at_capacity, 8, "refused only when every proxy is full");
                        *refused.lock().unwrap() += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    for c in clients {
        c.await.expect("a client");
    }
    let (granted, refused) = (*granted.lock().unwrap(), *refused.lock().unwrap());
    assert_eq!(granted + refused, 64 * 20);
    assert!(granted > 0);
    // Both replicas see the same, empty, fleet afterwards.
    for replica in [&a, &b] {
        let proxies = replica.list(&ListFilter::default()).await.expect("list");
        assert!(proxies.iter().all(|p| p.active_leases == 0), "{proxies:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_loses_no_lease() {
    let Some(redis) = local_redis() else { return };
    let (a, a_guard) = replica(&redis.url(), "stop:").await;
    let (b, _b) = replica(&redis.url(), "stop:").await;
    // Fill every slot through a.
    let mut leases = Vec::new();
    for _ in 0..8 * CAPACITY {
        leases.push(a.acquire(&AcquireRequest::default()).await.expect("a lease"));
    }
    drop(a_guard);
    drop(a);
    // b knows every one of a's leases: it grants nothing more, and can report and release them.
    match b.acquire(&AcquireRequest::default()).await {
        Err(ClientError::NoMatch { at_capacity: 8, .. }) => {}
        other => panic!("b granted past capacity: {other:?}"),
    }
    let listed = b.list(&ListFilter::default()).await.expect("list");
    assert!(listed.iter().all(|p| p.active_leases == CAPACITY as u64), "{listed:?}");
    b.report(&leases[0].lease_id, ReportResult::RateLimited, Some("shop.example"))
        .await
        .expect("a's lease is known to b");
    b.release(&leases[0].lease_id).await.expect("release");
    let again = b.acquire(&AcquireRequest::default()).await.expect("the freed slot");
    assert_eq!(again.proxy.id, leases[0].proxy.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_crash_gives_503s_then_service_and_never_a_double_grant() {
    let Some(mut redis) = local_redis() else { return };
    let (a, _a) = replica(&redis.url(), "crash:").await;
    let (b, _b) = replica(&redis.url(), "crash:").await;
    // Half the slots held across the crash.
    let mut kept = Vec::new();
    for i in 0..4 * CAPACITY {
        let client = if i % 2 == 0 { &a } else { &b };
        kept.push(client.acquire(&AcquireRequest::default()).await.expect("a lease"));
    }
    redis.kill();
    for client in [&a, &b] {
        match client.acquire(&AcquireRequest::default()).await {
            Err(ClientError::StoreUnavailable(message)) => assert!(message.contains("try again"), "{message}"),
            other => panic!("expected 503 store_unavailable while Redis is down, got {other:?}"),
        }
        assert!(matches!(
            client.list(&ListFilter::default()).await,
            Err(ClientError::StoreUnavailable(_))
        ));
        assert!(matches!(
            client.release(&kept[0].lease_id).await,
            Err(ClientError::StoreUnavailable(_))
        ));
    }
    redis.start_again().expect("redis-server restarts");
    // Each replica finds Redis again by itself; the leases from before the crash are still held.
    let mut held: HashMap<String, u64> = HashMap::new();
    for lease in &kept {
        *held.entry(lease.proxy.id.clone()).or_default() += 1;
    }
    for client in [&a, &b] {
        let mut listed = None;
        for _ in 0..100 {
            match client.list(&ListFilter::default()).await {
                Ok(l) => {
                    listed = Some(l);
                    break;
                }
                Err(ClientError::StoreUnavailable(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{e}"),
            }
        }
        let listed = listed.expect("the replica recovered within 10 s");
        for p in &listed {
            assert_eq!(p.active_leases, held.get(&p.id).copied().unwrap_or(0), "{p:?}");
        }
    }
    // The rest of the slots, and not one more.
    let mut more = 0;
    loop {
        let client = if more % 2 == 0 { &a } else { &b };
        match client.acquire(&AcquireRequest::default()).await {
            Ok(lease) => {
                *held.entry(lease.proxy.id.clone()).or_default() += 1;
                more += 1;
            }
            Err(ClientError::NoMatch { at_capacity: 8, .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(more, 4 * CAPACITY, "exactly the free slots");
    assert!(held.values().all(|n| *n == CAPACITY as u64), "{held:?}");
}
