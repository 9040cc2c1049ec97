//! The abuse case of the operator bench: against the running manager's discovery API (its fleet
//! all Ready), 64 abusive clients acquire and release with distinct maximal (2 KiB) targets and
//! spam reports for a minute, while a few well-behaved clients lease beside them. Figures: the
//! manager's resident memory over the minute (peak, and whether it stays flat after warm-up),
//! and the well-behaved clients' pair rate against their rate without the abuse.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::rss_kib;

const ABUSERS: usize = 64;
const POLITE: usize = 8;
const BASELINE: Duration = Duration::from_secs(10);
const ABUSE: Duration = Duration::from_secs(60);
/// The target limit: every abusive target is exactly this long, and distinct.
const TARGET_BYTES: usize = 2048;

/// What the case measured.
#[derive(Debug)]
pub(crate) struct Figures {
    pub(crate) polite_alone: f64,
    pub(crate) polite_beside_abuse: f64,
    pub(crate) abusive_requests_per_second: f64,
    pub(crate) rss_before_mib: f64,
    /// RSS sampled each second of the abuse.
    pub(crate) rss_samples_mib: Vec<f64>,
    pub(crate) peak_mib: f64,
}

fn client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .context("an HTTP client")
}

/// One acquire+release; `Ok(false)` when no proxy was free (counted as no pair).
async fn pair(http: &reqwest::Client, base: &str, body: String) -> Result<bool> {
    let answer = http.post(format!("{base}/v1/leases")).body(body).send().await?;
    if answer.status() != 201 {
        let _ = answer.bytes().await;
        return Ok(false);
    }
    let grant: serde_json::Value = answer.json().await?;
    let id = grant["leaseID"].as_str().unwrap_or_default().to_owned();
    http.delete(format!("{base}/v1/leases/{id}"))
        .send()
        .await?
        .bytes()
        .await?;
    Ok(true)
}

/// Well-behaved clients' pairs per second while `running` holds, for `length`.
async fn polite(base: &str, length: Duration) -> Result<f64> {
    let started = Instant::now();
    let pairs = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..POLITE {
        let (base, pairs, http) = (base.to_owned(), pairs.clone(), client()?);
        clients.push(tokio::spawn(async move {
            while started.elapsed() < length {
                if pair(&http, &base, r#"{"target": "example.com"}"#.to_owned()).await? {
                    pairs.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    for c in clients {
        c.await??;
    }
    Ok(pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// A target nobody sent before, exactly [`TARGET_BYTES`] long.
fn distinct_target(client: usize, n: u64, what: &str) -> String {
    let head = format!("{what}-{client:02}-{n:012}.");
    format!("{head}{}", "x".repeat(TARGET_BYTES - head.len()))
}

async fn abuser(i: usize, base: String, stop: Arc<AtomicBool>, requests: Arc<AtomicU64>) -> Result<()> {
    let http = client()?;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let body = serde_json::json!({"target": distinct_target(i, n, "lease"), "ttlSeconds": 3600}).to_string();
        let answer = http.post(format!("{base}/v1/leases")).body(body).send().await?;
        requests.fetch_add(1, Ordering::Relaxed);
        if answer.status() != 201 {
            let _ = answer.bytes().await;
            continue;
        }
        let grant: serde_json::Value = answer.json().await?;
        let id = grant["leaseID"].as_str().unwrap_or_default().to_owned();
        // Report spam: every result, each with a target never seen before.
        for (k, result) in ["banned", "rate_limited", "ok"].into_iter().enumerate() {
            let body = serde_json::json!({"result": result, "target": distinct_target(i, n * 4 + k as u64, "report")});
            http.post(format!("{base}/v1/leases/{id}/report"))
                .body(body.to_string())
                .send()
                .await?
                .bytes()
                .await?;
            requests.fetch_add(1, Ordering::Relaxed);
        }
        http.delete(format!("{base}/v1/leases/{id}"))
            .send()
            .await?
            .bytes()
            .await?;
        requests.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Runs the case against the discovery API at `base`, served by process `pid`.
pub(crate) async fn run(base: &str, pid: u32) -> Result<Figures> {
    let rss = move || rss_kib(pid, "VmRSS:").map_or(0.0, |k| k as f64 / 1024.0);
    let polite_alone = polite(base, BASELINE).await?;
    if polite_alone == 0.0 {
        bail!("no lease was granted without abuse: is the fleet healthy?");
    }
    let rss_before_mib = rss();
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let abusers: Vec<_> = (0..ABUSERS)
        .map(|i| tokio::spawn(abuser(i, base.to_owned(), stop.clone(), requests.clone())))
        .collect();
    let started = Instant::now();
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while started.elapsed() < ABUSE {
            tick.tick().await;
            samples.push(rss());
        }
        samples
    });
    let polite_beside_abuse = polite(base, ABUSE).await?;
    stop.store(true, Ordering::Relaxed);
    let abusive = requests.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    for a in abusers {
        a.await??;
    }
    let rss_samples_mib = sampler.await?;
    let peak_mib = rss_kib(pid, "VmHWM:").map_or(0.0, |k| k as f64 / 1024.0);
    Ok(Figures {
        polite_alone,
        polite_beside_abuse,
        abusive_requests_per_second: abusive,
        rss_before_mib,
        rss_samples_mib,
        peak_mib,
    })
}

/// The case's rows of the bench table.
pub(crate) fn print(f: &Figures, limit_mib: f64) {
    let sample = |s: usize| f.rss_samples_mib.get(s).copied().unwrap_or_default();
    let most = f.rss_samples_mib.iter().copied().fold(0.0, f64::max);
    let last = f.rss_samples_mib.last().copied().unwrap_or_default();
    println!();
    println!(
        "| abuse: {ABUSERS} clients, distinct {TARGET_BYTES}-byte targets, report spam, {}s | figure |",
        ABUSE.as_secs()
    );
    println!("|---|---|");
    println!("| abusive requests per second | {:.0} |", f.abusive_requests_per_second);
    println!(
        "| {POLITE} well-behaved clients alone: pairs per second | {:.0} |",
        f.polite_alone
    );
    println!(
        "| the same beside the abuse: pairs per second (goal at least 80 %) | {:.0} ({:.0} %) |",
        f.polite_beside_abuse,
        f.polite_beside_abuse / f.polite_alone * 100.0
    );
    println!(
        "| manager RSS before, after 10 s, after 30 s, at the end | {:.1} / {:.1} / {:.1} / {last:.1} MiB |",
        f.rss_before_mib,
        sample(10),
        sample(30)
    );
    println!(
        "| manager RSS, highest sample during the abuse; lifetime peak (VmHWM) | {most:.1} MiB; {:.1} MiB ({} the {limit_mib:.0} MiB limit) |",
        f.peak_mib,
        if f.peak_mib < limit_mib { "under" } else { "OVER" }
    );
}
