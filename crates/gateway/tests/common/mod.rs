//! Shared by the gateway's tests: the gateway with both fronts, the discovery API behind it (in
//! this process, on a memory store, one token), real tinyproxies it leases (each asking for its
//! own credentials and leaving from its own loopback address) and local targets, all on
//! loopback.
#![allow(dead_code, unreachable_pub)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_discovery::client::Client;
use egress_discovery::{DiscoveryApi, Fleet, ProxyDirectory, ProxyInfo};
use egress_gateway::leases::Leases;
use egress_gateway::{Gateway, Settings, http_front, socks_front};
use egress_lease::{MemoryStore, SystemClock};
use egress_testkit::{Seen, Tinyproxy, http_target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::{CancellationToken, DropGuard};

pub const TOKEN: &str = "tok-gateway-test";
pub const BACKEND_PASSWORD: &str = "backend-secret-sentinel";

/// The proxies the API lists; a test may take one away.
#[derive(Default)]
pub struct Directory(Mutex<Vec<ProxyInfo>>);

impl Directory {
    pub fn of(proxies: Vec<ProxyInfo>) -> Arc<Self> {
        Arc::new(Self(Mutex::new(proxies)))
    }
}

impl ProxyDirectory for Directory {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        Ok(Arc::new(self.0.lock().unwrap().iter().cloned().collect()))
    }
}

/// The gateway, the API behind it, the tinyproxies it leases and the targets, all on loopback.
pub struct World {
    pub gateway: SocketAddr,
    pub socks: SocketAddr,
    /// Answers with the status its path ends with, and records what it was sent.
    pub target: SocketAddr,
    pub seen: Seen,
    /// Answers every request with the address the connection came from: the proxy's exit.
    pub exits: SocketAddr,
    /// An HTTPS target answering as `target` does, its CA in `ca`.
    pub tls_target: SocketAddr,
    pub ca: std::path::PathBuf,
    pub api: String,
    pub directory: Arc<Directory>,
    pub handle: Arc<Gateway>,
    proxies: Vec<Tinyproxy>,
    _scratch: egress_testkit::ScratchDir,
    stop: CancellationToken,
    _stop: DropGuard,
}

/// The address proxy `i` (from 0) leaves from.
pub fn exit_of(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 77, 0, 10 + u8::try_from(i).unwrap())
}

/// One proxy and the default settings.
pub async fn world() -> World {
    world_with(1, Settings::default()).await
}

/// `proxies` tinyproxies (`ns/eu-1`, `ns/eu-2`, ..., all `geo=eu`, the first the fastest) and a
/// gateway with `settings`.
pub async fn world_with(proxies: usize, settings: Settings) -> World {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (target, seen) = http_target().await;
    let exits = exit_target().await;
    let pki = egress_testkit::pki();
    let (tls_target, _) = egress_testkit::tls_target(&pki).await;
    let scratch = egress_testkit::ScratchDir::new("gateway-world");
    let ca = scratch.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let mut started = Vec::new();
    let mut infos = Vec::new();
    for i in 0..proxies {
        let ports = [target.port(), exits.port(), tls_target.port()];
        let proxy = Tinyproxy::start_leaving_from(&ports, Some(("gw-backend", BACKEND_PASSWORD)), Some(exit_of(i)));
        infos.push(info(i, proxy.port));
        started.push(proxy);
    }
    let directory = Directory::of(infos);
    let stop = CancellationToken::new();
    let api = serve_api(directory.clone(), stop.clone()).await;
    let handle = Arc::new(Gateway::new(leases(&api), settings));
    let (gateway, socks) = serve_gateway(handle.clone(), &stop).await;
    World {
        gateway,
        socks,
        target,
        seen,
        exits,
        tls_target,
        ca,
        _scratch: scratch,
        api,
        directory,
        handle,
        proxies: started,
        stop: stop.clone(),
        _stop: stop.drop_guard(),
    }
}

fn info(i: usize, port: u16) -> ProxyInfo {
    let mut info = backend(
        &format!("ns/eu-{}", i + 1),
        "127.0.0.1",
        port,
        "gw-backend",
        BACKEND_PASSWORD,
    );
    info.latency_millis = i64::try_from(i).unwrap() + 1;
    info
}

/// A healthy, offered backend `id` at `ip:port` asking for `user` and `password`, `geo=eu`.
pub fn backend(id: &str, ip: &str, port: u16, user: &str, password: &str) -> ProxyInfo {
    ProxyInfo {
        id: id.into(),
        ip: ip.into(),
        port,
        attributes: [("geo".to_owned(), "eu".to_owned())].into(),
        phase: "Ready".into(),
        healthy: true,
        latency_millis: 1,
        max_leases: 5,
        credentials: Some(egress_credentials::Credentials::new(user, password).unwrap()),
        offered: true,
        pool_role: None,
        pool: None,
        exit: None,
    }
}

