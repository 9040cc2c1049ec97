//! The lease API as crawler teams meet it, in the operator bench: the running manager's
//! discovery API at its fleet's size, with authentication on and the shipped default budgets,
//! next to the same API served from a fixed directory by a program of its own (the engine's
//! speed). Both are loaded the same way (crates/e2e/examples/lease_api_bench.rs, a release
//! build): the client `polite` alone, then beside the client `abuse`, each in a process of its
//! own. While the manager is measured, Proxy status changes are written through the API server
//! all along ([`Churn`]).
//!
//! Where each runs: the server measured (the manager or the engine's program) alone on core 1;
//! the load and the test API server on core 0, the abuse at the lowest priority there. (At the
//! lowest priority too, the test API server wrote only 145 status changes a second.) On a
//! real install the teams' crawlers run on machines of their own: what one of them spends on
//! its side must not come out of the other's, and only the server is shared. The abuse still
//! takes core 0 whenever the polite client does not, and the server's share is decided by the
//! server alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;

use crate::procs::{Killed, rss_kib};

/// The two clients' tokens.
#[derive(Clone)]
pub(crate) struct Tokens {
    pub(crate) polite: String,
    pub(crate) abuse: String,
}

impl Tokens {
    pub(crate) fn random() -> Self {
        let token = || {
            let bytes: [u8; 24] = rand::random();
            data_encoding::BASE64URL_NOPAD.encode(&bytes)
        };
        Self {
            polite: token(),
            abuse: token(),
        }
    }

    /// Writes the token dir the manager reads (one file per client).
    pub(crate) fn write_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("polite"), format!("{}\n", self.polite))?;
        std::fs::write(dir.join("abuse"), format!("{}\n", self.abuse))?;
        Ok(())
    }
}

/// One server's figures.
#[derive(Debug, Default)]
pub(crate) struct Side {
    pub(crate) polite_alone: f64,
    pub(crate) polite_beside_abuse: f64,
    pub(crate) abusive_requests_per_second: f64,
    pub(crate) polite_429_alone: u64,
    pub(crate) polite_429_beside: u64,
    pub(crate) abuse_429: u64,
    /// The server's CPU while the polite client ran alone, and beside the abuse: a share of
    /// its core.
    pub(crate) server_cpu: (f64, f64),
}

/// How long the polite client runs alone, then beside the abuse.
const ALONE: u64 = 15;
const BESIDE: u64 = 45;
/// The abuse starts this long before the polite client runs beside it.
const ABUSE_LEAD: u64 = 2;

/// The load program and the tokens it sends.
pub(crate) struct Load {
    pub(crate) program: PathBuf,
    pub(crate) tokens: Tokens,
}

/// `program` with `args` on `core`, at the lowest priority when `low`.
fn pinned(core: &str, low: bool, program: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("taskset");
    cmd.args(["-c", core]);
    if low {
        cmd.args(["nice", "-n", "19"]);
    }
    cmd.arg(program).args(args);
    cmd
}

impl Load {
    fn command(&self, core: &str, low: bool, args: &[&str]) -> std::process::Command {
        let mut cmd = pinned(core, low, &self.program, args);
        cmd.env("POLITE_TOKEN", &self.tokens.polite)
            .env("ABUSE_TOKEN", &self.tokens.abuse)
            .stderr(std::process::Stdio::inherit());
        cmd
    }

    fn figures(child: std::process::Child) -> Result<serde_json::Value> {
        let out = child.wait_with_output().context("the load")?;
        if !out.status.success() {
            bail!("the lease API load failed: {}", out.status);
        }
        serde_json::from_slice(&out.stdout).context("the load's figures")
    }

