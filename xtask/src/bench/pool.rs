//! `cargo xtask bench --only pool`: a ProxyPool of 100 members and 5 standbys of the reference
//! provider (the operator built with `examples/reference_operator.rs`, its verdicts scripted
//! through a file), on `egress-kube-testserver`. Two figures:
//!
//! 1. **Failover.** One active member at a time is made unhealthy (its name written to the
//!    verdict file, which the operator reads every 10 ms); the time from that write until the
//!    discovery API lists 100 healthy active members again (the failed one no longer among
//!    them) is one sample. Before the next round the pool is back at 100 + 5. Goal: p99 under
//!    1 s.
//! 2. **Rotation under load.** 64 clients take and release leases naming the pool as fast as
//!    they can while every member is replaced (a template change, which swaps and drains members
//!    as `maxAge` does, but once: with a `maxAge` shorter than the rotation takes, the members
//!    made for it would come of age before it ends); every answer that is not a lease counts as
//!    refused. Goal: 0. The pool has `maxSurge: 10`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use egress_api::ProxyPool;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::report::{self, Conditions, Table};
use crate::procs::Killed;
use crate::test_server;

const POOL: &str = "bench-pool";
const REPLICAS: usize = 100;
const STANDBY: i32 = 5;
const ROUNDS: usize = 20;
const CLIENTS: usize = 64;
/// Every wait of the bench ends in failure after this.
const BUDGET: Duration = Duration::from_secs(300);
/// Standbys a replacement may make beyond the pool's: how many swaps run at once.
const MAX_SURGE: i32 = 10;

