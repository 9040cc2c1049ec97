//! The lease stores alone, without HTTP, for `cargo xtask bench --only lease-store`: 64 tasks
//! acquiring and releasing leases for 5 s on fleets of 1 000, 10 000 and 100 000 proxies, on the
//! in-memory store, on a local redis-server and on a local three-master Redis Cluster with a
//! replica each (append-only file, `appendfsync always`, for all), the cluster also with every
//! grant waiting for its replica (`wait=1`), a single server reached over TLS, and Redis's own
//! time per script call, read from the slow logs with every call recorded (per acquire and per
//! release) and from `INFO commandstats` (`FCALL`'s `usec`, per call and per request); then the
//! single server again on a core of its own, the bench on the other (on a runtime of one
//! worker). Each single-server row runs on a redis-server of its own; the cluster and the TLS
//! server serve every row of theirs. Prints a Markdown table, then for each size where the
//! cluster row's shards live (each shard's slot and master) and each master's share of the
//! row's keys and calls.
//!
//! Every proxy is healthy with room for 5 leases, in one of 16 pools (`pool=pool-00` to
//! `pool-15`; on Redis each pool's leases are a shard of their own) and one of 4 regions
//! (`geo=eu`, ...). Each acquire is what the discovery API sends
//! for its selector: for an empty one scoped to the installation, with the whole fleet as
//! candidates in (latency, id) order; for `pool=pool-07` (a sixteenth of the fleet) or `geo=eu`
//! (a quarter) scoped to that index, with its proxies as candidates (what each replica's own
//! index of the fleet reads). The Redis store has the fleet published as its view first, each
//! proxy with its indexes (the leader's publisher does that in production), and answers from its
//! indexes of it. The selector rows run on the memory store and one Redis.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_lease::{Candidate, LeaseRequest, LeaseStore, MemoryStore, Scope, SystemClock, ViewEntry, index_name};
use egress_lease_redis::{RedisStore, Tls, TlsRoots};

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

/// A proxy of the bench's fleet.
struct Proxy {
    id: String,
    latency: i64,
    /// `pool-NN`.
    pool: String,
    /// `pool=pool-NN` and `geo=<region>`.
    indexes: [String; 2],
}

const REGIONS: [&str; 4] = ["eu", "us", "ap", "sa"];

/// `n` proxies in (latency, id) order.
fn fleet(n: usize) -> Arc<Vec<Proxy>> {
    let mut fleet: Vec<Proxy> = (0..n)
        .map(|i| {
            let pool = format!("pool-{:02}", i % 16);
            Proxy {
                id: format!("bench/p{i:06}"),
                latency: (i % 97) as i64,
                indexes: [
                    index_name("pool", &pool),
                    index_name("geo", REGIONS[(i / 16) % REGIONS.len()]),
                ],
                pool,
            }
        })
        .collect();
    fleet.sort_by(|a, b| (a.latency, &a.id).cmp(&(b.latency, &b.id)));
    Arc::new(fleet)
}

/// What an acquire asks for: any proxy, or one selector's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ask {
    Any,
    Pool,
    Geo,
}

impl Ask {
    /// The selector's index; `None` for any proxy.
    fn index(self) -> Option<String> {
        match self {
            Ask::Any => None,
            Ask::Pool => Some(index_name("pool", "pool-07")),
            Ask::Geo => Some(index_name("geo", "eu")),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Ask::Any => "",
            Ask::Pool => ", pool=pool-07 (1/16 of the fleet)",
            Ask::Geo => ", geo=eu (1/4 of the fleet)",
        }
    }

    fn scope(self) -> Scope {
        self.index()
            .map_or(Scope::Installation, |name| Scope::Indexed(vec![name]))
    }

    /// The candidates the API reads for it, in lease order: its index's proxies.
    fn candidates(self, fleet: &[Proxy]) -> Arc<Vec<Listed>> {
        let index = self.index();
        Arc::new(
            fleet
                .iter()
                .filter(|p| index.as_ref().is_none_or(|name| p.indexes.contains(name)))
                .map(|p| Listed {
                    id: p.id.clone(),
                    latency: p.latency,
                    pool: p.pool.clone(),
                })
                .collect(),
        )
    }
}

