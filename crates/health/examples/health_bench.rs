//! The health engine's figures, for `cargo xtask bench`: at 1 000 and 10 000 proxies probed
//! once a second,
//!
//! - the scheduler's own CPU, with a probe that does nothing (so only scheduling is measured);
//! - the memory each proxy's state costs (resident memory before and after the records exist);
//! - probes per second sustained with real TLS probes through an in-process CONNECT proxy to an
//!   in-process TLS target (both on loopback, in this process, so they share its CPU);
//! - the exit check's cost: the same runs with the check off and on at its default interval,
//!   each measured from the engine's start (so every first exit check, made right after a
//!   proxy's first passing probe, falls in the window): the no-op probe's CPU with a no-op
//!   check naming a new address each time, and the TLS probes' rate and CPU with the real check
//!   through the proxy to an in-process https echo (every proxy one exit, the worst case for
//!   sharing).
//!
//! Prints its figures for one fleet size (`--proxies N`) as one line of `|`-separated cells;
//! `cargo xtask bench --only health` runs it per size and prints the guide's table. Not a test: it
//! asserts nothing.

// The probe tests' TLS target (a test CA, answering the status its path ends with).
use egress_testkit as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};

use egress_health::{
    ConnectProber, DEFAULT_EXIT_INTERVAL, EchoError, Engine, EngineConfig, ExitCheck, HealthMetrics, ProbeOutcome,
    ProbeRequest, ProbeSettings, ProbeTls, Prober, ProxyKey, ProxySource, ProxyView, Snapshot,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

struct Fleet(Vec<ProxyView>);

impl ProxySource for Fleet {
    fn proxies(&self) -> Vec<ProxyView> {
        self.0.clone()
    }
    fn generation(&self) -> Option<u64> {
        Some(0) // never changes
    }
}

fn fleet(n: usize, proxy: &str, url: &str) -> Arc<Fleet> {
    let (host, port) = proxy.rsplit_once(':').unwrap();
    Arc::new(Fleet(
        (0..n)
            .map(|i| ProxyView {
                key: ProxyKey::new("bench", &format!("p{i:05}")),
                uid: format!("uid-{i}"),
                host: host.into(),
                port: port.parse().unwrap(),
                settings: ProbeSettings {
                    credentials: None,
                    url: url.into(),
                    expected_status: 204,
                    interval: Duration::from_secs(1),
                    timeout: Duration::from_secs(5),
                    success_threshold: 2,
                    failure_threshold: 3,
                    destinations: None,
                },
                known: None,
            })
            .collect(),
    ))
}

/// A probe that does nothing, so only the engine is measured; its exit check names a new
/// address each time (a fleet whose every proxy has an exit of its own).
#[derive(Default)]
struct NoOp(Arc<AtomicU32>);

impl Prober for NoOp {
    fn probe(&self, _req: Arc<ProbeRequest>) -> impl Future<Output = ProbeOutcome> + Send {
        std::future::ready(ProbeOutcome {
            result: Ok(()),
            latency: Duration::from_millis(1),
        })
    }

    fn exit(&self, _req: Arc<ProbeRequest>) -> impl Future<Output = Result<IpAddr, EchoError>> + Send {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))))
    }
}

/// The engine's settings: 64 workers, and the exit check at `echo` when given.
fn config(echo: Option<&str>) -> EngineConfig {
    EngineConfig {
        workers: 64,
        exit: echo.map(|url| ExitCheck {
            url: url.to_owned(),
            interval: DEFAULT_EXIT_INTERVAL,
        }),
        ..Default::default()
    }
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 per second on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn rss_kib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0.0)
}

/// Probes done so far, from the engine's own metrics (so the count costs the probes nothing).
fn probes_done(registry: &prometheus_client::registry::Registry) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .filter(|l| l.starts_with("healthcheck_duration_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// Runs the engine; returns (probes per second, CPU share of one core) over `measure`, and the
/// resident memory once the engine has settled. The CPU window excludes the counting.
async fn run_engine<P: Prober>(
    source: Arc<Fleet>,
    prober: P,
    config: EngineConfig,
    warmup: Duration,
    measure: Duration,
) -> (f64, f64, f64) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let stop = CancellationToken::new();
    let metrics = HealthMetrics::new();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let engine = Engine::new(source, prober, config, metrics, Snapshot::default(), tx);
    tokio::spawn(engine.run(stop.clone()));
    tokio::time::sleep(warmup).await;
    // Before the counting below allocates its text.
    let rss = rss_kib();
    let n0 = probes_done(&registry);
    let (c0, t0) = (cpu_seconds(), Instant::now());
    tokio::time::sleep(measure).await;
    let (c1, t1) = (cpu_seconds(), Instant::now());
    let n1 = probes_done(&registry);
    stop.cancel();
    let secs = (t1 - t0).as_secs_f64();
    ((n1 - n0) as f64 / secs, (c1 - c0) / secs, rss)
}

/// A CONNECT proxy: answers 200 and splices the tunnel.
async fn connect_proxy() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut client = BufReader::new(client);
                let mut line = String::new();
                if client.read_line(&mut line).await.is_err() {
                    return;
                }
                let target = line.split(' ').nth(1).unwrap_or_default().to_string();
                loop {
                    let mut h = String::new();
                    if client.read_line(&mut h).await.unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                }
                let Ok(mut upstream) = TcpStream::connect(&target).await else {
                    return;
                };
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    addr
}