/// The pool's members as the discovery API lists them: (id, healthy, role).
async fn listed(http: &reqwest::Client, discovery: &str) -> Result<Vec<(String, bool, String)>> {
    let list: serde_json::Value = http
        .get(format!("{discovery}/v1/proxies?attr.pool={POOL}"))
        .send()
        .await?
        .json()
        .await?;
    Ok(list["proxies"]
        .as_array()
        .context("no proxies in the list")?
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap_or_default().to_owned(),
                p["healthy"].as_bool().unwrap_or(false),
                p["poolRole"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

fn leasable(members: &[(String, bool, String)]) -> usize {
    members.iter().filter(|(_, h, r)| *h && r == "active").count()
}

/// Waits until the pool's status shows every member leasable and every standby Ready.
async fn wait_settled(pools: &Api<ProxyPool>) -> Result<()> {
    let started = Instant::now();
    loop {
        let status = pools.get(POOL).await?.status.unwrap_or_default();
        if status.available_replicas as usize == REPLICAS && status.standby_ready == STANDBY {
            return Ok(());
        }
        if started.elapsed() > BUDGET {
            bail!("the pool is at {status:?} after {BUDGET:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The p-th percentile of sorted `samples` (nearest rank).
fn percentile(samples: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

pub(super) fn run(root: &Path, bin: &Path, dir: &Path, conditions: &Conditions) -> Result<()> {
    let dir = dir.join("pool");
    std::fs::create_dir_all(&dir)?;
    let providers = dir.join("providers.yaml");
    // The highest create budget: the bench measures the operator, not the guard against a
    // runaway fleet (docs/configuration.md#the-create-budget).
    std::fs::write(
        &providers,
        "providers:\n  - name: mem\n    type: reference\n    createsPerMinute: 10000\n",
    )?;
    let unhealthy = dir.join("unhealthy");
    std::fs::write(&unhealthy, "")?;
    let (_server, kubeconfig) = test_server::start(root, bin, "bench", &dir)?;
    let discovery = format!("http://127.0.0.1:{}", egress_testkit::try_free_port()?);
    let _operator = Killed(
        Command::new(bin.join("examples/reference_operator"))
            .arg(format!("--providers-config={}", providers.display()))
            // The bench's pools are in `bench`; the operator otherwise serves its own namespace.
            .arg("--proxy-namespace=bench")
            .arg(format!("--discovery-addr={}", discovery.trim_start_matches("http://")))
            .arg("--discovery-tls=off")
            .args([
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
                "--discovery-auth=none",
                "--provider-check-interval=0",
                "--zap-encoder=json",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .env("REFERENCE_UNHEALTHY_FILE", &unhealthy)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("operator.log"))?)
            .spawn()
            .context("starting the reference operator")?,
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let (settled, failover, rotation) = runtime.block_on(async {
        let pools: Api<ProxyPool> = Api::namespaced(test_server::client(&kubeconfig).await?, "bench");
        let pool: ProxyPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": POOL},
            "spec": {"replicas": REPLICAS, "standby": STANDBY, "strategy": {"maxSurge": MAX_SURGE},
                "template": {"spec": {
                "provider": "mem",
                "placement": {"zone": "zone-a", "machineType": "small", "image": "debian-13"}}}}
        }))?;
        let started = Instant::now();
        pools.create(&PostParams::default(), &pool).await?;
        wait_settled(&pools).await?;
        let settled = started.elapsed();
        eprintln!("bench: pool of {REPLICAS} + {STANDBY} settled in {settled:.1?}");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        let failover = failover(&http, &discovery, &pools, &unhealthy).await?;
        let rotation = rotation(&http, &discovery, &pools).await?;
        anyhow::Ok((settled, failover, rotation))
    })?;
    let mut samples = failover;
    samples.sort();
    print_table(settled, &samples, &rotation, conditions);
    Ok(())
}

/// The bench's table, under its conditions; `samples` sorted.
fn print_table(settled: Duration, samples: &[Duration], rotation: &Rotation, conditions: &Conditions) {
    let mut table = Table::new(&["Figure", "Value", "Goal"]);
    table
        .row([
            format!("pool of {REPLICAS} + {STANDBY} made and settled"),
            report::seconds(settled),
            String::new(),
        ])
        .row([
            format!(
                "failover: a member's verdict to {REPLICAS} leasable again, p50 / p99 / max of {} rounds",
                samples.len()
            ),
            format!(
                "{} / {} / {}",
                report::millis(percentile(samples, 50.0)),
                report::millis(percentile(samples, 99.0)),
                report::millis(samples[samples.len() - 1])
            ),
            "p99 under 1 s".to_owned(),
        ])
        .row([
            format!("a full rotation (a template change, `maxSurge: {MAX_SURGE}`) under {CLIENTS} clients"),
            report::seconds(rotation.took),
            String::new(),
        ])
        .row([
            "leases granted (and released) / refused during it".to_owned(),
            format!(
                "{} / {}",
                report::count(rotation.granted),
                report::count(rotation.refused)
            ),
            "0 refused".to_owned(),
        ]);
    table.print(&conditions.line(
        "pool",
        &format!(
            "a ProxyPool of {REPLICAS} members and {STANDBY} standbys of the reference provider on \
             egress-kube-testserver, its verdicts scripted through a file the operator reads every \
             10 ms (so each failover sample includes up to 10 ms of that); {ROUNDS} failover rounds, \
             one member failed at a time and the pool settled again between rounds; then every member \
             replaced while {CLIENTS} clients take and release leases naming the pool"
        ),
    ));
}

/// The failover rounds: one sample each.
async fn failover(
    http: &reqwest::Client,
    discovery: &str,
    pools: &Api<ProxyPool>,
    unhealthy: &Path,
) -> Result<Vec<Duration>> {
    let mut failed: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    for round in 0..ROUNDS {
        let members = listed(http, discovery).await?;
        let victim = members
            .iter()
            .find(|(id, h, r)| *h && r == "active" && !failed.contains(id))
            .map(|(id, _, _)| id.clone())
            .context("no healthy active member to fail")?;
        failed.push(victim.clone());
        std::fs::write(unhealthy, failed.join("\n"))?;
        let verdict = Instant::now();
        loop {
            let members = listed(http, discovery).await?;
            let victim_out = !members.iter().any(|(id, h, r)| *id == victim && *h && r == "active");
            if victim_out && leasable(&members) == REPLICAS {
                samples.push(verdict.elapsed());
                break;
            }
            if verdict.elapsed() > BUDGET {
                bail!(
                    "round {round}: {} leasable {BUDGET:?} after {victim} failed",
                    leasable(&members)
                );
            }
        }
        wait_settled(pools).await?;
    }
    Ok(samples)
}

struct Rotation {
    took: Duration,
    granted: u64,
    refused: u64,
}

/// Replaces every member (a template change) while [`CLIENTS`] clients take and release leases.
async fn rotation(http: &reqwest::Client, discovery: &str, pools: &Api<ProxyPool>) -> Result<Rotation> {
    let originals: Vec<String> = listed(http, discovery)
        .await?
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    let granted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (http, discovery) = (http.clone(), discovery.to_owned());
        let (granted, refused, stop) = (granted.clone(), refused.clone(), stop.clone());
        clients.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let answer = http
                    .post(format!("{discovery}/v1/leases"))
                    .body(format!(r#"{{"selector": {{"pool": "{POOL}"}}, "ttlSeconds": 60}}"#))
                    .send()
                    .await;
                let lease = match answer {
                    Ok(a) if a.status() == 201 => a.json::<serde_json::Value>().await.ok(),
                    _ => None,
                };
                let Some(lease) = lease else {
                    refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                granted.fetch_add(1, Ordering::Relaxed);
                let id = lease["leaseID"].as_str().unwrap_or_default();
                let _ = http.delete(format!("{discovery}/v1/leases/{id}")).send().await;
            }
        });
    }
    let started = Instant::now();
    let change = serde_json::json!({"spec": {"template": {"metadata": {"labels": {"rotation": "1"}}}}});
    pools
        .patch(POOL, &PatchParams::default(), &Patch::Merge(change))
        .await?;
    loop {
        let now: Vec<String> = listed(http, discovery)
            .await?
            .into_iter()
            .map(|(id, _, _)| id)
            .collect();
        if originals.iter().all(|o| !now.contains(o)) {
            break;
        }
        if started.elapsed() > BUDGET {
            stop.store(true, Ordering::Relaxed);
            bail!("members of before the rotation still listed after {BUDGET:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    while clients.join_next().await.is_some() {}
    Ok(Rotation {
        took,
        granted: granted.load(Ordering::Relaxed),
        refused: refused.load(Ordering::Relaxed),
    })
}