    fn start(&self, core: &str, low: bool, args: &[&str]) -> Result<std::process::Child> {
        self.command(core, low, args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting the lease API load")
    }

    /// Serves the API over a fixed directory of `count` proxies on core 1, logging to `log`;
    /// its URL, and the process (which stops when dropped).
    pub(crate) fn serve(&self, count: usize, log: &Path) -> Result<(Killed, String)> {
        use std::io::BufRead as _;
        let mut child = self
            .command("1", false, &["serve", &count.to_string()])
            .stderr(std::fs::File::create(log)?)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting the engine's server")?;
        let mut url = String::new();
        std::io::BufReader::new(child.stdout.take().context("its output")?).read_line(&mut url)?;
        Ok((Killed(child), url.trim().to_owned()))
    }

    /// The polite client alone, then beside the abuse, against `url`.
    /// The polite client alone, then beside the abuse, against `url`, served by process
    /// `server`.
    pub(crate) fn measure(&self, url: &str, server: u32) -> Result<Side> {
        let cpu = cpu_seconds(server);
        let started = std::time::Instant::now();
        let alone = Self::figures(self.start("0", false, &["polite", url, &ALONE.to_string()])?)?;
        let cpu_alone = (cpu_seconds(server) - cpu) / started.elapsed().as_secs_f64();
        let abuse = self.start("0", true, &["abuse", url, &(BESIDE + 2 * ABUSE_LEAD).to_string()])?;
        std::thread::sleep(Duration::from_secs(ABUSE_LEAD));
        let (cpu, started) = (cpu_seconds(server), std::time::Instant::now());
        let beside = Self::figures(self.start("0", false, &["polite", url, &BESIDE.to_string()])?)?;
        let cpu_beside = (cpu_seconds(server) - cpu) / started.elapsed().as_secs_f64();
        let abuse = Self::figures(abuse)?;
        let float = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_default();
        let whole = |v: &serde_json::Value| v["limited"].as_u64().unwrap_or_default();
        Ok(Side {
            polite_alone: float(&alone, "pairsPerSecond"),
            polite_beside_abuse: float(&beside, "pairsPerSecond"),
            abusive_requests_per_second: float(&abuse, "requestsPerSecond"),
            polite_429_alone: whole(&alone),
            polite_429_beside: whole(&beside),
            abuse_429: whole(&abuse),
            server_cpu: (cpu_alone, cpu_beside),
        })
    }
}

/// The CPU time process `pid` has used, in seconds (utime and stime of /proc/PID/stat).
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the name (which may hold spaces) comes field 3; utime and stime are fields 14, 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or_default();
    (ticks(11) + ticks(12)) / rustix::param::clock_ticks_per_second() as f64
}

/// The share of one core process `pid` used over `length`, measured from now.
pub(crate) fn cpu_share(pid: u32, length: Duration) -> f64 {
    let before = cpu_seconds(pid);
    std::thread::sleep(length);
    (cpu_seconds(pid) - before) / length.as_secs_f64()
}

/// Samples a process's resident memory each second until stopped.
pub(crate) struct RssSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<f64>>,
}

impl RssSampler {
    pub(crate) fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut samples = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    samples.push(rss_kib(pid, "VmRSS:").map_or(0.0, |k| k as f64 / 1024.0));
                }
                samples
            }
        });
        Self { stop, task }
    }

    pub(crate) async fn stop(self) -> Vec<f64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// Status changes written through the API server while it runs: every 50 ms the reference
/// operator's verdict file (`REFERENCE_UNHEALTHY_FILE`) moves a window of unhealthy Proxies
/// and a window of slow ones (250 ms, against the scripted 7 ms: a material change) along the
/// fleet, so each tick flips [`STEP`] verdicts each way and moves [`STEP`] latencies each way.
/// A watch on the namespace counts the writes that reach the API server.
pub(crate) struct Churn {
    started: Instant,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    writer: std::thread::JoinHandle<()>,
    watch: tokio::task::JoinHandle<()>,
}

/// Proxies entering (and as many leaving) each window per tick.
const STEP: usize = 4;
const WINDOW: usize = 40;
const TICK: Duration = Duration::from_millis(50);

impl Churn {
    /// The verdict file's text at tick `t` over a fleet of `count` Proxies named `p00000`...
    pub(crate) fn verdicts(t: usize, count: usize, namespace: &str) -> String {
        let name = |i: usize| format!("{namespace}/p{:05}", i % count);
        let mut text = String::new();
        for k in 0..WINDOW {
            text.push_str(&name(t * STEP + k));
            text.push('\n');
            text.push_str(&format!("{} 250\n", name(count / 2 + t * STEP + k)));
        }
        text
    }