/// What the exit check costs in steady state, at its default interval: the extra CPU and the
/// probes lost per check in the windows above (where every first check fell), times the checks
/// a second the interval makes (`n` / 600 s), as a share of the probing's CPU and rate.
fn at_default_interval(
    n: usize,
    checks: usize,
    (cpu_off, cpu_on): (f64, f64),
    (rate_off, rate_on): (f64, f64),
) -> String {
    let window = (WARMUP + MEASURE).as_secs_f64();
    let per_second = n as f64 / DEFAULT_EXIT_INTERVAL.as_secs_f64();
    let per_check = |extra: f64| extra.max(0.0) * window / checks.max(1) as f64;
    let cpu = per_check(cpu_on - cpu_off) * per_second / cpu_off * 100.0;
    let rate = per_check(rate_off - rate_on) * per_second / rate_off * 100.0;
    format!("+{cpu:.2} % CPU, -{rate:.2} % probes per second")
}

/// The warm-up before a window that starts later than the engine.
const WARMUP: Duration = Duration::from_secs(3);
/// The window measured.
const MEASURE: Duration = Duration::from_secs(10);

/// One row for `--proxies N` (default 1000), as `|`-separated cells. One process per size, so
/// the memory figure of one size is not hidden in memory freed by another.
#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .skip_while(|a| a != "--proxies")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let proxy = connect_proxy().await;
    let pki = support::pki();
    let (target, _) = support::tls_target(&pki).await;
    let url = format!("https://localhost:{}/generate_204", target.port());
    let tls = ProbeTls::with_roots(pki.roots());

    // Scheduling alone: a probe that does nothing. Memory: resident memory before and after the
    // engine holds the records (their thresholds, verdicts, queue entries and metric series).
    let source = fleet(n, &proxy, &url);
    let before = rss_kib();
    let (noop_rate, noop_cpu, during) = run_engine(source, NoOp::default(), config(None), WARMUP, MEASURE).await;
    let per_proxy_kib = (during - before).max(0.0) / n as f64;

    // Real TLS probes through the in-process proxy.
    let prober = ConnectProber::new(tls.clone());
    let (tls_rate, tls_cpu, _) = run_engine(fleet(n, &proxy, &url), prober, config(None), WARMUP, MEASURE).await;

    // The exit check off, then on at its default interval, each from the engine's start.
    // An https echo, as the docs recommend: a CONNECT tunnel and TLS, as a probe goes.
    let echo_target = egress_testkit::echo::EchoTarget::https(&pki, "127.0.0.1").await;
    let echo = format!("https://localhost:{}/ip", echo_target.addr.port());
    let from_start = |echo| (fleet(n, &proxy, &url), config(echo), Duration::ZERO, WARMUP + MEASURE);
    let (source, off, from, window) = from_start(None);
    let (_, noop_off, _) = run_engine(source, NoOp::default(), off, from, window).await;
    let noop_checks = Arc::new(AtomicU32::new(0));
    let (source, on, from, window) = from_start(Some(&echo));
    let (_, noop_on, _) = run_engine(source, NoOp(noop_checks.clone()), on, from, window).await;
    let (source, off, from, window) = from_start(None);
    let prober = || ConnectProber::new(tls.clone());
    let (tls_off_rate, tls_off, _) = run_engine(source, prober(), off, from, window).await;
    let (source, on, from, window) = from_start(Some(&echo));
    let (tls_on_rate, tls_on, _) = run_engine(source, prober(), on, from, window).await;
    // Exit checks made in the windows: a cost unchanged because no check ran would prove nothing.
    let noop_checks = noop_checks.load(Ordering::Relaxed);
    let tls_checks = echo_target.peers().len();
    let pct = |x: f64| x * 100.0;
    let change = |on: f64, off: f64| if off > 0.0 { (on / off - 1.0) * 100.0 } else { 0.0 };
    let steady = at_default_interval(n, tls_checks, (tls_off, tls_on), (tls_off_rate, tls_on_rate));
    println!(
        "{n}|{noop_rate:.0}|{:.1} %|{per_proxy_kib:.2} KiB|{tls_rate:.0}|{:.0} %|{:.1} % / {:.1} % ({:+.0} %), {noop_checks} checks|{tls_off_rate:.0} / {tls_on_rate:.0} ({:+.0} %), {tls_checks} checks|{:.0} % / {:.0} % ({:+.0} %)|{steady}",
        pct(noop_cpu),
        pct(tls_cpu),
        pct(noop_off),
        pct(noop_on),
        change(noop_on, noop_off),
        change(tls_on_rate, tls_off_rate),
        pct(tls_off),
        pct(tls_on),
        change(tls_on, tls_off),
    );
}
