//! `cargo xtask bench`: tables of figures, one bench at a time (`--only NAME`, repeatable):
//!
//! - `health`, `discovery`, `lease-store`: example programs of their crates ([`examples`]);
//! - `operator`: the operator's memory and convergence with many Proxies, and its lease API as
//!   crawlers meet it ([`operator`], [`lease_api`]);
//! - `kvm2`: time to Ready and upload memory on the local hypervisor ([`kvm2`]);
//! - `pool`: a ProxyPool's failover and rotation ([`pool`]);
//! - `gateway`: the gateway's cost over tinyproxy alone: a new tunnel and request, one long
//!   tunnel, memory per idle tunnel ([`gateway`]).
//!
//! `operator`, `kvm2` and `pool` run the shipped programs (the operator, or the operator built
//! with the reference provider, and `egress-kube-testserver`) as processes of their own, built
//! here first; `gateway` builds `egress-gateway`, which its example program runs.
//!
//! `health`, `operator`, `kvm2`, `pool` and `gateway` each print their result as its guide shows it: a line
//! of the conditions (the bench's counts and durations, the build, the commit, the machine) and
//! one Markdown table ([`report`]), so updating a guide's figures is a copy.

mod examples;
mod gateway;
mod kvm2;
mod lease_api;
mod operator;
mod pool;
mod report;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::system;

/// Every bench, by the name `--only` takes.
const KNOWN: [&str; 7] = [
    "health",
    "discovery",
    "lease-store",
    "operator",
    "kvm2",
    "pool",
    "gateway",
];

/// The benches `only` asks for (all when it is empty), or which name is unknown.
fn chosen(only: &[String]) -> Result<Vec<&'static str>> {
    if let Some(unknown) = only.iter().find(|o| !KNOWN.contains(&o.as_str())) {
        bail!("no bench named {unknown:?} (known: {})", KNOWN.join(", "));
    }
    Ok(KNOWN
        .into_iter()
        .filter(|name| only.is_empty() || only.iter().any(|o| o == name))
        .collect())
}

/// Builds the test server, the operator, the reference operator and the lease API load;
/// returns the directory the programs are in.
fn build_programs(root: &Path, release: bool) -> Result<PathBuf> {
    let mut build = Command::new(crate::cargo_bin());
    build.current_dir(root).args([
        "build",
        "-p",
        "egress-kube-testserver",
        "-p",
        "egress-operator",
        "-p",
        "egress-e2e",
        "--bin",
        "egress-kube-testserver",
        "--bin",
        "egress-operator",
        "--example",
        "reference_operator",
        "--example",
        "lease_api_bench",
    ]);
    if release {
        build.arg("--release");
    }
    if !build.status().context("running cargo build")?.success() {
        bail!("building the bench programs failed");
    }
    Ok(crate::target_dir(root).join(profile(release)))
}

fn profile(release: bool) -> &'static str {
    if release { "release" } else { "debug" }
}

pub(crate) fn run(root: &Path, count: usize, release: bool, only: &[String]) -> Result<()> {
    let wanted = chosen(only)?;
    let wanted = |name: &str| wanted.contains(&name);
    let conditions = report::Conditions::here(root, release);
    // Before anything compiles; the discovery and lease-store benches run local redis-servers
    // (a cluster with redis-cli), the gateway bench real tinyproxies.
    let gateway_needs: &[&str] = if wanted("gateway") { &["tinyproxy"] } else { &[] };
    system::require_packages(&[system::BUILD_PACKAGES, &["redis-server", "redis-tools"], gateway_needs].concat())?;
    if wanted("health") {
        examples::health(root, release, &conditions)?;
    }
    if wanted("discovery") {
        examples::discovery(root, release)?;
    }
    if wanted("lease-store") {
        examples::lease_store(root, release)?;
    }
    if wanted("operator") || wanted("kvm2") || wanted("pool") {
        shipped(root, count, release, &wanted, &conditions)?;
    }
    if wanted("gateway") {
        gateway::run(root, release, &conditions)?;
    }
    Ok(())
}

/// The benches of the shipped programs that `wanted` names: `kvm2`, `pool`, `operator`.
fn shipped(
    root: &Path,
    count: usize,
    release: bool,
    wanted: &dyn Fn(&str) -> bool,
    conditions: &report::Conditions,
) -> Result<()> {
    let bin = build_programs(root, release)?;
    let dir = crate::target_dir(root).join("bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    if wanted("kvm2") {
        kvm2::run(root, &bin, &dir, conditions)?;
    }
    if wanted("pool") {
        pool::run(root, &bin, &dir, conditions)?;
    }
    if wanted("operator") {
        operator::run(root, &bin, &dir, count, conditions)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_name_chooses_every_bench_and_an_unknown_name_is_refused() {
        assert_eq!(chosen(&[]).unwrap(), KNOWN);
        assert_eq!(chosen(&["pool".to_owned()]).unwrap(), ["pool"]);
        assert_eq!(chosen(&["gateway".to_owned()]).unwrap(), ["gateway"]);
        assert_eq!(
            KNOWN,
            [
                "health",
                "discovery",
                "lease-store",
                "operator",
                "kvm2",
                "pool",
                "gateway"
            ]
        );
        let refused = chosen(&["pool".to_owned(), "nope".to_owned()]).unwrap_err().to_string();
        assert!(refused.starts_with("no bench named \"nope\""), "{refused}");
    }
}
