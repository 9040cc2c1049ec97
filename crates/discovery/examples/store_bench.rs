//! The lease stores alone, without HTTP, for `cargo xtask bench --only lease-store`: 64 tasks
//! acquiring and releasing leases for 5 s on fleets of 1 000, 10 000 and 100 000 proxies, on the
//! in-memory store, on a local redis-server and on a local three-master Redis Cluster with a
//! replica each (append-only file, `appendfsync always`, for all), the cluster also with every
//! grant waiting for its replica (`wait=1`), a single server reached over TLS, and Redis's own
//! time per script call, read from the slow logs with every call recorded (per acquire and per
//! release) and from `INFO commandstats` (`FCALL`'s `usec`, per call and per request); then the
//! single server again on a core of its own, the bench on the other (on a runtime of one
//! worker). Prints a Markdown table.
//!
//! Every proxy is healthy with room for 5 leases. Each acquire is what the discovery API sends
//! for an empty selector: scoped to the installation, with the whole fleet as candidates in
//! (latency, id) order. The Redis store has the fleet published as its view first (the
//! leader's publisher does that in production) and answers from its index of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_lease::{Candidate, LeaseRequest, LeaseStore, MemoryStore, Scope, SystemClock, ViewEntry};
use egress_lease_redis::{Tls, TlsRoots};

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
const TASKS: usize = 64;
const MEASURE: Duration = Duration::from_secs(5);
/// Slow-log entries read back: the last calls of a run are a fair sample of it.
const SAMPLE: usize = 20_000;

/// One store's figures for one fleet.
struct Figures {
    pairs_per_second: f64,
    acquire: Vec<Duration>,
    release: Vec<Duration>,
    /// Calls the store did not answer within its budget.
    errors: usize,
}

fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or_default().as_secs_f64() * 1e3
}

/// `n` proxies in (latency, id) order.
fn fleet(n: usize) -> Arc<Vec<(String, i64)>> {
    let mut fleet: Vec<(String, i64)> = (0..n).map(|i| (format!("bench/p{i:06}"), (i % 97) as i64)).collect();
    fleet.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    Arc::new(fleet)
}

