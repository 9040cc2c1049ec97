//! Two discovery servers sharing one real redis-server (with the append-only file the docs
//! recommend), or a real Redis Cluster: 64 clients split across them never push a proxy past
//! its capacity, stopping one server loses none of its leases, a Redis crash mid-run gives 503s
//! while it is down, no double grant, and service again once it is back, and a cluster master
//! killed under load grants no slot twice and serves again once its replica has taken over.
//! The servers publish their proxies as the view, as the leader does, so empty selectors are
//! answered from the store's index.
//!
//! The Redis servers are this test's own (they are killed and started again). Without the
//! binaries the tests skip, unless `EGRESS_REAL_BACKENDS_REQUIRED=1` (`cargo xtask test`, CI).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixed, info, serve_on_loopback};
use egress_discovery::client::{AcquireRequest, Client, ClientError, ListFilter, ReportResult};
use egress_discovery::{DiscoveryApi, ProxyInfo};
use egress_lease::LeaseStore;
use egress_lease_redis::RedisStore;
use egress_testkit::redis::{LocalCluster, LocalRedis};
use tokio_util::sync::DropGuard;

const CAPACITY: i32 = 3;

#[test]
fn the_test_clusters_are_named_in_the_store_s_url_syntax() {
    // testkit links no workspace crate, so it spells the schemes out; these are the store's.
    assert_eq!(
        egress_testkit::redis::CLUSTER_SCHEME,
        egress_lease_redis::CLUSTER_SCHEME
    );
    assert_eq!(
        egress_testkit::redis::TLS_CLUSTER_SCHEME,
        egress_lease_redis::TLS_CLUSTER_SCHEME
    );
}

fn local_redis() -> Option<LocalRedis> {
    if !egress_testkit::redis::available_for_test() {
        return None;
    }
    Some(LocalRedis::start().expect("redis-server starts"))
}

