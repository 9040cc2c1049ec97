//! The benches that are example programs of their crates, each run with `cargo run --example`
//! and printing one line of figures (or, for the lease stores, its own table): the health
//! engine (printed here as its guide's table, [`super::report`]), the discovery API, the lease
//! stores.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::report::{self, Conditions, Table};

/// `cargo run --quiet -p <package> --example <example>` in `root`, a release build when `release`.
pub(super) fn example(root: &Path, package: &str, example: &str, release: bool) -> Command {
    let mut cmd = Command::new(crate::cargo_bin());
    cmd.current_dir(root)
        .args(["run", "--quiet", "-p", package, "--example", example]);
    if release {
        cmd.arg("--release");
    }
    cmd
}

/// The fleet sizes of the health bench, one process each.
const HEALTH_FLEETS: [u64; 2] = [1_000, 10_000];

/// The health engine's figures: one process per fleet size (examples/health_bench.rs), each
/// printing one line of `|`-separated cells; printed as one table, a column per size.
pub(super) fn health(root: &Path, release: bool, conditions: &Conditions) -> Result<()> {
    let mut columns = Vec::new();
    for n in HEALTH_FLEETS {
        let out = example(root, "egress-health", "health_bench", release)
            .args(["--", "--proxies", &n.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .context("running the health bench")?;
        if !out.status.success() {
            bail!("the health bench failed for {n} proxies");
        }
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        columns.push(line.split('|').map(str::to_string).collect::<Vec<_>>());
    }
    let header: Vec<String> = HEALTH_FLEETS
        .iter()
        .map(|&n| format!("{} proxies", report::count(n)))
        .collect();
    let mut table = Table::new(&["Figure", &header[0], &header[1]]);
    for (cell, figure) in [
        (1, "no-op probes per second"),
        (2, "scheduler CPU with a no-op probe (share of one core; target < 5 %)"),
        (3, "state per proxy (resident memory growth / proxies; target < 2 KiB)"),
        (
            4,
            "TLS probes per second through an in-process proxy to an in-process target",
        ),
        (
            5,
            "CPU while probing with TLS (share of one core, proxy and target included)",
        ),
        (
            6,
            "exit check off / on at its default interval (10 min), from the start: no-op CPU, exit checks made",
        ),
        (
            7,
            "the same with TLS probes and the real exit check through the proxy: probes per second, exit checks made",
        ),
        (8, "the same: CPU (share of one core)"),
        (
            9,
            "the exit check at its default interval in steady state, from the cost per check above (target: within 10 %)",
        ),
    ] {
        let values = columns.iter().map(|c| c.get(cell).cloned().unwrap_or_default());
        table.row(std::iter::once(figure.to_owned()).chain(values));
    }
    table.print(&conditions.line(
        "health",
        "the health engine with 64 workers, every proxy probed once a second, at 1 000 and at \
         10 000 proxies (a process each); each figure over 10 s after 3 s of warm-up, first with a \
         probe that does nothing, then with TLS probes through a CONNECT proxy to a TLS target, \
         both on loopback in the bench's process; the exit-check rows run 13 s from the engine's \
         start, so every proxy's first exit check is in them (later ones come every 10 minutes)",
    ));
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
    println!();
    for row in discovery_rows(&cells) {
        println!("{row}");
    }
    Ok(())
}

/// The rows of the discovery bench's table: each figure's text, with its value cells (what
/// examples/discovery_bench.rs prints, `|`-separated, in this order) put in for the `{}`s.
fn discovery_rows(cells: &[&str]) -> Vec<String> {
    const SHARE: &str = "in-memory pairs per second, on Redis pairs per second (share of in-memory), acquire p50 / p99 | {}, {} ({}), {} ms / {} ms";
    let pool = "{\"pool\": \"pool-07\"} (1/16 of the fleet)";
    let geo = "{\"geo\": \"eu\"} (1/2)";
    let rows: Vec<String> = [
        "discovery API on loopback ({} proxies, {} clients) | figure".to_owned(),
        "acquire+release pairs per second | {}".to_owned(),
        "acquire (POST /v1/leases) p50 / p99 (target p99 < 5 ms) | {} ms / {} ms".to_owned(),
        "release (DELETE /v1/leases/{id}) p50 / p99 (target p99 < 5 ms) | {} ms / {} ms".to_owned(),
        "whole pair p50 / p99 (two requests back to back) | {} ms / {} ms".to_owned(),
        "trivial hyper handler, same clients: pairs per second | {}".to_owned(),
        "trivial handler: one request p50 / p99, whole pair p99 | {} ms / {} ms, {} ms".to_owned(),
        "API rate / ceiling (target at least 50 %) | {}".to_owned(),
        "on the Redis lease store (local redis-server, appendfsync always): pairs per second | {}".to_owned(),
        "on Redis: acquire p50 / p99, release p50 / p99 | {} ms / {} ms, {} ms / {} ms".to_owned(),
        "on Redis with appendfsync everysec (a crash may lose the last second): pairs per second, acquire p50 / p99 | {}, {} ms / {} ms".to_owned(),
        format!("the bench on one core, Redis (appendfsync always) on another: {SHARE}"),
        format!("selector {pool}: {SHARE}"),
        format!("selector {geo}: {SHARE}"),
        format!("the bench on one core, Redis on another, selector {pool}: {SHARE}"),
        format!("the bench on one core, Redis on another, selector {geo}: {SHARE}"),
    ]
    .into();
    let mut next = cells.iter().copied().chain(std::iter::repeat("?"));
    let mut table: Vec<String> = rows
        .iter()
        .map(|row| {
            let parts: Vec<&str> = row.split("{}").collect();
            let mut filled = parts[0].to_owned();
            for part in &parts[1..] {
                filled.push_str(next.next().unwrap_or("?"));
                filled.push_str(part);
            }
            format!("| {filled} |")
        })
        .collect();
    table.insert(1, "|---|---|".to_owned());
    table
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_discovery_table_puts_each_cell_in_its_row_in_order() {
        let numbers: Vec<String> = (0..47).map(|i| i.to_string()).collect();
        let cells: Vec<&str> = numbers.iter().map(String::as_str).collect();
        let rows = discovery_rows(&cells);
        assert_eq!(rows.len(), 17);
        assert_eq!(rows[0], "| discovery API on loopback (0 proxies, 1 clients) | figure |");
        assert_eq!(rows[1], "|---|---|");
        assert_eq!(
            rows[4],
            "| release (DELETE /v1/leases/{id}) p50 / p99 (target p99 < 5 ms) | 5 ms / 6 ms |"
        );
        assert_eq!(
            rows[16],
            "| the bench on one core, Redis on another, selector {\"geo\": \"eu\"} (1/2): in-memory pairs per second, on Redis pairs per second (share of in-memory), acquire p50 / p99 | 42, 43 (44), 45 ms / 46 ms |"
        );
        assert!(
            discovery_rows(&[]).iter().skip(2).all(|r| r.contains('?')),
            "missing cells show ?"
        );
    }
}
