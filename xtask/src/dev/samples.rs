//! The local samples (`deploy/samples/local`): applied in file order, then followed until every
//! Proxy is Ready and every pool has its members leasable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use egress_api::{Proxy, ProxyPool};
use kube::api::{Api, ListParams, PostParams};

use super::running::Running;

/// How long the samples get to become Ready.
const READY_BUDGET: Duration = Duration::from_secs(120);

/// The names of what the samples created.
pub(super) struct Applied {
    pub(super) proxies: Vec<String>,
    pub(super) pools: Vec<String>,
}

/// The YAML files in `dir`, in name order.
fn sample_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Creates each sample under `root` (a ProxyPool or a Proxy, by its `kind`).
pub(super) async fn apply(root: &Path, api: &Api<Proxy>, pools: &Api<ProxyPool>) -> Result<Applied> {
    let mut applied = Applied {
        proxies: Vec::new(),
        pools: Vec::new(),
    };
    for file in sample_files(&root.join("deploy/samples/local"))? {
        let text = std::fs::read_to_string(&file)?;
        let parsing = || format!("parsing {}", file.display());
        let creating = || format!("creating {}", file.display());
        let kind: serde_json::Value = serde_saphyr::from_str(&text).with_context(parsing)?;
        if kind["kind"] == "ProxyPool" {
            let pool: ProxyPool = serde_saphyr::from_str(&text).with_context(parsing)?;
            let created = pools
                .create(&PostParams::default(), &pool)
                .await
                .with_context(creating)?;
            applied.pools.push(created.metadata.name.unwrap_or_default());
            continue;
        }
        let proxy: Proxy = serde_saphyr::from_str(&text).with_context(parsing)?;
        let created = api
            .create(&PostParams::default(), &proxy)
            .await
            .with_context(creating)?;
        applied.proxies.push(created.metadata.name.unwrap_or_default());
    }
    Ok(applied)
}

/// A Proxy's phase as the run prints it (`-` before it has one).
fn phase_of(p: &Proxy) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_ref())
        .map_or_else(|| "-".to_owned(), |ph| format!("{ph:?}"))
}

/// Waits until every named Proxy is Ready, printing phase changes.
pub(super) async fn wait_ready(api: &Api<Proxy>, names: &[String], running: &mut Running<'_>) -> Result<()> {
    let started = Instant::now();
    let mut last = BTreeMap::new();
    loop {
        running.check_operator()?;
        let mut ready = 0;
        for p in api.list(&ListParams::default()).await?.items {
            let name = p.metadata.name.clone().unwrap_or_default();
            if !names.contains(&name) {
                // A pool's member: wait_pools follows its pool.
                continue;
            }
            let phase = phase_of(&p);
            if phase == "Ready" {
                ready += 1;
            }
            if last.get(&name) != Some(&phase) {
                println!("dev:   {name}: {phase}");
                last.insert(name, phase);
            }
        }
        if ready == names.len() {
            println!("dev: all {ready} Proxies are Ready after {:.1?}", started.elapsed());
            return Ok(());
        }
        if started.elapsed() > READY_BUDGET {
            bail!(
                "only {ready} of {} Proxies Ready after {READY_BUDGET:?}; see {}",
                names.len(),
                running.layout.file("operator.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until each pool of `names` has all its members leasable and its standbys Ready.
pub(super) async fn wait_pools(api: &Api<ProxyPool>, names: &[String], running: &mut Running<'_>) -> Result<()> {
    let started = Instant::now();
    for name in names {
        loop {
            running.check_operator()?;
            let pool = api.get(name).await?;
            let status = pool.status.clone().unwrap_or_default();
            if status.available_replicas == pool.spec.replicas && status.standby_ready == pool.spec.standby {
                println!(
                    "dev: pool {name}: {} members leasable, {} standby Ready after {:.1?}",
                    status.available_replicas,
                    status.standby_ready,
                    started.elapsed()
                );
                break;
            }
            if started.elapsed() > READY_BUDGET {
                bail!(
                    "pool {name} has {} of {} members leasable after {READY_BUDGET:?}; see {}",
                    status.available_replicas,
                    pool.spec.replicas,
                    running.layout.file("operator.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}
