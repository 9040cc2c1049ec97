//! Shared by the discovery API's tests: proxies, a fixed and a changing directory, and the
//! server on loopback.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use egress_discovery::{DiscoveryApi, Fleet, ProxyDirectory, ProxyInfo, serve};
use tokio_util::sync::{CancellationToken, DropGuard};

/// A proxy of the fleet (Ready when healthy, at 10.0.0.1:3128).
pub fn info(id: &str, healthy: bool, latency: i64, max: i32, attrs: &[(&str, &str)]) -> ProxyInfo {
    ProxyInfo {
        id: id.into(),
        ip: "10.0.0.1".into(),
        port: 3128,
        attributes: attrs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect::<BTreeMap<_, _>>(),
        phase: if healthy { "Ready" } else { "Unhealthy" }.into(),
        healthy,
        latency_millis: latency,
        max_leases: max,
        credentials: None,
        offered: true,
        pool_role: None,
        pool: None,
        exit: None,
    }
}

/// A snapshot of `proxies`.
pub fn snapshot(proxies: Vec<ProxyInfo>) -> Arc<Fleet> {
    Arc::new(proxies.into_iter().collect())
}

/// A directory that never changes.
pub struct Fixed(pub Arc<Fleet>);

impl Fixed {
    pub fn new(proxies: Vec<ProxyInfo>) -> Self {
        Self(snapshot(proxies))
    }
}

impl ProxyDirectory for Fixed {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        Ok(self.0.clone())
    }
}

/// A directory the test changes, or breaks.
#[derive(Default)]
pub struct Changing {
    pub proxies: Mutex<Vec<ProxyInfo>>,
    pub broken: Mutex<bool>,
}

impl Changing {
    pub fn set(&self, proxies: Vec<ProxyInfo>) {
        *self.proxies.lock().unwrap() = proxies;
    }
}

impl ProxyDirectory for Changing {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        if *self.broken.lock().unwrap() {
            return Err("the cache is gone".into());
        }
        Ok(snapshot(self.proxies.lock().unwrap().clone()))
    }
}

/// Serves `api` on a free loopback port until the guard is dropped; returns its base URL.
pub async fn serve_on_loopback(api: DiscoveryApi) -> (String, DropGuard) {
    serve_on_loopback_within(api, egress_http::Limits::DEFAULT).await
}

/// [`serve_on_loopback`] with the server's budgets given.
pub async fn serve_on_loopback_within(api: DiscoveryApi, limits: egress_http::Limits) -> (String, DropGuard) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(serve(listener, Arc::new(api), limits, stop.clone()));
    (url, stop.drop_guard())
}

/// Admission with room for every caller at once: for tests of the store, whose many callers
/// (all the client `default` without auth) must not wait their turn.
pub fn roomy_admission() -> egress_discovery::Admission {
    let budget = egress_discovery::Budget {
        requests_per_second: 1_000_000,
        burst: 1_000_000,
        concurrency: 1024,
    };
    egress_discovery::Admission::new(
        egress_discovery::Budgets::uniform(budget),
        1024,
        egress_discovery::AdmissionMetrics::default(),
    )
}