async fn load(store: Arc<dyn LeaseStore>, fleet: Arc<Vec<(String, i64)>>) -> Figures {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (store, fleet) = (store.clone(), fleet.clone());
        tasks.push(tokio::spawn(async move {
            let req = LeaseRequest {
                ttl: Duration::from_secs(60),
                target: None,
                scope: Scope::Installation,
            };
            let (mut times, mut errors) = (Vec::new(), 0usize);
            while started.elapsed() < MEASURE {
                let t = Instant::now();
                let mut candidates = fleet.iter().map(|(id, latency)| Candidate {
                    id,
                    healthy: true,
                    latency_millis: *latency,
                    max_leases: 5,
                });
                // A call the store could not answer (a 3 s budget run out) is counted, not timed.
                let grant = match store.acquire(&mut candidates, &req).await {
                    Ok(granted) => granted.expect("a proxy is free"),
                    Err(_) => {
                        errors += 1;
                        continue;
                    }
                };
                let acquired = t.elapsed();
                if store.release(&grant.lease_id).await.is_err() {
                    errors += 1;
                    continue;
                }
                times.push((acquired, t.elapsed() - acquired));
            }
            (times, errors)
        }));
    }
    let (mut acquire, mut release, mut errors) = (Vec::new(), Vec::new(), 0);
    for t in tasks {
        let (times, failed) = t.await.expect("a task");
        errors += failed;
        for (a, r) in times {
            acquire.push(a);
            release.push(r);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    acquire.sort();
    release.sort();
    Figures {
        pairs_per_second: acquire.len() as f64 / secs,
        acquire,
        release,
        errors,
    }
}

/// Redis's own microseconds per request of each operation, from the slow log: `functions`
/// names each operation's function. An acquire from the index and a release carry a batch of
/// requests in one call (`lua/acquire_indexed.lua`, `lua/release.lua` give the arguments), so
/// a call's time is shared among its requests.
async fn script_times(
    connection: &mut redis::aio::MultiplexedConnection,
    functions: &[(&'static str, String)],
) -> HashMap<&'static str, f64> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(SAMPLE)
        .query_async(connection)
        .await
        .expect("SLOWLOG GET");
    let mut sums: HashMap<&'static str, (f64, usize)> = HashMap::new();
    for entry in entries {
        let redis::Value::Array(fields) = entry else { continue };
        let (Some(redis::Value::Int(micros)), Some(redis::Value::Array(args))) = (fields.get(2), fields.get(3)) else {
            continue;
        };
        let Some(redis::Value::BulkString(function)) = args.get(1) else {
            continue;
        };
        let function = String::from_utf8_lossy(function);
        if let Some((name, _)) = functions.iter().find(|(_, f)| *f == function) {
            // FCALL, the function, 1, the key, then the function's own arguments.
            let own = arguments(args).saturating_sub(4);
            let requests = match *name {
                // now, retention, ended kept, cap, then ttl, target, lease id per request.
                "acquire_indexed" => own.saturating_sub(4) / 3,
                // now, ended kept, retention, then the lease ids.
                "release" => own.saturating_sub(3),
                _ => 1,
            };
            let e = sums.entry(name).or_default();
            e.0 += *micros as f64;
            e.1 += requests.max(1);
        }
    }
    sums.into_iter().map(|(k, (sum, n))| (k, sum / n as f64)).collect()
}

/// How many arguments a slow log entry's call had: the log keeps 32, the last of them then
/// saying how many more there were ("... (N more arguments)").
fn arguments(args: &[redis::Value]) -> usize {
    let more = match args.last() {
        Some(redis::Value::BulkString(last)) => String::from_utf8_lossy(last)
            .strip_prefix("... (")
            .and_then(|rest| rest.strip_suffix(" more arguments)"))
            .and_then(|n| n.parse::<usize>().ok()),
        _ => None,
    };
    match more {
        Some(n) => args.len() - 1 + n,
        None => args.len(),
    }
}

/// One Redis store's figures on `fleet`: a fresh key prefix (nothing of the last run is in the
/// way), the fleet published as the view, the load, then Redis's time per script from the slow
/// logs of `nodes` (every node of a cluster: the store's slot lives on one of them).
async fn redis_figures(
    url: &str,
    tls: &Tls,
    nodes: &mut [redis::aio::MultiplexedConnection],
    fleet: Arc<Vec<(String, i64)>>,
) -> (Figures, HashMap<&'static str, f64>) {
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let prefix = format!(
        "bench-{}-{}:",
        fleet.len(),
        RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let store = egress_lease_redis::RedisStore::new_with_tls(url, &prefix, Duration::from_secs(900), tls)
        .expect("a Redis store");
    let functions = store.function_names();
    let view: Vec<ViewEntry> = fleet
        .iter()
        .map(|(id, latency)| ViewEntry {
            id: id.clone(),
            healthy: true,
            latency_millis: *latency,
            max_leases: 5,
            offered: true,
        })
        .collect();
    store.publish_view(&view).await.expect("the view published");
    for node in nodes.iter_mut() {
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(node)
            .await
            .expect("SLOWLOG RESET");
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(node)
            .await
            .expect("CONFIG RESETSTAT");
    }
    let figures = load(Arc::new(store), fleet).await;
    let mut times = HashMap::new();
    let (mut calls, mut micros) = (0u64, 0u64);
    for node in nodes.iter_mut() {
        times.extend(script_times(node, &functions).await);
        let (c, m) = fcall_stats(node).await;
        (calls, micros) = (calls + c, micros + m);
    }
    // Every FCALL of the load is an acquire batch or a release batch.
    let requests = (figures.acquire.len() + figures.release.len()).max(1);
    times.insert("fcall per call", micros as f64 / calls.max(1) as f64);
    times.insert("fcall per request", micros as f64 / requests as f64);
    (figures, times)
}

/// `FCALL`'s calls and microseconds since the last `CONFIG RESETSTAT`, from `INFO
/// commandstats` (its `cmdstat_fcall` line).
async fn fcall_stats(connection: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO commandstats");
    let Some(line) = info.lines().find_map(|l| l.strip_prefix("cmdstat_fcall:")) else {
        return (0, 0);
    };
    let field = |name: &str| {
        line.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

/// Connections to `urls`, each set to log every call in its slow log.
async fn admin(urls: &[String]) -> Vec<redis::aio::MultiplexedConnection> {
    let mut connections = Vec::new();
    for url in urls {
        let mut c = redis::Client::open(url.as_str())
            .expect("a Redis URL")
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to the bench's redis-server");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .arg("slowlog-max-len")
            .arg(SAMPLE)
            .query_async(&mut c)
            .await
            .expect("CONFIG SET");
        connections.push(c);
    }
    connections
}

/// Pins every thread of process `pid` to `cores` (`taskset` of util-linux).
fn pin(pid: u32, cores: &str) {
    egress_testkit::redis::pin(pid, cores).expect("taskset (util-linux)");
}

/// One store's row of the table; `m`: the memory store's figures on the same fleet.
fn row(n: usize, name: &str, r: &Figures, m: &Figures, times: &HashMap<&'static str, f64>) {
    let shown = |name: &str| times.get(name).map_or("?".to_owned(), |t| format!("{t:.1}"));
    println!(
        "| {n} | {name} ({:.1} % of memory) | {:.0} | {:.3} / {:.3} | {:.3} / {:.3} | {} / {} | {} / {} | {} |",
        r.pairs_per_second / m.pairs_per_second * 100.0,
        r.pairs_per_second,
        quantile(&r.acquire, 0.5),
        quantile(&r.acquire, 0.99),
        quantile(&r.release, 0.5),
        quantile(&r.release, 0.99),
        shown("acquire_indexed"),
        shown("release"),
        shown("fcall per call"),
        shown("fcall per request"),
        r.errors
    );
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let redis = egress_testkit::redis::LocalRedis::start().expect("redis-server (apt-get install redis-server)");
    // The same over TLS, with a certificate of a test CA that the store is given.
    let pki = egress_testkit::pki();
    let tls_redis = egress_testkit::redis::LocalRedis::start_tls(&egress_testkit::redis::TlsFiles {
        cert_pem: pki.server_cert_pem.clone(),
        key_pem: pki.server_key_pem.clone(),
        ca_pem: pki.ca_pem.clone(),
        client_certificates_required: false,
    })
    .expect("redis-server with TLS");
    let tls_url = tls_redis.tls_url().expect("a TLS port");
    let tls = Tls {
        roots: TlsRoots::only(pki.ca_pem.as_bytes()).expect("the test CA"),
        client: None,
    };
    let mut tls_single = admin(&[tls_redis.url()]).await;
    let cluster = egress_testkit::redis::LocalCluster::start(3, 1, "always")
        .expect("a Redis Cluster (apt-get install redis-server redis-tools)");
    let mut single = admin(&[redis.url()]).await;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let every_core = format!("0-{}", cores - 1);
    let mut nodes = admin(&cluster.node_urls()).await;
    println!(
        "| proxies | store | pairs per second | acquire p50 / p99 (ms) | release p50 / p99 (ms) | Redis per acquire / release (µs, slow log) | Redis per FCALL / per request (µs, INFO commandstats) | calls unanswered |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for n in SIZES {
        let fleet = fleet(n);
        let memory = Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900)));
        let m = load(memory, fleet.clone()).await;
        println!(
            "| {n} | memory | {:.0} | {:.3} / {:.3} | {:.3} / {:.3} | | | {} |",
            m.pairs_per_second,
            quantile(&m.acquire, 0.5),
            quantile(&m.acquire, 0.99),
            quantile(&m.release, 0.5),
            quantile(&m.release, 0.99),
            m.errors
        );
        for (name, url) in [
            ("redis", redis.url()),
            ("3-master cluster", cluster.url()),
            ("3-master cluster, wait=1", format!("{}?wait=1", cluster.url())),
        ] {
            let admin = if url == redis.url() { &mut single } else { &mut nodes };
            let (r, times) = redis_figures(&url, &Tls::default(), admin, fleet.clone()).await;
            row(n, name, &r, &m, &times);
        }
        let (r, times) = redis_figures(&tls_url, &tls, &mut tls_single, fleet.clone()).await;
        row(n, "redis over TLS", &r, &m, &times);
        // Redis on a core of its own and the bench on the other, as Redis runs in production:
        // unpinned, the slow log's wall time also counts Redis waiting for a core.
        if let (Some(pid), true) = (redis.pid(), cores >= 2) {
            pin(pid, "1");
            let (r, times) = egress_testkit::redis::on_one_worker(
                "0",
                &every_core,
                redis_figures(&redis.url(), &Tls::default(), &mut single, fleet.clone()),
            )
            .expect("the run on core 0");
            pin(pid, &every_core);
            row(n, "redis on core 1, the bench on core 0", &r, &m, &times);
        }
    }
}
