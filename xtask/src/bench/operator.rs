//! `cargo xtask bench --only operator`: the operator's memory and convergence with many Proxies.
//!
//! Starts `egress-kube-testserver` (its own process), creates N Managed Proxies, then starts the
//! operator built with the reference provider and an all-healthy health verdict
//! (`examples/reference_operator.rs`, the same program as the shipped binary otherwise) and
//! follows `proxy_operator_proxies{phase="Ready"}` on its metrics until every Proxy is Ready.
//! Reports the time to Ready and the operator's resident memory (peak and after settling) next to
//! the 128 MiB limit the manager Deployment ships with; then its lease API as crawlers meet it,
//! beside the same API in one process ([`super::lease_api`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use egress_api::{Placement, Proxy, ProxySpec};
use futures::StreamExt;
use kube::api::{Api, PostParams};

use super::lease_api::{self, Churn, Load, RssSampler, Side, Tokens};
use super::report::{self, Conditions, Table};
use crate::procs::{Killed, rss_kib};
use crate::test_server;

/// The manager Deployment's memory limit.
const LIMIT_MIB: f64 = 128.0;
/// How long the operator may take to make every Proxy Ready.
const READY_BUDGET: Duration = Duration::from_secs(1800);
/// How long the steady state runs before its figures are taken.
const STEADY: Duration = Duration::from_secs(30);

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The value of `proxy_operator_proxies{phase="Ready"}` in a metrics page.
fn ready_in(page: &str) -> u64 {
    page.lines()
        .find_map(|l| l.strip_prefix(r#"proxy_operator_proxies{phase="Ready"} "#))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// How many Proxies the operator whose metrics are at `metrics` counts Ready; `None` when its
/// metrics could not be read.
async fn ready_count(metrics: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(metrics))
        .await
        .ok()?
        .ok()?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {metrics}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(ready_in(&body))
}

/// Writes the providers file of the bench: one reference entry.
fn write_providers(dir: &Path) -> Result<PathBuf> {
    let providers = dir.join("providers.yaml");
    // The highest create budget: the bench measures the operator, not the guard against a
    // runaway fleet (docs/configuration.md#the-create-budget).
    std::fs::write(
        &providers,
        "providers:\n  - name: mem\n    type: reference\n    createsPerMinute: 10000\n",
    )?;
    Ok(providers)
}

/// The bench's Proxy number `i`.
fn bench_proxy(i: usize) -> Proxy {
    Proxy::new(
        &format!("p{i:05}"),
        ProxySpec {
            provider: "mem".into(),
            placement: Some(Placement {
                zone: "zone-a".into(),
                machine_type: "small".into(),
                image: "debian-13".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
}

/// Creates `count` Proxies in namespace `bench`, 32 at a time; returns how long it took.
async fn create_proxies(kubeconfig: &Path, count: usize) -> Result<Duration> {
    let api: Api<Proxy> = Api::namespaced(test_server::client(kubeconfig).await?, "bench");
    let started = Instant::now();
    let results: Vec<Result<Proxy, kube::Error>> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &bench_proxy(i)).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
        bail!("creating Proxies: {e}");
    }
    Ok(started.elapsed())
}

/// Where the operator under test reads and writes.
struct Setup<'a> {
    bin: &'a Path,
    dir: &'a Path,
    providers: &'a Path,
    kubeconfig: &'a Path,
    /// The token dir of the two clients.
    clients: &'a Path,
    /// The file its reference health verdicts are read from.
    verdicts: &'a Path,
    /// `host:port` of its metrics and of its discovery API.
    metrics: &'a str,
    discovery: &'a str,
}

/// Starts the reference operator as `setup` says.
fn start_operator(setup: &Setup<'_>) -> Result<Killed> {
    let operator = Command::new(setup.bin.join("examples/reference_operator"))
        .arg(format!("--providers-config={}", setup.providers.display()))
        // The bench's Proxies are in `bench`; the operator otherwise serves its own namespace.
        .arg("--proxy-namespace=bench")
        .arg(format!("--metrics-bind-address={}", setup.metrics))
        .arg(format!("--discovery-addr={}", setup.discovery))
        // Plain HTTP: the figures are the API's own, as its earlier ones were.
        .arg("--discovery-tls=off")
        // Authentication on, as deployed: the two clients' files, and no default client.
        .arg(format!("--discovery-token-dir={}", setup.clients.display()))
        .arg(format!(
            "--discovery-token-file={}",
            setup.dir.join("no-default-client").display()
        ))
        .args([
            "--metrics-secure=false",
            "--health-probe-bind-address=0",
            "--provider-check-interval=0",
            "--zap-log-level=info",
            "--zap-encoder=json",
        ])
        .env("KUBECONFIG", setup.kubeconfig)
        .env("REFERENCE_UNHEALTHY_FILE", setup.verdicts)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(setup.dir.join("operator.log"))?)
        .spawn()
        .context("starting the reference operator")?;
    Ok(Killed(operator))
}

/// Follows the operator's metrics until `count` Proxies are Ready; returns the time from
/// `started` to the first Ready (if one was seen before all were) and to all Ready.
async fn wait_all_ready(
    operator: &mut Killed,
    metrics: &str,
    count: usize,
    started: Instant,
    log: &Path,
) -> Result<(Option<Duration>, Duration)> {
    let mut first_ready = None;
    loop {
        if let Some(status) = operator.0.try_wait()? {
            bail!("the operator exited: {status} (see {})", log.display());
        }
        let ready = ready_count(metrics).await.unwrap_or(0);
        if ready > 0 && first_ready.is_none() {
            first_ready = Some(started.elapsed());
        }
        if ready as usize >= count {
            return Ok((first_ready, started.elapsed()));
        }
        if started.elapsed() > READY_BUDGET {
            bail!("only {ready} of {count} Proxies Ready after {READY_BUDGET:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The lease API figures of the running manager, measured while Proxy statuses change.
struct UnderLoad {
    manager: Side,
    churn: f64,
    /// The manager's CPU share at rest and with the status changes, without API load.
    idle_cpu: (f64, f64),
    rss: Vec<f64>,
}

/// Measures the manager (process `pid`, its discovery API at `discovery`) under the lease load
/// while the verdicts in `verdicts` churn; the test server (`server`) and this process share
/// the load's core.
async fn under_load(
    kubeconfig: &Path,
    load: Load,
    (pid, server): (u32, u32),
    verdicts: PathBuf,
    count: usize,
    discovery: &str,
) -> Result<UnderLoad> {
    let client = test_server::client(kubeconfig).await?;
    // The manager alone on core 1; the test API server (elsewhere in a cluster) with the load,
    // and so is this process, which writes the verdicts and counts the status changes.
    for (process, core) in [(pid, "1"), (server, "0"), (std::process::id(), "0")] {
        egress_testkit::redis::pin(process, core).map_err(anyhow::Error::msg)?;
    }
    let sample = Duration::from_secs(10);
    let at_rest = tokio::task::spawn_blocking(move || lease_api::cpu_share(pid, sample)).await?;
    let churn = Churn::start(verdicts, count, "bench", client);
    let churning = tokio::task::spawn_blocking(move || lease_api::cpu_share(pid, sample)).await?;
    let sampler = RssSampler::start(pid);
    let url = format!("http://{discovery}");
    let manager = tokio::task::spawn_blocking(move || load.measure(&url, pid)).await??;
    Ok(UnderLoad {
        manager,
        churn: churn.stop(),
        idle_cpu: (at_rest, churning),
        rss: sampler.stop().await,
    })
}

/// The operator's figures, for the table.
struct Figures {
    count: usize,
    created: Duration,
    first_ready: Option<Duration>,
    all_ready: Duration,
    /// KiB: the peak at all Ready, the peak and the resident set after the steady state, and
    /// the test server's resident set.
    peak_at_ready: u64,
    peak: u64,
    settled: u64,
    server_rss: u64,
}

fn print_table(f: &Figures, conditions: &Conditions) {
    let limit = if mib(f.peak) < LIMIT_MIB { "under it" } else { "OVER it" };
    let mut table = Table::new(&["Figure", "Value"]);
    table
        .row([
            "creating the Proxies in the test server".to_owned(),
            report::seconds(f.created),
        ])
        .row([
            "operator start to first Ready".to_owned(),
            report::seconds(f.first_ready.unwrap_or(f.all_ready)),
        ])
        .row(["operator start to all Ready".to_owned(), report::seconds(f.all_ready)])
        .row([
            "operator peak RSS (VmHWM) at all Ready".to_owned(),
            report::mib(f.peak_at_ready),
        ])
        .row([
            format!("operator peak RSS after {} s of steady state", STEADY.as_secs()),
            report::mib(f.peak),
        ])
        .row([
            format!("operator RSS after {} s of steady state", STEADY.as_secs()),
            report::mib(f.settled),
        ])
        .row([
            "the manager Deployment's memory limit".to_owned(),
            format!("{LIMIT_MIB:.0} MiB (the peak {limit})"),
        ])
        .row([
            "test server RSS (a process of its own, for reference)".to_owned(),
            report::mib(f.server_rss),
        ]);
    table.print(&conditions.line(
        "operator",
        &format!(
            "{} Managed Proxies of the reference provider (every verdict healthy) created in \
             egress-kube-testserver, 32 at a time, before the operator built with it starts; its \
             Ready count read from its metrics every 0.5 s; memory read at all Ready and again after \
             {} s of steady state",
            report::count(f.count as u64),
            STEADY.as_secs()
        ),
    ));
}

/// Runs the operator bench with `count` Proxies, the programs in `bin` (a `profile` build) and
/// scratch space `dir`; prints its tables.
pub(super) fn run(root: &Path, bin: &Path, dir: &Path, count: usize, conditions: &Conditions) -> Result<()> {
    let providers = write_providers(dir)?;
    let (server, kubeconfig) = test_server::start(root, bin, "bench", dir)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let created = runtime.block_on(create_proxies(&kubeconfig, count))?;
    // The engine's speed first, on a quiet machine: the same load against the API served in
    // one process from a fixed directory of as many proxies.
    let load = Load {
        program: bin.join("examples/lease_api_bench"),
        tokens: Tokens::random(),
    };
    let clients = dir.join("clients");
    load.tokens.write_dir(&clients)?;
    eprintln!("bench: {count} Proxies created in {created:.1?}; the lease API over a fixed directory");
    let engine = {
        let (server, url) = load.serve(count, &dir.join("engine.log"))?;
        load.measure(&url, server.0.id())?
    };
    eprintln!("bench: starting the operator");
    let verdicts = dir.join("verdicts");
    let metrics = format!("127.0.0.1:{}", egress_testkit::try_free_port()?);
    let discovery = format!("127.0.0.1:{}", egress_testkit::try_free_port()?);
    let setup = Setup {
        bin,
        dir,
        providers: &providers,
        kubeconfig: &kubeconfig,
        clients: &clients,
        verdicts: &verdicts,
        metrics: &metrics,
        discovery: &discovery,
    };
    let started = Instant::now();
    let mut operator = start_operator(&setup)?;
    let pid = operator.0.id();
    let log = dir.join("operator.log");
    let (first_ready, all_ready) = runtime.block_on(wait_all_ready(&mut operator, &metrics, count, started, &log))?;
    let peak_at_ready = rss_kib(pid, "VmHWM:").unwrap_or(0);
    // A while of steady state (drift polls), then the figures again.
    std::thread::sleep(STEADY);
    let figures = Figures {
        count,
        created,
        first_ready,
        all_ready,
        peak_at_ready,
        peak: rss_kib(pid, "VmHWM:").unwrap_or(0),
        settled: rss_kib(pid, "VmRSS:").unwrap_or(0),
        server_rss: rss_kib(server.0.id(), "VmRSS:").unwrap_or(0),
    };
    let loaded = runtime.block_on(under_load(
        &kubeconfig,
        load,
        (pid, server.0.id()),
        verdicts.clone(),
        count,
        &discovery,
    ))?;
    let peak_after = rss_kib(pid, "VmHWM:").unwrap_or(0);
    drop(operator);
    drop(server);
    print_table(&figures, conditions);
    lease_api::print(
        &loaded.manager,
        &engine,
        loaded.churn,
        loaded.idle_cpu,
        &loaded.rss,
        mib(peak_after),
        LIMIT_MIB,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_count_is_read_from_the_metrics_page() {
        let page = "# HELP x\nproxy_operator_proxies{phase=\"Pending\"} 3\nproxy_operator_proxies{phase=\"Ready\"} 7\n";
        assert_eq!(ready_in(page), 7);
        assert_eq!(ready_in("nothing here\n"), 0);
    }
}
