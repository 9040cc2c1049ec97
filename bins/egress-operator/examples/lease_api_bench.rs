//! The load of the operator bench's lease API case (`cargo xtask bench` runs it in a release
//! build, places each process on a core and prints the figures). Two clients: `polite`, 8
//! connections that acquire and release one lease at a time and wait as told on a 429; `abuse`,
//! 64 connections that acquire with distinct 2 KiB targets, spam reports and never wait. Each
//! runs in a process of its own, so that how the machine shares its cores between them is the
//! kernel's business, not one runtime's.
//!
//! ```text
//! lease_api_bench serve COUNT          serves the API over a fixed directory of COUNT Ready
//!                                      proxies, the in-memory store, the two clients' tokens,
//!                                      the default budgets and the manager's logger (the bench's
//!                                      flags: JSON at info, so every request is logged as the
//!                                      manager logs it); prints its URL, then serves until its
//!                                      standard input closes
//! lease_api_bench polite URL SECONDS   the polite client; prints {"pairsPerSecond", "limited"}
//! lease_api_bench abuse URL SECONDS    the abuse; prints {"requestsPerSecond", "limited"}
//! ```
//!
//! The tokens come from `POLITE_TOKEN` and `ABUSE_TOKEN`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use egress_discovery::{Auth, ClientName, DiscoveryApi, Fleet, ProxyDirectory, ProxyInfo, TokenSet, serve};
use egress_lease::{MemoryStore, SystemClock};
use tokio_util::sync::CancellationToken;

const ABUSERS: usize = 64;
const POLITE: usize = 8;
/// The target limit: every abusive target is exactly this long, and distinct.
const TARGET_BYTES: usize = 2048;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client")
}

/// What one acquire+release gave.
enum Pair {
    Done,
    /// No proxy was free.
    NoMatch,
    /// The client was over its budget.
    RateLimited,
}