/// A cluster of `masters` masters with `replicas` replicas each, or `None` (skip).
fn local_cluster(masters: usize, replicas: usize) -> Option<LocalCluster> {
    let local_redis = local_redis()?;
    drop(local_redis);
    Some(LocalCluster::start(masters, replicas, "always").expect("a Redis Cluster forms"))
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

/// A discovery server over its own store object (its own connection) on the shared Redis,
/// having published its proxies as the view.
async fn replica(url: &str, prefix: &str) -> (Client, DropGuard) {
    let store = store(url, prefix);
    store
        .publish_view(&egress_discovery::view::entries(&fleet().into_iter().collect()))
        .await
        .expect("the view published");
    let api = DiscoveryApi {
        directory: Arc::new(Fixed::new(fleet())),
        store,
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::None,
        refusals: None,
        // Up to 48 callers at once, all the client `default`: the failover is what is tested.
        admission: common::roomy_admission(),
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
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

/// The server's list once its store answers again (asked every 100 ms until `patience` has
/// passed); `None` if it did not within that.
async fn listed_once_served(client: &Client, patience: Duration) -> Option<Vec<egress_discovery::client::ProxyView>> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match client.list(&ListFilter::default()).await {
            Ok(listed) => return Some(listed),
            Err(ClientError::StoreUnavailable(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(ClientError::StoreUnavailable(_)) => return None,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_clients_on_two_replicas_never_exceed_any_capacity() {
    let Some(redis) = local_redis() else { return };
    sixty_four_clients_on_two_replicas(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_clients_on_two_replicas_never_exceed_any_capacity_on_a_cluster() {
    let Some(cluster) = local_cluster(3, 0) else { return };
    sixty_four_clients_on_two_replicas(&cluster.url()).await;
}

async fn sixty_four_clients_on_two_replicas(url: &str) {
    let (a, _a) = replica(url, "two:").await;
    let (b, _b) = replica(url, "two:").await;
    let (held, granted, refused) = (
        Arc::new(Held::default()),
        Arc::new(Mutex::new(0)),
        Arc::new(Mutex::new(0)),
    );
    let mut clients = Vec::new();
    for i in 0..64 {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (held, granted, refused) = (held.clone(), granted.clone(), refused.clone());
        // Half the clients select by an indexed attribute every proxy has: the installation's
        // index and the attribute's are kept in step by the same grants and releases.
        let asked = AcquireRequest {
            selector: if i % 4 < 2 {
                Default::default()
            } else {
                [("geo".to_owned(), "eu".to_owned())].into()
            },
            ..Default::default()
        };
        clients.push(tokio::spawn(async move {
            for _ in 0..20 {
                match client.acquire(&asked).await {
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
    a_stopped_replica_loses_nothing(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_loses_no_lease_on_a_cluster() {
    let Some(cluster) = local_cluster(3, 0) else { return };
    a_stopped_replica_loses_nothing(&cluster.url()).await;
}

async fn a_stopped_replica_loses_nothing(url: &str) {
    let (a, a_guard) = replica(url, "stop:").await;
    let (b, _b) = replica(url, "stop:").await;
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
        *held.entry(lease.proxy.id.to_string()).or_default() += 1;
    }
    for client in [&a, &b] {
        let listed = listed_once_served(client, Duration::from_secs(10))
            .await
            .expect("the replica recovered within 10 s");
        for p in &listed {
            assert_eq!(p.active_leases, held.get(&*p.id).copied().unwrap_or(0), "{p:?}");
        }
    }
    // The rest of the slots, and not one more.
    let mut more = 0;
    loop {
        let client = if more % 2 == 0 { &a } else { &b };
        match client.acquire(&AcquireRequest::default()).await {
            Ok(lease) => {
                *held.entry(lease.proxy.id.to_string()).or_default() += 1;
                more += 1;
            }
            Err(ClientError::NoMatch { at_capacity: 8, .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(more, 4 * CAPACITY, "exactly the free slots");
    assert!(held.values().all(|n| *n == CAPACITY as u64), "{held:?}");
}

/// Redis Cluster failover under load: three masters with two replicas each, grants answered
/// only once a replica has them (`wait=1`). While 48 clients on two servers acquire and release,
/// the replicas of the store's slot's master are stopped: 16 keepers then try to take a lease,
/// and none is answered (without `wait` they all would be). The master is killed and the
/// replicas let go; one takes over. No proxy is ever held past its capacity, and once the slot
/// has a master with a replica, calls begun after both servers found it get no 503.
///
/// What this cannot show on loopback: a grant lost because the dead master never sent it. The
/// kernel delivers whatever the master wrote to a stopped replica's socket once it runs again,
/// so here nothing is lost even without `wait`; `wait` is what makes it so on a real network.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_master_killed_under_load_grants_no_slot_twice() {
    const PATIENCE: Duration = Duration::from_secs(60);
    let Some(mut cluster) = local_cluster(3, 2) else { return };
    let url = format!("{}?wait=1", cluster.url());
    let prefix = "failover:";
    let (a, _a) = replica(&url, prefix).await;
    let (b, _b) = replica(&url, prefix).await;
    let held = Arc::new(Held::default());
    let (granted, mut grants) = tokio::sync::watch::channel(0usize);
    let granted = Arc::new(granted);
    // 503s of calls begun once both servers had found the slot's new master.
    let (served, late_503s) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let stop = tokio_util::sync::CancellationToken::new();
    // Short leases: those whose release the failover lost hold their slots only this long.
    let short = AcquireRequest {
        ttl_seconds: Some(10),
        ..AcquireRequest::default()
    };
    let mut clients = Vec::new();
    for i in 0..48 {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (held, granted, stop, short) = (held.clone(), granted.clone(), stop.clone(), short.clone());
        let (served, late_503s) = (served.clone(), late_503s.clone());
        clients.push(tokio::spawn(async move {
            let late = |began_served: bool| {
                if began_served {
                    late_503s.fetch_add(1, Ordering::Relaxed);
                }
            };
            while !stop.is_cancelled() {
                let began_served = served.load(Ordering::Relaxed);
                match client.acquire(&short).await {
                    Ok(lease) => {
                        held.take(&lease.proxy.id);
                        granted.send_modify(|n| *n += 1);
                        for _ in 0..3 {
                            tokio::task::yield_now().await;
                        }
                        held.give_back(&lease.proxy.id);
                        // A release lost to the failover leaves the lease held until its
                        // expiry: fewer slots, never more.
                        let began_served = served.load(Ordering::Relaxed);
                        match client.release(&lease.lease_id).await {
                            Ok(()) => {}
                            Err(ClientError::StoreUnavailable(_)) => late(began_served),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    Err(ClientError::NoMatch { .. }) => {}
                    Err(ClientError::StoreUnavailable(_)) => late(began_served),
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    tokio::time::timeout(PATIENCE, grants.wait_for(|n| *n >= 300))
        .await
        .expect("300 grants within a minute")
        .expect("grants before the failover");
    let tag = format!("{{{prefix}}}");
    let master = cluster
        .master_of(&tag, 2)
        .expect("the slot's master, with its two replicas");
    let replicas = cluster.replicas_of(master);
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    for r in &replicas {
        cluster.pause(*r, true).expect("a replica stopped");
    }
    // Grants now reach no replica: with wait=1 none is answered. What a keeper is answered, it
    // holds to the end.
    let keepers: Vec<_> = (0..16)
        .map(|i| {
            let (client, held) = (if i % 2 == 0 { a.clone() } else { b.clone() }, held.clone());
            tokio::spawn(async move {
                match client.acquire(&AcquireRequest::default()).await {
                    Ok(lease) => {
                        held.take(&lease.proxy.id);
                        Some(lease.lease_id)
                    }
                    Err(ClientError::StoreUnavailable(_) | ClientError::NoMatch { .. }) => None,
                    Err(e) => panic!("{e}"),
                }
            })
        })
        .collect();
    let mut kept = Vec::new();
    for k in keepers {
        kept.extend(k.await.expect("a keeper"));
    }
    assert!(
        kept.is_empty(),
        "{} grants answered while no replica could have them",
        kept.len()
    );
    cluster.kill(master);
    for r in &replicas {
        cluster.pause(*r, false).expect("a replica going on");
    }
    let cluster = tokio::task::spawn_blocking(move || {
        // A replica is promoted after the node timeout and an election; the other one then
        // follows it.
        let deadline = std::time::Instant::now() + PATIENCE;
        while cluster.master_of(&tag, 1).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "no replica took over the slot within a minute"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    })
    .await
    .expect("waiting for the failover");
    // The slot has a master again: each server finds it (the client library reads the slot map
    // again, or the connection is made again), then serves without a 503.
    for client in [&a, &b] {
        listed_once_served(client, PATIENCE)
            .await
            .expect("a server did not find the new master within a minute");
    }
    served.store(true, Ordering::Relaxed);
    let at_failover = *grants.borrow();
    tokio::time::timeout(PATIENCE, grants.wait_for(|n| *n >= at_failover + 300))
        .await
        .expect("300 grants after the failover within a minute")
        .expect("grants after the failover");
    stop.cancel();
    for c in clients {
        c.await.expect("a client: no proxy past its capacity");
    }
    assert_eq!(
        late_503s.load(Ordering::Relaxed),
        0,
        "503s for calls begun after both servers had found the slot's new master"
    );
    drop(cluster);
}

/// A client scoped to pool `a`, on a store whose index holds the whole installation (the view
/// published) with pool `b`'s members at its head: with an empty selector it is granted only
/// pool `a`'s members (crates/discovery/tests/scopes.rs shows it never asks the index), and
/// refused with the counts of those alone; an unscoped client still gets the index's head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_client_is_granted_only_proxies_of_its_scope_though_the_index_holds_every_one() {
    use egress_discovery::{Auth, ClientName, ClientScope, Scopes, TokenSet};
    let Some(redis) = local_redis() else { return };
    let fleet: Vec<ProxyInfo> = ["a", "a", "b", "b"]
        .iter()
        .enumerate()
        .map(|(i, pool)| ProxyInfo {
            pool_role: Some("active"),
            pool: Some((*pool).into()),
            ..info(
                &format!("crawl/{pool}{i}"),
                true,
                if *pool == "b" { 0 } else { 10 },
                CAPACITY,
                &[("pool", pool)],
            )
        })
        .collect();
    let store = store(&redis.url(), "scoped:");
    store
        .publish_view(&egress_discovery::view::entries(&fleet.iter().cloned().collect()))
        .await
        .expect("the view published");
    let scopes = Scopes::default();
    let pool_a = ClientScope::new(None, Some(vec!["a".into()])).unwrap();
    scopes.set([("team-a".to_owned(), Arc::new(pool_a))].into());
    let tokens = [
        (ClientName::parse("team-a").unwrap(), vec!["team-a-token".to_owned()]),
        (ClientName::default(), vec!["default-token".to_owned()]),
    ];
    let api = DiscoveryApi {
        directory: Arc::new(Fixed::new(fleet)),
        store,
        max_ttl: Duration::from_secs(3600),
        auth: Auth::Tokens(Arc::new(TokenSet::of_clients(&tokens.into()))),
        refusals: None,
        admission: egress_discovery::Admission::default(),
        scopes,
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
    };
    let (base, _guard) = serve_on_loopback(api).await;
    let team_a = Client::new(&base, Some("team-a-token".into())).unwrap();
    for _ in 0..2 * CAPACITY {
        let lease = team_a.acquire(&AcquireRequest::default()).await.expect("a lease");
        assert!(lease.proxy.id.starts_with("crawl/a"), "{}", lease.proxy.id);
    }
    match team_a.acquire(&AcquireRequest::default()).await {
        Err(ClientError::NoMatch {
            considered,
            at_capacity,
            ..
        }) => assert_eq!((considered, at_capacity), (2, 2)),
        other => panic!("{other:?}"),
    }
    let unscoped = Client::new(&base, Some("default-token".into())).unwrap();
    let lease = unscoped.acquire(&AcquireRequest::default()).await.expect("a lease");
    assert!(lease.proxy.id.starts_with("crawl/b"), "{}", lease.proxy.id);
}
