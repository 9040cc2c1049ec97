//! What the bench runs against, all on loopback: the discovery API in this process on a memory
//! store (one token), real tinyproxies asking for Basic credentials, an HTTPS target, a target
//! that streams bytes as fast as it can, a CONNECT backend for the idle tunnels, and
//! `egress-gateway` as a process of its own (so its resident memory is its own).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_discovery::{DiscoveryApi, Fleet, ProxyDirectory, ProxyInfo};
use egress_lease::{MemoryStore, SystemClock};
use egress_testkit::Tinyproxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::wire::{IO_TIMEOUT, basic};

/// The discovery token of the bench's one client: the gateway's clients' password.
pub(crate) const TOKEN: &str = "tok-gateway-bench";
/// What the tinyproxies (and the idle backend) ask of their clients.
pub(crate) const BACKEND_USER: &str = "bench-backend";
pub(crate) const BACKEND_PASSWORD: &str = "bench-backend-secret";
/// Leases a backend may hold at once, as far as the API is concerned: above anything the bench
/// asks, so the API never refuses for capacity (tinyproxy's own MaxClients still holds).
const MAX_LEASES: i32 = 100_000;
/// How long the streaming target streams on one connection, at most.
const STREAM_BUDGET: Duration = Duration::from_secs(120);
/// How long the idle backend holds a tunnel nobody closes, at most.
const IDLE_HOLD: Duration = Duration::from_secs(300);

/// The proxies the API lists; the bench swaps them between phases.
#[derive(Debug, Default)]
struct Directory(Mutex<Vec<ProxyInfo>>);

impl ProxyDirectory for Directory {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        let listed = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(Arc::new(listed.iter().cloned().collect()))
    }
}

/// Everything the phases use.
pub(crate) struct World {
    pub(crate) api: String,
    directory: Arc<Directory>,
    pub(crate) tinyproxies: Vec<Tinyproxy>,
    tinyproxy_infos: Vec<ProxyInfo>,
    pub(crate) https: SocketAddr,
    pub(crate) stream: SocketAddr,
    pub(crate) idle: IdleBackend,
    pub(crate) gateway: GatewayProcess,
    pub(crate) tls: TlsConnector,
    _stop: DropGuard,
}

impl World {
    /// Starts it all: `proxies` tinyproxies, the gateway from `bin` logging to `log`.
    pub(crate) async fn start(proxies: usize, bin: &Path, log: &Path) -> Self {
        let pki = egress_testkit::pki();
        let (https, _) = egress_testkit::tls_target(&pki).await;
        let stream = stream_target().await;
        let ports = [https.port(), stream.port()];
        let tinyproxies: Vec<Tinyproxy> = (0..proxies)
            .map(|_| Tinyproxy::start_with(&ports, Some((BACKEND_USER, BACKEND_PASSWORD))))
            .collect();
        let tinyproxy_infos = tinyproxies
            .iter()
            .enumerate()
            .map(|(k, t)| backend_info(&format!("tinyproxy-{k}"), t.port))
            .collect();
        let directory = Arc::new(Directory::default());
        let stop = CancellationToken::new();
        let api = serve_api(directory.clone(), stop.clone()).await;
        let idle = IdleBackend::start().await;
        let gateway = GatewayProcess::start(bin, &api, log).await;
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(pki.roots())
            .with_no_client_auth();
        let world = Self {
            api,
            directory,
            tinyproxies,
            tinyproxy_infos,
            https,
            stream,
            idle,
            gateway,
            tls: TlsConnector::from(Arc::new(config)),
            _stop: stop.drop_guard(),
        };
        world.lease_tinyproxies();
        world
    }

    /// The API lists the tinyproxies only.
    pub(crate) fn lease_tinyproxies(&self) {
        self.list(self.tinyproxy_infos.clone());
    }

    /// The API lists the idle backend only.
    pub(crate) fn lease_idle_backend(&self) {
        self.list(vec![backend_info("idle", self.idle.addr.port())]);
    }

    fn list(&self, proxies: Vec<ProxyInfo>) {
        *self
            .directory
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = proxies;
    }

    /// What a client sends the gateway as `user`: the token is the password.
    pub(crate) fn gateway_auth(user: &str) -> String {
        basic(user, TOKEN)
    }

    /// What a client sends a tinyproxy (or the idle backend) directly.
    pub(crate) fn backend_auth() -> String {
        basic(BACKEND_USER, BACKEND_PASSWORD)
    }

    /// Tinyproxy `k`'s address.
    pub(crate) fn tinyproxy(&self, k: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.tinyproxies[k].port))
    }
}

/// A healthy backend `name` on loopback `port`, with the backends' credentials and the
/// attribute `backend=<name>` (so a username can name it).
fn backend_info(name: &str, port: u16) -> ProxyInfo {
    ProxyInfo {
        id: format!("bench/{name}"),
        ip: "127.0.0.1".into(),
        port,
        attributes: [("backend".to_owned(), name.to_owned())].into(),
        phase: "Ready".into(),
        healthy: true,
        latency_millis: 1,
        max_leases: MAX_LEASES,
        credentials: Some(egress_credentials::Credentials::new(BACKEND_USER, BACKEND_PASSWORD).expect("credentials")),
        offered: true,
        pool_role: None,
        pool: None,
        exit: None,
    }
}