async fn pair(http: &reqwest::Client, base: &str, token: &str) -> Result<Pair, Error> {
    let answer = http
        .post(format!("{base}/v1/leases"))
        .bearer_auth(token)
        .body(r#"{"target": "example.com"}"#)
        .send()
        .await?;
    match answer.status().as_u16() {
        201 => {}
        429 => return Ok(Pair::RateLimited),
        409 => return Ok(Pair::NoMatch),
        other => return Err(format!("acquire answered {other}: {}", answer.text().await.unwrap_or_default()).into()),
    }
    let grant: serde_json::Value = answer.json().await?;
    let id = grant["leaseID"].as_str().unwrap_or_default().to_owned();
    let release = http
        .delete(format!("{base}/v1/leases/{id}"))
        .bearer_auth(token)
        .send()
        .await?;
    let status = release.status().as_u16();
    release.bytes().await?;
    Ok(if status == 429 { Pair::RateLimited } else { Pair::Done })
}

/// The polite client's pairs per second over `length`, and the 429s it got.
async fn polite(base: &str, token: &str, length: Duration) -> Result<(f64, u64), Error> {
    let started = Instant::now();
    let pairs = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..POLITE {
        let (base, token, pairs, limited, http) = (
            base.to_owned(),
            token.to_owned(),
            pairs.clone(),
            limited.clone(),
            client(),
        );
        clients.push(tokio::spawn(async move {
            while started.elapsed() < length {
                match pair(&http, &base, &token).await? {
                    Pair::Done => {
                        pairs.fetch_add(1, Ordering::Relaxed);
                    }
                    Pair::RateLimited => {
                        limited.fetch_add(1, Ordering::Relaxed);
                        // Well-behaved: it waits as told (the API says 1 s at least).
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Pair::NoMatch => {}
                }
            }
            Ok::<(), Error>(())
        }));
    }
    for c in clients {
        c.await??;
    }
    let rate = pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    if rate == 0.0 {
        return Err("no lease was granted: is the fleet healthy?".into());
    }
    Ok((rate, limited.load(Ordering::Relaxed)))
}

/// A target nobody sent before, exactly [`TARGET_BYTES`] long.
fn distinct_target(client: usize, n: u64, what: &str) -> String {
    let head = format!("{what}-{client:02}-{n:012}.");
    format!("{head}{}", "x".repeat(TARGET_BYTES - head.len()))
}

/// Counts of the abuse.
#[derive(Default)]
struct Abuse {
    requests: AtomicU64,
    limited: AtomicU64,
}

impl Abuse {
    async fn send(&self, req: reqwest::RequestBuilder) -> Option<reqwest::Response> {
        let answer = req.send().await.ok()?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        if answer.status() == 429 {
            self.limited.fetch_add(1, Ordering::Relaxed);
        }
        Some(answer)
    }
}

async fn abuser(i: usize, base: String, token: String, stop: Arc<AtomicBool>, abuse: Arc<Abuse>) {
    let http = client();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let body = serde_json::json!({"target": distinct_target(i, n, "lease"), "ttlSeconds": 3600}).to_string();
        let req = http.post(format!("{base}/v1/leases")).bearer_auth(&token).body(body);
        let Some(answer) = abuse.send(req).await else {
            continue;
        };
        if answer.status() != 201 {
            let _ = answer.bytes().await;
            continue;
        }
        let Ok(grant) = answer.json::<serde_json::Value>().await else {
            continue;
        };
        let id = grant["leaseID"].as_str().unwrap_or_default().to_owned();
        // Report spam: every result, each with a target never seen before.
        for (k, result) in ["banned", "rate_limited", "ok"].into_iter().enumerate() {
            let body = serde_json::json!({"result": result, "target": distinct_target(i, n * 4 + k as u64, "report")});
            let req = http
                .post(format!("{base}/v1/leases/{id}/report"))
                .bearer_auth(&token)
                .body(body.to_string());
            if let Some(a) = abuse.send(req).await {
                let _ = a.bytes().await;
            }
        }
        let req = http.delete(format!("{base}/v1/leases/{id}")).bearer_auth(&token);
        if let Some(a) = abuse.send(req).await {
            let _ = a.bytes().await;
        }
    }
}

/// The abuse for `length`: requests a second, and the 429s among them.
async fn abuse(base: &str, token: &str, length: Duration) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let abuse = Arc::new(Abuse::default());
    let started = Instant::now();
    let abusers: Vec<_> = (0..ABUSERS)
        .map(|i| {
            tokio::spawn(abuser(
                i,
                base.to_owned(),
                token.to_owned(),
                stop.clone(),
                abuse.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let rate = abuse.requests.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    for a in abusers {
        let _ = a.await;
    }
    (rate, abuse.limited.load(Ordering::Relaxed))
}

struct Fixed(Arc<Fleet>);

impl ProxyDirectory for Fixed {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        Ok(self.0.clone())
    }
}

/// Serves the API here over `count` Ready proxies, as the manager's reference fleet shows them.
async fn in_process(count: usize, polite_token: &str, abuse_token: &str) -> (String, CancellationToken) {
    let fleet: Fleet = (0..count)
        .map(|i| ProxyInfo {
            id: format!("bench/p{i:05}"),
            ip: format!("10.1.{}.{}", i / 256, i % 256),
            port: 3128,
            attributes: BTreeMap::new(),
            phase: "Ready".into(),
            healthy: true,
            latency_millis: 7,
            max_leases: 5,
            credentials: None,
            offered: true,
            pool_role: None,
        })
        .collect();
    let clients = BTreeMap::from([
        (
            ClientName::parse("polite").expect("a name"),
            vec![polite_token.to_owned()],
        ),
        (
            ClientName::parse("abuse").expect("a name"),
            vec![abuse_token.to_owned()],
        ),
    ]);
    let api = DiscoveryApi {
        directory: Arc::new(Fixed(Arc::new(fleet))),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: Auth::Tokens(Arc::new(TokenSet::of_clients(&clients))),
        refusals: None,
        admission: egress_discovery::Admission::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        Arc::new(api),
        egress_http::Limits::DEFAULT,
        stop.clone(),
    ));
    (base, stop)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let polite_token = std::env::var("POLITE_TOKEN")?;
    let abuse_token = std::env::var("ABUSE_TOKEN")?;
    let seconds = |s: &str| s.parse().map(Duration::from_secs);
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["serve", count] => {
            match egress_operator::flags::parse(["--zap-log-level=info", "--zap-encoder=json"])? {
                egress_operator::flags::Command::Run(options) => egress_operator::install_logger(&options),
                egress_operator::flags::Command::Help => {}
            }
            let (base, stop) = in_process(count.parse()?, &polite_token, &abuse_token).await;
            println!("{base}");
            // Until whoever started it closes its standard input.
            tokio::task::spawn_blocking(|| std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new()))
                .await??;
            stop.cancel();
        }
        ["polite", url, length] => {
            let (rate, limited) = polite(url, &polite_token, seconds(length)?).await?;
            println!("{}", serde_json::json!({"pairsPerSecond": rate, "limited": limited}));
        }
        ["abuse", url, length] => {
            let (rate, limited) = abuse(url, &abuse_token, seconds(length)?).await;
            println!("{}", serde_json::json!({"requestsPerSecond": rate, "limited": limited}));
        }
        _ => return Err("usage: lease_api_bench (serve COUNT | polite URL SECONDS | abuse URL SECONDS)".into()),
    }
    Ok(())
}
