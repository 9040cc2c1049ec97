//! The discovery API's figures, for `cargo xtask bench`: on loopback, with 10 000 proxies and 64
//! concurrent clients each acquiring and releasing leases in a loop, the pairs per second, the
//! p50/p99 latency of each request (acquire, release) and of a whole pair; next to the same
//! clients against a trivial hyper handler measured in the same run (this machine's ceiling),
//! and the same API on the Redis lease store (a local redis-server with the recommended
//! append-only file, `appendfsync always`). Then the in-memory and the Redis runs again with the
//! bench (clients and API, on a runtime of one worker) on one core and Redis on the other, as
//! Redis runs in production on a machine of its own: unpinned, Redis and the API take turns on
//! both cores and the store's ratio to the in-memory store also measures that sharing. Then
//! the in-memory and the Redis (`appendfsync always`) runs with a selector on an indexed
//! attribute: `{"pool": "pool-07"}` (a sixteenth of the fleet) and `{"geo": "eu"}` (half),
//! unpinned and pinned. Prints one `|`-separated row.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use egress_discovery::{DiscoveryApi, Fleet, ProxyDirectory, ProxyInfo, serve};
use egress_lease::{LeaseStore, MemoryStore, SystemClock};
use http_body_util::Full;
use tokio_util::sync::CancellationToken;

const PROXIES: usize = 10_000;
const CLIENTS: usize = 64;
const MEASURE: Duration = Duration::from_secs(10);

struct FixedFleet(Arc<Fleet>);

impl ProxyDirectory for FixedFleet {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        Ok(self.0.clone())
    }
}

async fn trivial_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .status(201)
                            .body(Full::new(Bytes::from_static(b"{}")))
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Latencies of one run, sorted.
struct Figures {
    pairs_per_second: f64,
    acquire: Vec<Duration>,
    release: Vec<Duration>,
    pair: Vec<Duration>,
}

/// The q-quantile of sorted latencies, in milliseconds.
fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or_default().as_secs_f64() * 1e3
}

/// The acquire bodies of the runs: no selector, a pool's, a region's.
const ANY: &str = "{}";
const POOL: &str = r#"{"selector": {"pool": "pool-07"}}"#;
const GEO: &str = r#"{"selector": {"geo": "eu"}}"#;

/// 64 clients doing acquire+release pairs for MEASURE, each acquire with `body`.
async fn load(base: String, lease_paths: bool, body: &'static str) -> Figures {
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let base = base.clone();
        clients.push(tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            let mut latencies = Vec::new();
            while started.elapsed() < MEASURE {
                let t = Instant::now();
                let grant = http.post(format!("{base}/v1/leases")).body(body).send().await.unwrap();
                let id = if lease_paths {
                    let v: serde_json::Value = grant.json().await.unwrap();
                    v["leaseID"].as_str().unwrap_or("none").to_string()
                } else {
                    let _ = grant.bytes().await;
                    "none".to_string()
                };
                let acquired = t.elapsed();
                let _ = http
                    .delete(format!("{base}/v1/leases/{id}"))
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await;
                let pair = t.elapsed();
                latencies.push((acquired, pair - acquired, pair));
            }
            latencies
        }));
    }
    let (mut acquire, mut release, mut pair) = (Vec::new(), Vec::new(), Vec::new());
    for c in clients {
        for (a, r, p) in c.await.unwrap() {
            acquire.push(a);
            release.push(r);
            pair.push(p);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    acquire.sort();
    release.sort();
    pair.sort();
    Figures {
        pairs_per_second: pair.len() as f64 / secs,
        acquire,
        release,
        pair,
    }
}

/// The load on the API over `store`, served on loopback for the run.
/// The API over `fleet` and `store`, with the defaults the manager takes for that store.
async fn api_run(fleet: Arc<Fleet>, store: Arc<dyn LeaseStore>, shared_store: bool, body: &'static str) -> Figures {
    let api = DiscoveryApi {
        directory: Arc::new(FixedFleet(fleet)),
        store,
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::None,
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::with_defaults(
            shared_store,
            egress_discovery::AdmissionMetrics::default(),
        ),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        Arc::new(api),
        egress_http::Limits::DEFAULT,
        stop.clone(),
    ));
    let figures = load(base, true, body).await;
    stop.cancel();
    figures
}

/// The same load on the Redis lease store: a local redis-server with the append-only file and
/// `appendfsync` as given, on the cores `cores` names (`taskset`'s list) when it is given.
async fn redis_run(fleet: Arc<Fleet>, appendfsync: &'static str, cores: Option<&str>, body: &'static str) -> Figures {
    let redis = egress_testkit::redis::LocalRedis::start_with_appendfsync(appendfsync)
        .expect("redis-server (apt-get install redis-server)");
    if let Some(cores) = cores {
        pin(redis.pid().expect("redis-server runs"), cores);
    }
    let store = egress_lease_redis::RedisStore::new(
        &redis.url(),
        egress_lease_redis::DEFAULT_PREFIX,
        Duration::from_secs(900),
    )
    .expect("a Redis store");
    // What the leader's publisher does first: the indexes of the view answer the selectors.
    store
        .publish_view(&egress_discovery::view::entries(&fleet))
        .await
        .expect("the view published");
    api_run(fleet, Arc::new(store), true, body).await
}