/// The discovery API over `directory`, on a memory store, taking [`TOKEN`].
pub async fn serve_api(directory: Arc<Directory>, stop: CancellationToken) -> String {
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(egress_discovery::serve(
        listener,
        Arc::new(api),
        egress_http::Limits::DEFAULT,
        stop,
    ));
    url
}

pub fn leases(api: &str) -> Leases {
    Leases::new(Client::new(api, None).unwrap())
}

/// Both fronts of `gateway` on loopback until `stop`: the HTTP one's address, the SOCKS5 one's.
pub async fn serve_gateway(gateway: Arc<Gateway>, stop: &CancellationToken) -> (SocketAddr, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    let serving = tokio::spawn(http_front::serve(listener, gateway.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socks = listener.local_addr().unwrap();
    let serving_socks = tokio::spawn(socks_front::serve(listener, gateway));
    let stopped = stop.clone();
    tokio::spawn(async move {
        stopped.cancelled().await;
        serving.abort();
        serving_socks.abort();
    });
    (http, socks)
}

impl World {
    /// Another gateway replica on the same API (and so the same lease store): its HTTP front.
    pub async fn another_gateway(&self) -> SocketAddr {
        let replica = Arc::new(Gateway::new(leases(&self.api), Settings::default()));
        serve_gateway(replica, &self.stop).await.0
    }

    /// Adds `proxy` to the API's list.
    pub fn add_proxy(&self, proxy: ProxyInfo) {
        self.directory.0.lock().unwrap().push(proxy);
    }

    /// Takes the proxy `id` out of the API's list, as when it is deleted.
    pub fn remove_proxy(&self, id: &str) {
        self.directory.0.lock().unwrap().retain(|p| p.id != id);
    }

    /// The exits target's URL.
    pub fn exits_url(&self) -> String {
        format!("http://{}/", self.exits)
    }
}

/// A target that answers every request with the address its connection came from.
async fn exit_target() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, peer)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let ip = peer.ip().to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{ip}",
                    ip.len()
                );
                let _ = tcp.write_all(answer.as_bytes()).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    addr
}

/// The active leases the API shows on each proxy, in its order.
pub async fn active_each(w: &World) -> Vec<u64> {
    let api = Client::new(&w.api, Some(TOKEN.into())).unwrap();
    let all = api.list(&Default::default()).await.unwrap();
    all.iter().map(|p| p.active_leases).collect()
}

/// The active leases on the first proxy.
pub async fn active(w: &World) -> u64 {
    active_each(w).await[0]
}

/// Waits until the first proxy's leases are all given back, within a deadline: the gateway
/// gives a lease back as its connection ends, after curl has its answer.
pub async fn until_released(w: &World) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = active(w).await;
        if n == 0 || tokio::time::Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What curl got for `url` through the HTTP front at `gateway` as `user` (`None`: no proxy
/// credentials; over `CONNECT` when `tunnel`): its status code, and the body.
pub async fn curl_through(gateway: SocketAddr, user: Option<&str>, tunnel: bool, url: &str) -> (String, String) {
    curl_with(gateway, user, tunnel, url, &[]).await
}

/// [`curl_through`] with more of curl's arguments (`--cacert <file>`).
pub async fn curl_with(
    gateway: SocketAddr,
    user: Option<&str>,
    tunnel: bool,
    url: &str,
    more: &[&str],
) -> (String, String) {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "20", "-w", "\n%{http_code}/%{http_connect}"])
        .args(more)
        .arg("-x")
        .arg(format!("http://{gateway}"));
    if let Some(user) = user {
        cmd.arg("--proxy-user").arg(user);
    }
    if tunnel {
        cmd.arg("--proxytunnel");
    }
    let out = cmd.arg(url).output().await.expect("curl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, codes) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    // A CONNECT the gateway refused leaves no answer from the target: its code is the CONNECT's.
    let code = match codes.split_once('/') {
        Some(("000", connect)) => connect,
        Some((code, _)) => code,
        None => codes,
    };
    (code.to_owned(), body.to_owned())
}

/// `Basic` credentials for `user` and `password`.
pub fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        data_encoding::BASE64.encode(format!("{user}:{password}").as_bytes())
    )
}

/// A `CONNECT` to `authority` through the HTTP front at `gateway` as `user` with [`TOKEN`]:
/// the connection, and the gateway's answer head.
pub async fn open_tunnel(gateway: SocketAddr, user: &str, authority: &str) -> (tokio::net::TcpStream, String) {
    let mut tcp = tokio::net::TcpStream::connect(gateway).await.unwrap();
    let request = format!(
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: {}\r\n\r\n",
        basic(user, TOKEN)
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tcp.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    (tcp, String::from_utf8_lossy(&head).into_owned())
}
