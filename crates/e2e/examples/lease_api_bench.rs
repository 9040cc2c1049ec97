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

/// One keep-alive HTTP/1.1 connection to the API, as lean as a client can be: the load shares
/// a core with the rest of the simulated cluster, so what it spends there is taken from the
/// rate it can ask for. (reqwest cost the polite side about 90 % of that core, hyper's own
/// connection about 55 %.) Answers other than 204 must carry `Content-Length`, as the API's do.
struct Conn {
    tcp: tokio::net::TcpStream,
    token: String,
    /// What was read and not yet used.
    buffer: Vec<u8>,
}

/// The longest answer head it reads.
const HEAD_LIMIT: usize = 16 * 1024;

impl Conn {
    async fn open(base: &str, token: &str) -> Result<Self, Error> {
        let address = base.strip_prefix("http://").ok_or("the URL is not http://")?;
        let tcp = tokio::net::TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        Ok(Self {
            tcp,
            token: token.to_owned(),
            buffer: Vec::with_capacity(4096),
        })
    }

    /// Sends one request; its status and body.
    async fn call(&mut self, method: &str, path: &str, body: &str) -> Result<(u16, Vec<u8>), Error> {
        use tokio::io::AsyncWriteExt as _;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n{body}",
            self.token,
            body.len()
        );
        self.tcp.write_all(request.as_bytes()).await?;
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut answer = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head) = answer.parse(&self.buffer)? {
                let status = answer.code.ok_or("no status")?;
                let length: usize = match answer
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                {
                    Some(h) => std::str::from_utf8(h.value)?.parse()?,
                    None if status == 204 => 0,
                    None => return Err("an answer without Content-Length".into()),
                };
                while self.buffer.len() < head + length {
                    self.read_more().await?;
                }
                let body = self.buffer[head..head + length].to_vec();
                self.buffer.drain(..head + length);
                return Ok((status, body));
            }
            if self.buffer.len() > HEAD_LIMIT {
                return Err("an answer head over 16 KiB".into());
            }
            self.read_more().await?;
        }
    }

    async fn read_more(&mut self) -> Result<(), Error> {
        use tokio::io::AsyncReadExt as _;
        if self.tcp.read_buf(&mut self.buffer).await? == 0 {
            return Err("the server closed the connection".into());
        }
        Ok(())
    }
}

/// What one acquire+release gave.
enum Pair {
    Done,
    /// No proxy was free.
    NoMatch,
    /// The client was over its budget.
    RateLimited,
}

#[derive(serde::Deserialize)]
struct Grant<'a> {
    #[serde(rename = "leaseID", borrow)]
    lease_id: std::borrow::Cow<'a, str>,
}

async fn pair(conn: &mut Conn) -> Result<Pair, Error> {
    let (status, body) = conn.call("POST", "/v1/leases", r#"{"target": "example.com"}"#).await?;
    match status {
        201 => {}
        429 => return Ok(Pair::RateLimited),
        409 => return Ok(Pair::NoMatch),
        other => return Err(format!("acquire answered {other}: {}", String::from_utf8_lossy(&body)).into()),
    }
    let grant: Grant<'_> = serde_json::from_slice(&body)?;
    let (status, _) = conn
        .call("DELETE", &format!("/v1/leases/{}", grant.lease_id), "")
        .await?;
    Ok(if status == 429 { Pair::RateLimited } else { Pair::Done })
}

/// The polite client's pairs per second over `length`, and the 429s it got.
async fn polite(base: &str, token: &str, length: Duration) -> Result<(f64, u64), Error> {
    let pairs = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..POLITE {
        clients.push(Conn::open(base, token).await?);
    }
    let started = Instant::now();
    let clients: Vec<_> = clients
        .into_iter()
        .map(|mut conn| {
            let (pairs, limited) = (pairs.clone(), limited.clone());
            tokio::spawn(async move {
                while started.elapsed() < length {
                    match pair(&mut conn).await? {
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
            })
        })
        .collect();
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
    /// One abusive request; its status and body, or `None` when the connection failed.
    async fn send(&self, conn: &mut Conn, method: &str, path: &str, body: &str) -> Option<(u16, Vec<u8>)> {
        let (status, body) = conn.call(method, path, body).await.ok()?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        if status == 429 {
            self.limited.fetch_add(1, Ordering::Relaxed);
        }
        Some((status, body))
    }
}

async fn abuser(i: usize, base: String, token: String, stop: Arc<AtomicBool>, abuse: Arc<Abuse>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // A connection the server closed (after a refused body, say) is opened again.
        let Ok(mut conn) = Conn::open(&base, &token).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let body = serde_json::json!({"target": distinct_target(i, n, "lease"), "ttlSeconds": 3600}).to_string();
            let Some((status, grant)) = abuse.send(&mut conn, "POST", "/v1/leases", &body).await else {
                break;
            };
            if status != 201 {
                continue;
            }
            let Ok(grant) = serde_json::from_slice::<Grant<'_>>(&grant) else {
                continue;
            };
            // Report spam: every result, each with a target never seen before.
            let report = format!("/v1/leases/{}/report", grant.lease_id);
            for (k, result) in ["banned", "rate_limited", "ok"].into_iter().enumerate() {
                let body =
                    serde_json::json!({"result": result, "target": distinct_target(i, n * 4 + k as u64, "report")});
                abuse.send(&mut conn, "POST", &report, &body.to_string()).await;
            }
            let release = format!("/v1/leases/{}", grant.lease_id);
            abuse.send(&mut conn, "DELETE", &release, "").await;
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
            pool: None,
            exit: None,
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
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
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
            match egress_manager::flags::parse(["--zap-log-level=info", "--zap-encoder=json"])? {
                egress_manager::flags::Command::Run(options) => {
                    egress_runtime::logging::install(&options.log, None, egress_manager::PROGRAM.span_keys);
                }
                egress_manager::flags::Command::Help => {}
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
