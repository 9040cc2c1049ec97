//! `cargo xtask bench`: the operator's memory and convergence with many Proxies.
//!
//! Starts `egress-kube-testserver` (its own process), creates N Managed Proxies, then starts the
//! operator built with the reference provider and an all-healthy health verdict
//! (`examples/reference_operator.rs`, the same program as the shipped binary otherwise) and
//! follows `proxy_operator_proxies{phase="Ready"}` on its metrics until every Proxy is Ready.
//! Reports the time to Ready and the operator's resident memory (peak and after settling) next to
//! the 128 MiB limit the manager Deployment ships with; then its lease API as crawlers meet it,
//! beside the same API in one process (`bench_lease_api.rs`). The pool bench (`bench_pool.rs`) runs the same program with a pool.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use egress_api::{Placement, Proxy, ProxySpec};
use futures::StreamExt;
use kube::api::{Api, PostParams};

use crate::procs::{Killed, free_port, wait_for_file};
use crate::system;

/// The manager Deployment's memory limit.
const LIMIT_MIB: f64 = 128.0;

pub(crate) fn rss_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

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
    Some(
        body.lines()
            .find_map(|l| l.strip_prefix(r#"proxy_operator_proxies{phase="Ready"} "#))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0),
    )
}

/// The health engine's figures: one process per fleet size (examples/health_bench.rs).
fn health(root: &Path, release: bool) -> Result<()> {
    let mut rows = Vec::new();
    for n in [1_000, 10_000] {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(root)
            .args(["run", "--quiet", "-p", "egress-health", "--example", "health_bench"]);
        if release {
            cmd.arg("--release");
        }
        let out = cmd
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
fn discovery(root: &Path, release: bool) -> Result<()> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args([
        "run",
        "--quiet",
        "-p",
        "egress-discovery",
        "--example",
        "discovery_bench",
    ]);
    if release {
        cmd.arg("--release");
    }
    let out = cmd
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
fn lease_store(root: &Path, release: bool) -> Result<()> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root)
        .args(["run", "--quiet", "-p", "egress-discovery", "--example", "store_bench"]);
    if release {
        cmd.arg("--release");
    }
    println!();
    let status = cmd.status().context("running the lease store bench")?;
    if !status.success() {
        bail!("the lease store bench failed");
    }
    Ok(())
}

/// Starts `egress-kube-testserver` from `bin` with the CRDs and namespace `bench`; returns it
/// and the kubeconfig it wrote into `dir`.
pub(crate) fn start_test_server(root: &Path, bin: &Path, dir: &Path) -> Result<(Killed, PathBuf)> {
    let kubeconfig = dir.join("kubeconfig");
    let mut server = Killed(
        Command::new(bin.join("egress-kube-testserver"))
            .args(["--namespace", "bench", "--crds"])
            .arg(root.join("deploy/crds"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("testserver.log"))?)
            .spawn()
            .context("starting egress-kube-testserver")?,
    );
    wait_for_file(&kubeconfig, &mut server.0)?;
    Ok((server, kubeconfig))
}

pub(crate) fn run(root: &Path, count: usize, release: bool, only: &[String]) -> Result<()> {
    let known = ["health", "discovery", "lease-store", "operator", "kvm2", "pool"];
    if let Some(unknown) = only.iter().find(|o| !known.contains(&o.as_str())) {
        bail!("no bench named {unknown:?} (known: {})", known.join(", "));
    }
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    // Before anything compiles; the discovery and lease-store benches run local redis-servers
    // (a cluster with redis-cli).
    system::require_packages(&[system::BUILD_PACKAGES, &["redis-server", "redis-tools"]].concat())?;
    if wanted("health") {
        health(root, release)?;
    }
    if wanted("discovery") {
        discovery(root, release)?;
    }
    if wanted("lease-store") {
        lease_store(root, release)?;
    }
    if !wanted("operator") && !wanted("kvm2") && !wanted("pool") {
        return Ok(());
    }
    let profile = if release { "release" } else { "debug" };
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build.current_dir(root).args([
        "build",
        "-p",
        "egress-kube-testserver",
        "-p",
        "egress-operator",
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
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join(profile);
    let dir = target.join("bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    if wanted("kvm2") {
        crate::bench_kvm2::run(root, &bin, &dir)?;
    }
    if wanted("pool") {
        crate::bench_pool::run(root, &bin, &dir)?;
    }
    if !wanted("operator") {
        return Ok(());
    }
    let providers = dir.join("providers.yaml");
    // The highest create budget: the bench measures the operator, not the guard against a
    // runaway fleet (docs/configuration.md#the-create-budget).
    std::fs::write(
        &providers,
        "providers:\n  - name: mem\n    type: reference\n    createsPerMinute: 10000\n",
    )?;
    let (server, kubeconfig) = start_test_server(root, &bin, &dir)?;

    let runtime = tokio::runtime::Runtime::new()?;
    let created = runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &Default::default(),
        )
        .await?;
        let api: Api<Proxy> = Api::namespaced(kube::Client::try_from(config)?, "bench");
        let started = Instant::now();
        let results: Vec<Result<Proxy, kube::Error>> = futures::stream::iter(0..count)
            .map(|i| {
                let api = api.clone();
                async move {
                    let proxy = Proxy::new(
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
                    );
                    api.create(&PostParams::default(), &proxy).await
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            bail!("creating Proxies: {e}");
        }
        anyhow::Ok(started.elapsed())
    })?;
    // The engine's speed first, on a quiet machine: the same load against the API served in
    // one process from a fixed directory of as many proxies.
    let load = crate::bench_lease_api::Load {
        program: bin.join("examples/lease_api_bench"),
        tokens: crate::bench_lease_api::Tokens::random(),
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
    let port = free_port()?;
    let metrics = format!("127.0.0.1:{port}");
    let discovery = format!("127.0.0.1:{}", free_port()?);
    let started = Instant::now();
    let operator = Command::new(bin.join("examples/reference_operator"))
        .arg(format!("--providers-config={}", providers.display()))
        .arg(format!("--metrics-bind-address={metrics}"))
        .arg(format!("--discovery-addr={discovery}"))
        // Authentication on, as deployed: the two clients' files, and no default client.
        .arg(format!("--discovery-token-dir={}", clients.display()))
        .arg(format!(
            "--discovery-token-file={}",
            dir.join("no-default-client").display()
        ))
        .args([
            "--metrics-secure=false",
            "--health-probe-bind-address=0",
            "--provider-check-interval=0",
            "--zap-log-level=info",
            "--zap-encoder=json",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("REFERENCE_UNHEALTHY_FILE", &verdicts)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("operator.log"))?)
        .spawn()
        .context("starting the reference operator")?;
    let mut operator = Killed(operator);
    let pid = operator.0.id();

    let budget = Duration::from_secs(1800);
    let mut first_ready = None;
    let all_ready = runtime.block_on(async {
        loop {
            if let Some(status) = operator.0.try_wait()? {
                bail!(
                    "the operator exited: {status} (see {})",
                    dir.join("operator.log").display()
                );
            }
            let ready = ready_count(&metrics).await.unwrap_or(0);
            if ready > 0 && first_ready.is_none() {
                first_ready = Some(started.elapsed());
            }
            if ready as usize >= count {
                return anyhow::Ok(started.elapsed());
            }
            if started.elapsed() > budget {
                bail!("only {ready} of {count} Proxies Ready after {budget:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })?;
    let peak_at_ready = rss_kib(pid, "VmHWM:").unwrap_or(0);
    // A while of steady state (drift polls), then the figures again.
    std::thread::sleep(Duration::from_secs(30));
    let peak = rss_kib(pid, "VmHWM:").unwrap_or(0);
    let settled = rss_kib(pid, "VmRSS:").unwrap_or(0);
    let server_rss = rss_kib(server.0.id(), "VmRSS:").unwrap_or(0);
    let (manager, churn, idle_cpu, rss) = runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &Default::default(),
        )
        .await?;
        // The manager alone on core 1; the test API server (elsewhere in a cluster) with the load,
        // and so is this process, which writes the verdicts and counts the status changes.
        crate::bench_lease_api::pin(pid, "1")?;
        crate::bench_lease_api::pin(server.0.id(), "0")?;
        crate::bench_lease_api::pin(std::process::id(), "0")?;
        let sample = Duration::from_secs(10);
        let at_rest = tokio::task::spawn_blocking(move || crate::bench_lease_api::cpu_share(pid, sample)).await?;
        let churn =
            crate::bench_lease_api::Churn::start(verdicts.clone(), count, "bench", kube::Client::try_from(config)?);
        let churning = tokio::task::spawn_blocking(move || crate::bench_lease_api::cpu_share(pid, sample)).await?;
        let sampler = crate::bench_lease_api::RssSampler::start(pid);
        let url = format!("http://{discovery}");
        let manager = tokio::task::spawn_blocking(move || load.measure(&url, pid)).await??;
        anyhow::Ok((manager, churn.stop(), (at_rest, churning), sampler.stop().await))
    })?;
    let peak_after = rss_kib(pid, "VmHWM:").unwrap_or(0);
    drop(operator);
    drop(server);

    println!();
    println!("| egress-operator bench ({profile} build)               | figure |");
    println!("|---------------------------------------------------|--------|");
    println!("| Proxies                                           | {count} |");
    println!("| creating them in the test server                  | {created:.1?} |");
    println!(
        "| operator start to first Ready                     | {:.1?} |",
        first_ready.unwrap_or_default()
    );
    println!("| operator start to all Ready                       | {all_ready:.1?} |");
    println!(
        "| operator peak RSS (VmHWM) at all Ready            | {:.1} MiB |",
        mib(peak_at_ready)
    );
    println!(
        "| operator peak RSS after 30 s of steady state      | {:.1} MiB |",
        mib(peak)
    );
    println!(
        "| operator RSS after 30 s of steady state           | {:.1} MiB |",
        mib(settled)
    );
    println!(
        "| manager memory limit                              | {LIMIT_MIB:.0} MiB ({}) |",
        if mib(peak) < LIMIT_MIB { "under" } else { "OVER" }
    );
    println!(
        "| test server RSS (separate process, for reference) | {:.1} MiB |",
        mib(server_rss)
    );
    crate::bench_lease_api::print(&manager, &engine, churn, idle_cpu, &rss, mib(peak_after), LIMIT_MIB);
    Ok(())
}
