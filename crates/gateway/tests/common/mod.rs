//! Shared by the gateway's tests: the gateway with both fronts, the discovery API behind it (in
//! this process, on a memory store, one token), the real tinyproxy it leases (asking for its own
//! credentials) and a local target, all on loopback.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use egress_discovery::client::Client;
use egress_discovery::{DiscoveryApi, Fleet, ProxyDirectory, ProxyInfo};
use egress_gateway::leases::Leases;
use egress_gateway::{Gateway, Settings, http_front, socks_front};
use egress_lease::{MemoryStore, SystemClock};
use egress_testkit::{Seen, Tinyproxy, http_target};
use tokio_util::sync::{CancellationToken, DropGuard};

pub const TOKEN: &str = "tok-gateway-test";
pub const BACKEND_PASSWORD: &str = "backend-secret-sentinel";

struct Fixed(Arc<Fleet>);

impl ProxyDirectory for Fixed {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        Ok(self.0.clone())
    }
}

/// The gateway, the API behind it, the tinyproxy it leases and the target, all on loopback.
pub struct World {
    pub gateway: SocketAddr,
    pub socks: SocketAddr,
    pub target: SocketAddr,
    pub seen: Seen,
    pub api: String,
    _proxy: Tinyproxy,
    _stop: DropGuard,
}

pub async fn world() -> World {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (target, seen) = http_target().await;
    let proxy = Tinyproxy::start_with(&[target.port()], Some(("gw-backend", BACKEND_PASSWORD)));
    let info = ProxyInfo {
        id: "ns/eu-1".into(),
        ip: "127.0.0.1".into(),
        port: proxy.port,
        attributes: [("geo".to_owned(), "eu".to_owned())].into(),
        phase: "Ready".into(),
        healthy: true,
        latency_millis: 1,
        max_leases: 5,
        credentials: Some(egress_credentials::Credentials::new("gw-backend", BACKEND_PASSWORD).unwrap()),
        offered: true,
        pool_role: None,
        pool: None,
    };
    let api = DiscoveryApi {
        directory: Arc::new(Fixed(Arc::new(std::iter::once(info).collect()))),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::Tokens(Arc::new(egress_discovery::TokenSet::new(vec![TOKEN.into()]))),
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(egress_discovery::serve(
        listener,
        Arc::new(api),
        egress_http::Limits::DEFAULT,
        stop.clone(),
    ));
    let leases = Leases::new(Client::new(&api_url, None).unwrap());
    let gateway = Arc::new(Gateway::new(leases, Settings::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let serving = tokio::spawn(http_front::serve(listener, gateway.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socks = listener.local_addr().unwrap();
    let serving_socks = tokio::spawn(socks_front::serve(listener, gateway));
    let stop_all = CancellationToken::new();
    let stopped = stop_all.clone();
    tokio::spawn(async move {
        stopped.cancelled().await;
        serving.abort();
        serving_socks.abort();
        stop.cancel();
    });
    World {
        gateway: at,
        socks,
        target,
        seen,
        api: api_url,
        _proxy: proxy,
        _stop: stop_all.drop_guard(),
    }
}

/// The active leases the API shows on the proxy.
pub async fn active(w: &World) -> u64 {
    let api = Client::new(&w.api, Some(TOKEN.into())).unwrap();
    let all = api.list(&Default::default()).await.unwrap();
    all[0].active_leases
}

/// Waits until the proxy's leases are all given back, within a deadline: the gateway gives a
/// lease back as its connection ends, after curl has its answer.
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
