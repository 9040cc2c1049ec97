//! The dev run's exit check: an https echo target on this machine (the run's CA), which the
//! operator checks every proxy's exit against; the smoke run then reads each sample Proxy's
//! exit address in `kubectl get px -o wide`, as a person would.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use egress_api::Proxy;
use kube::Api;

/// How long the first exit checks get: each comes right after a proxy's first passing probe.
const EXIT_BUDGET: Duration = Duration::from_secs(60);

/// Smoke: each of `names` gets an exit, and `kubectl get px -o wide` shows it.
pub(super) async fn wide_shows_exits(
    api: &Api<Proxy>,
    kubeconfig: &Path,
    names: &[String],
    kubectl: &Path,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + EXIT_BUDGET;
    let mut exits = Vec::new();
    for name in names {
        let has_exit = |p: Option<&Proxy>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.exit.is_some());
        let watched = kube::runtime::wait::await_condition(api.clone(), name, has_exit);
        let proxy = match tokio::time::timeout_at(deadline, watched).await {
            Ok(found) => found.with_context(|| format!("watching {name}"))?,
            Err(_) => bail!("{name} has no exit after {EXIT_BUDGET:?}"),
        };
        let address = proxy.and_then(|p| p.status).and_then(|s| s.exit).map(|e| e.address);
        exits.push((name, address.context("an exit, as waited for")?));
    }
    let out = tokio::process::Command::new(kubectl)
        .args(["get", "px", "-o", "wide", "--request-timeout=20s"])
        .env("KUBECONFIG", kubeconfig)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .context("kubectl get did not finish")??;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.lines().next().is_some_and(|h| h.contains("EXIT")) {
        bail!(
            "kubectl get px -o wide shows no EXIT column:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (name, address) in &exits {
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()));
        if !row.is_some_and(|r| r.split_whitespace().any(|w| w == address)) {
            bail!("kubectl get px -o wide shows no exit {address} for {name}:\n{text}");
        }
    }
    println!("dev: smoke: kubectl get px -o wide shows each proxy's exit:");
    for line in text.lines() {
        println!("dev:   {line}");
    }
    Ok(())
}