/// A candidate as the API lists it.
struct Listed {
    id: String,
    latency: i64,
    pool: String,
}

async fn load(store: Arc<dyn LeaseStore>, fleet: Arc<Vec<Listed>>, ask: Ask) -> Figures {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (store, fleet) = (store.clone(), fleet.clone());
        tasks.push(tokio::spawn(async move {
            let req = LeaseRequest {
                ttl: Duration::from_secs(60),
                target: None,
                scope: ask.scope(),
            };
            let (mut times, mut errors) = (Vec::new(), 0usize);
            while started.elapsed() < MEASURE {
                let t = Instant::now();
                let mut candidates = fleet.iter().map(|c| Candidate {
                    id: &c.id,
                    healthy: true,
                    latency_millis: c.latency,
                    max_leases: 5,
                    pool: Some(&c.pool),
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
                // now, retention, ended kept, cap, then ttl, target, lease id, 0 or 1, and the
                // index (this bench's requests name at most one) per request.
                "acquire_indexed" => own.saturating_sub(4) / if args_name_an_index(args) { 5 } else { 4 },
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

/// Whether an indexed acquire's call names an index (its first request's count of names).
fn args_name_an_index(args: &[redis::Value]) -> bool {
    matches!(args.get(11), Some(redis::Value::BulkString(k)) if k.as_slice() == b"1")
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
    fleet: &[Proxy],
    ask: Ask,
) -> (Figures, HashMap<&'static str, f64>, Arc<RedisStore>) {
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let prefix = format!(
        "bench-{}-{}:",
        fleet.len(),
        RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let store = RedisStore::new_with_tls(url, &prefix, Duration::from_secs(900), tls).expect("a Redis store");
    let functions = store.function_names();
    let view: Vec<ViewEntry> = fleet
        .iter()
        .map(|p| ViewEntry {
            id: p.id.clone(),
            healthy: true,
            latency_millis: p.latency,
            max_leases: 5,
            offered: true,
            indexed: p.indexes.to_vec(),
            pool: Some(p.pool.clone()),
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
    let store = Arc::new(store);
    let figures = load(store.clone(), ask.candidates(fleet), ask).await;
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
    (figures, times, store)
}

/// Where each shard of a cluster row's store lives (its hash tag's slot and master), and each
/// master's share of the row's keys (`CLUSTER COUNTKEYSINSLOT` of its shards' slots) and of its
/// calls (`INFO commandstats`' `FCALL` calls since the row began): a Markdown section.
async fn cluster_shares(
    n: usize,
    store: &RedisStore,
    urls: &[String],
    nodes: &mut [redis::aio::MultiplexedConnection],
) -> String {
    let homes = store.shard_homes().await.expect("the cluster's map of slots");
    let mut out = format!(
        "\n{n} proxies on the 3-master cluster: each shard\n\n| shard | hash tag | slot | master |\n|---|---|---|---|\n"
    );
    for h in &homes {
        // A `|` in a cell ends it, even in a code span, unless escaped.
        let tag = h.tag.replace('|', "\\|");
        out += &format!("| {} | `{tag}` | {} | {} |\n", h.shard.0, h.slot, h.master);
    }
    let mut masters = Vec::new();
    for (url, node) in urls.iter().zip(nodes.iter_mut()) {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(node)
            .await
            .expect("INFO");
        if !info.lines().any(|l| l.trim() == "role:master") {
            continue;
        }
        let address = url.trim_start_matches("redis://").to_owned();
        let mut keys = 0u64;
        for h in homes.iter().filter(|h| h.master == address) {
            let in_slot: u64 = redis::cmd("CLUSTER")
                .arg("COUNTKEYSINSLOT")
                .arg(h.slot)
                .query_async(node)
                .await
                .expect("CLUSTER COUNTKEYSINSLOT");
            keys += in_slot;
        }
        let shards = homes.iter().filter(|h| h.master == address).count();
        masters.push((address, shards, keys, fcall_stats(node).await.0));
    }
    let (all_keys, all_calls) = masters.iter().fold((0u64, 0u64), |(k, c), m| (k + m.2, c + m.3));
    out += "\n| master | shards | keys (share) | FCALL calls (share) |\n|---|---|---|---|\n";
    for (address, shards, keys, calls) in masters {
        out += &format!(
            "| {address} | {shards} | {keys} ({:.1} %) | {calls} ({:.1} %) |\n",
            keys as f64 / all_keys.max(1) as f64 * 100.0,
            calls as f64 / all_calls.max(1) as f64 * 100.0
        );
    }
    out
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

/// One store's row of the table; `m`: the memory store's figures on the same fleet and ask.
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

/// One row on a redis-server of its own: every single-server row starts on an empty
/// append-only file (one server for every row made each row pay for the files of the rows
/// before it: a row of 100 000 proxies measured after the others ran on a file of some 500 MB).
/// `pinned`: Redis on core 1 and the bench on core 0 (given `every_core` to return to).
async fn fresh_redis_figures(fleet: &[Proxy], ask: Ask, pinned: Option<&str>) -> (Figures, HashMap<&'static str, f64>) {
    let redis = egress_testkit::redis::LocalRedis::start().expect("redis-server (apt-get install redis-server)");
    let mut single = admin(&[redis.url()]).await;
    let Some(every_core) = pinned else {
        let (figures, times, _) = redis_figures(&redis.url(), &Tls::default(), &mut single, fleet, ask).await;
        return (figures, times);
    };
    let pid = redis.pid().expect("redis-server runs");
    pin(pid, "1");
    let (figures, times, _) = egress_testkit::redis::on_one_worker(
        "0",
        every_core,
        redis_figures(&redis.url(), &Tls::default(), &mut single, fleet, ask),
    )
    .expect("the run on core 0");
    pin(pid, every_core);
    (figures, times)
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let every_core = format!("0-{}", cores - 1);
    let mut nodes = admin(&cluster.node_urls()).await;
    println!(
        "| proxies | store | pairs per second | acquire p50 / p99 (ms) | release p50 / p99 (ms) | Redis per acquire / release (µs, slow log) | Redis per FCALL / per request (µs, INFO commandstats) | calls unanswered |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut shares = Vec::new();
    for n in SIZES {
        let fleet = fleet(n);
        for ask in [Ask::Any, Ask::Pool, Ask::Geo] {
            let memory = Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900)));
            let m = load(memory, ask.candidates(&fleet), ask).await;
            println!(
                "| {n} | memory{} | {:.0} | {:.3} / {:.3} | {:.3} / {:.3} | | | {} |",
                ask.label(),
                m.pairs_per_second,
                quantile(&m.acquire, 0.5),
                quantile(&m.acquire, 0.99),
                quantile(&m.release, 0.5),
                quantile(&m.release, 0.99),
                m.errors
            );
            let (r, times) = fresh_redis_figures(&fleet, ask, None).await;
            row(n, &format!("redis{}", ask.label()), &r, &m, &times);
            // Redis on a core of its own and the bench on the other, as Redis runs in
            // production: unpinned, the slow log's wall time also counts Redis waiting for a core.
            if cores >= 2 {
                let (r, times) = fresh_redis_figures(&fleet, ask, Some(&every_core)).await;
                row(
                    n,
                    &format!("redis on core 1, the bench on core 0{}", ask.label()),
                    &r,
                    &m,
                    &times,
                );
            }
            if ask != Ask::Any {
                continue;
            }
            for (name, url) in [
                ("3-master cluster", cluster.url()),
                ("3-master cluster, wait=1", format!("{}?wait=1", cluster.url())),
            ] {
                let (r, times, store) = redis_figures(&url, &Tls::default(), &mut nodes, &fleet, ask).await;
                row(n, name, &r, &m, &times);
                if !url.contains("wait=") {
                    shares.push(cluster_shares(n, &store, &cluster.node_urls(), &mut nodes).await);
                }
            }
            let (r, times, _) = redis_figures(&tls_url, &tls, &mut tls_single, &fleet, ask).await;
            row(n, "redis over TLS", &r, &m, &times);
        }
    }
    for section in shares {
        print!("{section}");
    }
}
