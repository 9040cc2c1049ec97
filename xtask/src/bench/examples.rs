//! The benches that are example programs of their crates, each run with `cargo run --example`
//! and printing one line of figures (or, for the lease stores, its own table): the health
//! engine, the discovery API, the lease stores.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// `cargo run --quiet -p <package> --example <example>` in `root`, a release build when `release`.
fn example(root: &Path, package: &str, example: &str, release: bool) -> Command {
    let mut cmd = Command::new(crate::cargo_bin());
    cmd.current_dir(root)
        .args(["run", "--quiet", "-p", package, "--example", example]);
    if release {
        cmd.arg("--release");
    }
    cmd
}

/// The health engine's figures: one process per fleet size (examples/health_bench.rs).
pub(super) fn health(root: &Path, release: bool) -> Result<()> {
    let mut rows = Vec::new();
    for n in [1_000, 10_000] {
        let out = example(root, "egress-health", "health_bench", release)
            .args(["--", "--proxies", &n.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .context("running the health bench")?;
        if !out.status.success() {
            bail!("the health bench failed for {n} proxies");
        }
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        rows.push(line.split('|').map(str::to_string).collect::<Vec<_>>());
    }
    let cell = |i: usize| {
        rows.iter()
            .map(|r| r.get(i).cloned().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    println!();
    println!("| health engine, proxies probed once a second | {} |", cell(0));
    println!("|---|---|---|");
    println!("| no-op probes per second | {} |", cell(1));
    println!(
        "| scheduler CPU with no-op probes (share of one core; target < 5 %) | {} |",
        cell(2)
    );
    println!(
        "| state per proxy (resident memory growth / proxies; target < 2 KiB) | {} |",
        cell(3)
    );
    println!(
        "| TLS probes per second sustained (64 workers; proxy and target in the same process) | {} |",
        cell(4)
    );
    println!(
        "| CPU while probing with TLS (share of one core, proxy and target included) | {} |",
        cell(5)
    );
    Ok(())
}

/// The discovery API's figures (examples/discovery_bench.rs).
pub(super) fn discovery(root: &Path, release: bool) -> Result<()> {
    let out = example(root, "egress-discovery", "discovery_bench", release)
        .stderr(Stdio::inherit())
        .output()
        .context("running the discovery bench")?;
    if !out.status.success() {
        bail!("the discovery bench failed");
    }
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let cells: Vec<&str> = line.split('|').collect();
    let cell = |i: usize| cells.get(i).copied().unwrap_or("?");
    println!();
    println!(
        "| discovery API on loopback ({} proxies, {} clients) | figure |",
        cell(0),
        cell(1)
    );
    println!("|---|---|");
    println!("| acquire+release pairs per second | {} |", cell(2));
    println!(
        "| acquire (POST /v1/leases) p50 / p99 (target p99 < 5 ms) | {} ms / {} ms |",
        cell(3),
        cell(4)
    );
    println!(
        "| release (DELETE /v1/leases/{{id}}) p50 / p99 (target p99 < 5 ms) | {} ms / {} ms |",
        cell(5),
        cell(6)
    );
    println!(
        "| whole pair p50 / p99 (two requests back to back) | {} ms / {} ms |",
        cell(7),
        cell(8)
    );
    println!(
        "| trivial hyper handler, same clients: pairs per second | {} |",
        cell(9)
    );
    println!(
        "| trivial handler: one request p50 / p99, whole pair p99 | {} ms / {} ms, {} ms |",
        cell(10),
        cell(11),
        cell(12)
    );
    println!("| API rate / ceiling (target at least 50 %) | {} |", cell(13));
    println!(
        "| on the Redis lease store (local redis-server, appendfsync always): pairs per second | {} |",
        cell(14)
    );
    println!(
        "| on Redis: acquire p50 / p99, release p50 / p99 | {} ms / {} ms, {} ms / {} ms |",
        cell(15),
        cell(16),
        cell(17),
        cell(18)
    );
    println!(
        "| on Redis with appendfsync everysec (a crash may lose the last second): pairs per second, acquire p50 / p99 | {}, {} ms / {} ms |",
        cell(19),
        cell(20),
        cell(21)
    );
    println!(
        "| the bench on one core, Redis (appendfsync always) on another: in-memory pairs per second, on Redis pairs per second (share of in-memory), acquire p50 / p99 | {}, {} ({}), {} ms / {} ms |",
        cell(22),
        cell(23),
        cell(24),
        cell(25),
        cell(26)
    );
    Ok(())
}

/// The lease stores without HTTP at three fleet sizes, and Redis's own time per script call
/// (`crates/discovery/examples/store_bench.rs` prints the table).
pub(super) fn lease_store(root: &Path, release: bool) -> Result<()> {
    println!();
    let status = example(root, "egress-discovery", "store_bench", release)
        .status()
        .context("running the lease store bench")?;
    if !status.success() {
        bail!("the lease store bench failed");
    }
    Ok(())
}