/// The discovery API over `directory` on a memory store, taking [`TOKEN`], as the gateway's
/// tests serve it; its URL.
async fn serve_api(directory: Arc<Directory>, stop: CancellationToken) -> String {
    let api = DiscoveryApi {
        directory,
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::Tokens(Arc::new(egress_discovery::TokenSet::new(vec![TOKEN.into()]))),
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port for the API");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(egress_discovery::serve(
        listener,
        Arc::new(api),
        egress_http::Limits::DEFAULT,
        stop,
    ));
    url
}

/// A target that sends bytes on each connection as fast as it can until the connection closes
/// (or [`STREAM_BUDGET`] passes): the far end of the long tunnel.
async fn stream_target() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the stream target");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let chunk = vec![0x5a_u8; 64 * 1024];
                let until = Instant::now() + STREAM_BUDGET;
                while Instant::now() < until {
                    match tokio::time::timeout(IO_TIMEOUT, tcp.write_all(&chunk)).await {
                        Ok(Ok(())) => {}
                        _ => break,
                    }
                }
            });
        }
    });
    addr
}

/// A bench-only CONNECT backend for the idle tunnels: it checks the backends' credentials,
/// answers 200 and holds the tunnel open without dialling the destination, for as many
/// tunnels as come (tinyproxy's test config takes 50 clients per process). It counts the
/// tunnels it holds.
#[derive(Debug)]
pub(crate) struct IdleBackend {
    pub(crate) addr: SocketAddr,
    open: Arc<AtomicUsize>,
}

impl IdleBackend {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for the idle backend");
        let addr = listener.local_addr().expect("its address");
        let open = Arc::new(AtomicUsize::new(0));
        let counted = open.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(hold(tcp, counted.clone()));
            }
        });
        Self { addr, open }
    }

    /// The tunnels it holds now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

/// Reads a CONNECT head; with the backends' credentials, answers 200 and holds the connection
/// until the other side closes it (or [`IDLE_HOLD`]); otherwise 407.
async fn hold(mut tcp: TcpStream, open: Arc<AtomicUsize>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match tokio::time::timeout(IO_TIMEOUT, tcp.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    let expected = World::backend_auth();
    let authorized = String::from_utf8_lossy(&head).lines().any(|l| {
        l.split_once(':')
            .is_some_and(|(k, v)| k.eq_ignore_ascii_case("proxy-authorization") && v.trim() == expected)
    });
    if !authorized {
        let _ = tcp
            .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
            .await;
        return;
    }
    if tcp
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    open.fetch_add(1, Ordering::Relaxed);
    // Idle: nothing is expected; whatever comes is dropped, until the close.
    let _ = tokio::time::timeout(IDLE_HOLD, async {
        while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
    open.fetch_sub(1, Ordering::Relaxed);
}

/// `egress-gateway` as a child process: its HTTP front's address; killed on drop.
#[derive(Debug)]
pub(crate) struct GatewayProcess {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl GatewayProcess {
    /// Starts `bin` leasing from `api`, its log in `log`; returns once its front accepts.
    async fn start(bin: &Path, api: &str, log: &Path) -> Self {
        let port = egress_testkit::try_free_port().expect("a port for the gateway");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log_file = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = Command::new(bin)
            .arg(format!("--discovery-url={api}"))
            .arg(format!("--listen={addr}"))
            .args(["--socks-listen=0", "--health-probe-bind-address=0"])
            // The idle phase holds 1 000 tunnels of one client, beyond the per-client default
            // of 1 024 with the warm-up's; room for both.
            .args(["--max-connections=8192", "--max-connections-per-client=4096"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut gateway = Self { child, addr };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).await.is_err() {
            if let Ok(Some(status)) = gateway.child.try_wait() {
                panic!("the gateway exited at start ({status}); see {}", log.display());
            }
            assert!(
                Instant::now() < deadline,
                "the gateway did not listen on {addr} within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        gateway
    }

    /// Its resident memory (`VmRSS` of /proc/<pid>/status), in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .expect("the gateway's VmRSS")
    }

    /// The CPU time it has used, user and system, in seconds (`utime` and `stime` of
    /// /proc/<pid>/stat, in Linux's USER_HZ of 100 a second on every architecture it exports).
    pub(crate) fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // The fields after the command's closing parenthesis, from the state (field 3) on.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, r)| r)
            .split_whitespace()
            .collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .expect("the gateway's CPU time")
        };
        (ticks(11) + ticks(12)) as f64 / 100.0
    }

    /// Whether it still runs.
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bench's arguments: `--gateway PATH` (the binary), `--log PATH` (its log).
pub(crate) fn args() -> (PathBuf, PathBuf) {
    let mut gateway = None;
    let mut log = std::env::temp_dir().join("gateway-bench.log");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--gateway" => gateway = args.next().map(PathBuf::from),
            "--log" => log = args.next().map_or(log, PathBuf::from),
            other => panic!("unknown argument {other:?} (takes --gateway PATH and --log PATH)"),
        }
    }
    (gateway.expect("--gateway PATH: the egress-gateway binary"), log)
}
