//! The running system of one `cargo xtask dev` run: its children (the test server, the
//! operator and the gateway) and what it created in the cluster; and its teardown, orderly or
//! hurried.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use egress_api::{Proxy, ProxyPool};
use kube::api::{Api, DeleteParams, ListParams};

use super::layout::Layout;
use super::leftovers::{remove_instances, tinyproxies_under};
use crate::procs::Killed;

/// How long the operator gets to delete the Proxies' instances at teardown.
const DELETE_BUDGET: Duration = Duration::from_secs(60);
/// How many of the operator log's last lines a failure shows.
const LOG_TAIL_LINES: usize = 40;

/// The children and what was created in the cluster.
pub(super) struct Running<'a> {
    pub(super) layout: &'a Layout,
    server: Option<Killed>,
    operator: Option<Killed>,
    gateway: Option<Killed>,
    pub(super) api: Option<Api<Proxy>>,
    pub(super) pools: Option<Api<ProxyPool>>,
}

impl<'a> Running<'a> {
    /// The run of `layout` with its two children started, nothing created yet.
    pub(super) fn new(layout: &'a Layout, server: Killed, operator: Killed) -> Self {
        Self {
            layout,
            server: Some(server),
            operator: Some(operator),
            gateway: None,
            api: None,
            pools: None,
        }
    }

    /// The gateway, started: stopped first at the teardown.
    pub(super) fn with_gateway(&mut self, gateway: Killed) {
        self.gateway = Some(gateway);
    }

    /// An error when the operator has stopped, carrying its log's last lines.
    pub(super) fn check_operator(&mut self) -> Result<()> {
        if let Some(operator) = self.operator.as_mut()
            && let Some(status) = operator.0.try_wait()?
        {
            return Err(operator_exited(status, self.layout));
        }
        Ok(())
    }

    /// The hurried teardown: the operator and the test server are killed, the proxies removed
    /// directly.
    pub(super) async fn kill_now(&mut self) -> Result<()> {
        drop(self.gateway.take());
        drop(self.operator.take());
        drop(self.server.take());
        remove_instances(&self.layout.state()).await?;
        let _ = std::fs::remove_file(self.layout.file("pids"));
        Ok(())
    }

    /// Deletes the Proxies (so the operator removes their instances), stops the operator and the
    /// test server, removes whatever instance is left, and checks that no tinyproxy survived.
    pub(super) async fn tear_down(&mut self) -> Result<()> {
        println!("dev: tearing down");
        if let Some(gateway) = self.gateway.take() {
            gateway.stop(Duration::from_secs(5));
        }
        // Pools first: their members drain and go with them (deleting the members alone would
        // only make the pools make new ones).
        if let Some(pools) = self.pools.take() {
            let deleted = delete_all(&pools, "ProxyPools").await;
            if let Err(e) = &deleted {
                println!("dev: {e:#} (removing the proxies directly)");
            }
        }
        if let Some(api) = self.api.take() {
            let deleted = delete_all(&api, "Proxies").await;
            if let Err(e) = &deleted {
                println!("dev: {e:#} (removing the proxies directly)");
            }
        }
        if let Some(operator) = self.operator.take() {
            operator.stop(Duration::from_secs(15));
        }
        if let Some(server) = self.server.take() {
            server.stop(Duration::from_secs(5));
        }
        let left = remove_instances(&self.layout.state()).await?;
        if left > 0 {
            println!("dev: removed {left} proxies the operator had not deleted");
        }
        let _ = std::fs::remove_file(self.layout.file("pids"));
        let survivors = tinyproxies_under(&self.layout.state());
        if !survivors.is_empty() {
            bail!("tinyproxy processes survived the teardown: {survivors:?}");
        }
        println!("dev: stopped everything; logs are in {}", self.layout.dir.display());
        Ok(())
    }
}

/// Deletes every object of `api`'s kind in the namespace and waits until the operator has let
/// them go (a pool, once its members have drained and gone).
async fn delete_all<K>(api: &Api<K>, what: &str) -> Result<()>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .with_context(|| format!("deleting the {what}"))?;
    let started = Instant::now();
    loop {
        let left = api.list(&ListParams::default()).await?.items.len();
        if left == 0 {
            return Ok(());
        }
        if started.elapsed() > DELETE_BUDGET {
            bail!("{left} {what} still there {DELETE_BUDGET:?} after their deletion");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The last `LOG_TAIL_LINES` lines of a log, each cut at 400 characters, as indented rows.
fn log_tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..]
        .iter()
        .map(|l| format!("\n  | {}", l.chars().take(400).collect::<String>()))
        .collect::<String>()
}

/// The operator stopped under the run: the error carries its log's last lines, as CI keeps only
/// what the run printed (the log holds no secret: the smoke run checks it).
fn operator_exited(status: std::process::ExitStatus, layout: &Layout) -> anyhow::Error {
    let path = layout.file("operator.log");
    let tail = log_tail(&std::fs::read_to_string(&path).unwrap_or_default());
    anyhow::anyhow!(
        "the operator exited: {status}; the last lines of its log ({}):{tail}",
        path.display()
    )
}