/// Pins every thread of process `pid` to `cores` (`taskset` of util-linux).
fn pin(pid: u32, cores: &str) {
    egress_testkit::redis::pin(pid, cores).expect("taskset (util-linux)");
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fleet = fleet();
    let ceiling = load(format!("http://{}", trivial_server().await), false, ANY).await;
    let api = api_run(fleet.clone(), memory(), false, ANY).await;
    let on_redis = redis_run(fleet.clone(), "always", None, ANY).await;
    let on_redis_everysec = redis_run(fleet.clone(), "everysec", None, ANY).await;
    let mut selected = Vec::new();
    for body in [POOL, GEO] {
        let m = api_run(fleet.clone(), memory(), false, body).await;
        let r = redis_run(fleet.clone(), "always", None, body).await;
        selected.push((Some(m), Some(r)));
    }
    let mut pinned = pinned_runs(fleet).await.into_iter();
    let mut cells = head_cells(&api, &ceiling, &on_redis, &on_redis_everysec);
    // The pinned empty selector's, then the selectors' unpinned and pinned.
    for (m, r) in pinned.next().into_iter().chain(selected).chain(pinned) {
        cells.extend(pair_cells(m.as_ref(), r.as_ref()));
    }
    println!("{}", cells.join("|"));
}

/// The bench's fleet: `PROXIES` Ready proxies, half in each region, in 16 pools.
fn fleet() -> Arc<Fleet> {
    let fleet: Vec<ProxyInfo> = (0..PROXIES)
        .map(|i| ProxyInfo {
            id: format!("bench/p{i:05}"),
            ip: format!("10.1.{}.{}", i / 256, i % 256),
            port: 3128,
            attributes: BTreeMap::from([
                ("geo".to_string(), if i % 2 == 0 { "eu" } else { "us" }.to_string()),
                ("pool".to_string(), format!("pool-{:02}", i % 16)),
            ]),
            phase: "Ready".into(),
            healthy: true,
            latency_millis: (i % 97) as i64,
            max_leases: 5,
            credentials: None,
            offered: true,
            pool_role: None,
            pool: None,
            exit: None,
        })
        .collect();
    Arc::new(fleet.into_iter().collect::<Fleet>())
}

fn memory() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900)))
}

/// The in-memory and Redis runs of each acquire (no selector, a pool's, a region's) with the
/// bench on core 0 and Redis on core 1, then the bench on every core again; `None`s on a
/// machine of one core.
async fn pinned_runs(fleet: Arc<Fleet>) -> Vec<(Option<Figures>, Option<Figures>)> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores < 2 {
        return (0..3).map(|_| (None, None)).collect();
    }
    egress_testkit::redis::on_one_worker("0", &format!("0-{}", cores - 1), async move {
        let mut runs = Vec::new();
        for body in [ANY, POOL, GEO] {
            let m = api_run(fleet.clone(), memory(), false, body).await;
            let r = redis_run(fleet.clone(), "always", Some("1"), body).await;
            runs.push((Some(m), Some(r)));
        }
        runs
    })
    .expect("the runs on core 0")
}

/// The cells of the empty selector's unpinned runs and the ceiling's.
fn head_cells(api: &Figures, ceiling: &Figures, on_redis: &Figures, everysec: &Figures) -> Vec<String> {
    let ms = |sorted: &[Duration], q| format!("{:.2}", quantile(sorted, q));
    vec![
        PROXIES.to_string(),
        CLIENTS.to_string(),
        format!("{:.0}", api.pairs_per_second),
        ms(&api.acquire, 0.5),
        ms(&api.acquire, 0.99),
        ms(&api.release, 0.5),
        ms(&api.release, 0.99),
        ms(&api.pair, 0.5),
        ms(&api.pair, 0.99),
        format!("{:.0}", ceiling.pairs_per_second),
        ms(&ceiling.acquire, 0.5),
        ms(&ceiling.acquire, 0.99),
        ms(&ceiling.pair, 0.99),
        format!("{:.0} %", api.pairs_per_second / ceiling.pairs_per_second * 100.0),
        format!("{:.0}", on_redis.pairs_per_second),
        ms(&on_redis.acquire, 0.5),
        ms(&on_redis.acquire, 0.99),
        ms(&on_redis.release, 0.5),
        ms(&on_redis.release, 0.99),
        format!("{:.0}", everysec.pairs_per_second),
        ms(&everysec.acquire, 0.5),
        ms(&everysec.acquire, 0.99),
    ]
}

/// In-memory pairs per second, on Redis pairs per second, their share, and the Redis
/// acquire's p50 and p99; `?` for runs not made.
fn pair_cells(memory: Option<&Figures>, redis: Option<&Figures>) -> [String; 5] {
    let (Some(m), Some(r)) = (memory, redis) else {
        return ["?", "?", "?", "?", "?"].map(String::from);
    };
    [
        format!("{:.0}", m.pairs_per_second),
        format!("{:.0}", r.pairs_per_second),
        format!("{:.0} %", r.pairs_per_second / m.pairs_per_second * 100.0),
        format!("{:.2}", quantile(&r.acquire, 0.5)),
        format!("{:.2}", quantile(&r.acquire, 0.99)),
    ]
}