    /// Starts moving the windows in `file`, and counting `Proxy` writes in `namespace`.
    pub(crate) fn start(file: PathBuf, count: usize, namespace: &str, client: kube::Client) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let writer = std::thread::spawn({
            let (stop, namespace) = (stop.clone(), namespace.to_owned());
            move || {
                let mut t = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Whole, by rename: the operator never reads half a file.
                    let next = file.with_extension("next");
                    if std::fs::write(&next, Self::verdicts(t, count, &namespace)).is_ok() {
                        let _ = std::fs::rename(&next, &file);
                    }
                    t += 1;
                    std::thread::sleep(TICK);
                }
            }
        });
        let watch = tokio::spawn({
            let written = written.clone();
            let api: kube::Api<egress_api::Proxy> = kube::Api::namespaced(client, namespace);
            async move {
                let events = kube::runtime::watcher(api, kube::runtime::watcher::Config::default());
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    if let Ok(kube::runtime::watcher::Event::Apply(_)) = event {
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        Self {
            started: Instant::now(),
            stop,
            written,
            writer,
            watch,
        }
    }

    /// Stops, and answers the writes a second it counted since it started.
    pub(crate) fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.watch.abort();
        let _ = self.writer.join();
        self.written.load(Ordering::Relaxed) as f64 / self.started.elapsed().as_secs_f64()
    }
}

/// The case's rows of the bench table.
pub(crate) fn print(
    manager: &Side,
    engine: &Side,
    churn: f64,
    idle_cpu: (f64, f64),
    rss: &[f64],
    peak_mib: f64,
    limit_mib: f64,
) {
    let percent = |a: f64, b: f64| if b > 0.0 { a / b * 100.0 } else { 0.0 };
    println!();
    println!(
        "| lease API, auth on, default budgets; clients `polite` (8 connections) and `abuse` (64, lowest priority); server on core 1, load on core 0 | running manager | fixed directory |"
    );
    println!("|---|---|---|");
    println!("| Proxy status changes written per second through the API server while measured | {churn:.0} | none |");
    println!(
        "| manager CPU without API load, share of its core: at rest / with those status changes | {:.0} % / {:.0} % | |",
        idle_cpu.0 * 100.0,
        idle_cpu.1 * 100.0
    );
    println!(
        "| polite pairs per second alone (goal: manager at least 80 % of the fixed directory) | {:.0} ({:.0} %) | {:.0} |",
        manager.polite_alone,
        percent(manager.polite_alone, engine.polite_alone),
        engine.polite_alone
    );
    println!(
        "| polite pairs per second beside the abuse (goal: at least 80 % of alone) | {:.0} ({:.0} %) | {:.0} ({:.0} %) |",
        manager.polite_beside_abuse,
        percent(manager.polite_beside_abuse, manager.polite_alone),
        engine.polite_beside_abuse,
        percent(engine.polite_beside_abuse, engine.polite_alone)
    );
    println!(
        "| polite 429s alone / beside the abuse (goal: none alone) | {} / {} | {} / {} |",
        manager.polite_429_alone, manager.polite_429_beside, engine.polite_429_alone, engine.polite_429_beside
    );
    println!(
        "| abusive requests per second; 429s among them | {:.0}; {} | {:.0}; {} |",
        manager.abusive_requests_per_second, manager.abuse_429, engine.abusive_requests_per_second, engine.abuse_429
    );
    println!(
        "| the server's CPU, share of its core: polite alone / beside the abuse | {:.0} % / {:.0} % | {:.0} % / {:.0} % |",
        manager.server_cpu.0 * 100.0,
        manager.server_cpu.1 * 100.0,
        engine.server_cpu.0 * 100.0,
        engine.server_cpu.1 * 100.0
    );
    let most = rss.iter().copied().fold(0.0, f64::max);
    println!(
        "| manager RSS, highest sample while measured; lifetime peak (VmHWM) | {most:.1} MiB; {peak_mib:.1} MiB ({} the {limit_mib:.0} MiB limit) | |",
        if peak_mib < limit_mib { "under" } else { "OVER" }
    );
}
