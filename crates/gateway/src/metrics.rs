//! The gateway's metrics, per client name (never per token) and per proxy. Every label is
//! bounded: client names are those the discovery API knows (and past [`MAX_NAMES`] distinct ones,
//! `other`); proxy ids likewise past [`MAX_NAMES`]; fronts, outcomes and directions are fixed
//! lists.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Distinct client names, and distinct proxy ids, given series of their own; later ones are
/// counted as `other`.
pub const MAX_NAMES: usize = 1000;

type Labels = Vec<(&'static str, String)>;

/// Which front a client came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// An HTTP `CONNECT` tunnel.
    Connect,
    /// A SOCKS5 `CONNECT`.
    Socks,
    /// A plain-HTTP forward request.
    Http,
}

impl Front {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Socks => "socks",
            Self::Http => "http",
        }
    }
}

/// The families, registered once and shared by both fronts.
#[derive(Debug)]
pub struct Metrics {
    tunnels: Family<Labels, Counter>,
    bytes: Family<Labels, Counter>,
    active: Gauge,
    establish: Histogram,
    proxy_tunnels: Family<Labels, Counter>,
    proxy_bytes: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    renewals: Family<Labels, Counter>,
    clients: Bounded,
    proxies: Bounded,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            tunnels: Family::default(),
            bytes: Family::default(),
            active: Gauge::default(),
            // 1 ms to about 16 s.
            establish: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            proxy_tunnels: Family::default(),
            proxy_bytes: Family::default(),
            refused: Family::default(),
            renewals: Family::default(),
            clients: Bounded::default(),
            proxies: Bounded::default(),
        }
    }
}

impl Metrics {
    /// Registers the families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "proxy_gateway_tunnels",
            "Tunnels and plain-HTTP requests, by client name, front (connect, socks, http) and outcome.",
            self.tunnels.clone(),
        );
        registry.register(
            "proxy_gateway_bytes",
            "Bytes carried, by client name and direction (up: from the client, down: towards it).",
            self.bytes.clone(),
        );
        registry.register(
            "proxy_gateway_tunnels_active",
            "Tunnels and plain-HTTP requests being carried.",
            self.active.clone(),
        );
        registry.register(
            "proxy_gateway_establish_seconds",
            "Time from a client's request to its tunnel through a backend: lease and backend CONNECT.",
            self.establish.clone(),
        );
        registry.register(
            "proxy_gateway_proxy_tunnels",
            "Tunnels and plain-HTTP requests carried, by backend proxy (namespace/name).",
            self.proxy_tunnels.clone(),
        );
        registry.register(
            "proxy_gateway_proxy_bytes",
            "Bytes carried both ways, by backend proxy (namespace/name).",
            self.proxy_bytes.clone(),
        );
        registry.register(
            "proxy_gateway_lease_renewals",
            "Renewals of a tunnel's lease (a session's, or the tunnel's own) while it was open, by outcome (renewed, refused, api_error).",
            self.renewals.clone(),
        );
        registry.register(
            "proxy_gateway_connections_refused",
            "Client connections refused before any lease, by reason (connection_cap: the gateway is full; credentials: missing, or a username outside the grammar; head: an HTTP request head too large, malformed or too slow; handshake: a SOCKS5 handshake that is not SOCKS5, or not finished in time; tls: a TLS handshake on the TLS front that failed or was too slow).",
            self.refused.clone(),
        );
    }

    /// A tunnel's lease renewed while it was open (`renewed`), or not (`refused`: it ended, or
    /// its proxy may no longer be leased; `api_error`).
    pub fn renewal(&self, outcome: &'static str) {
        self.renewals
            .get_or_create(&vec![("outcome", outcome.to_owned())])
            .inc();
    }

    /// One tunnel or request of `client` by `front` ended with `outcome`.
    pub fn ended(&self, client: &str, front: Front, outcome: &str) {
        let labels = vec![
            ("client", self.clients.label(client)),
            ("front", front.as_str().to_owned()),
            ("outcome", outcome.to_owned()),
        ];
        self.tunnels.get_or_create(&labels).inc();
    }

    /// What one tunnel or request carried through `proxy` for `client`.
    pub fn carried(&self, client: &str, proxy: &str, up: u64, down: u64) {
        let client = self.clients.label(client);
        for (direction, n) in [("up", up), ("down", down)] {
            let labels = vec![("client", client.clone()), ("direction", direction.to_owned())];
            self.bytes.get_or_create(&labels).inc_by(n);
        }
        let proxy = vec![("proxy", self.proxies.label(proxy))];
        self.proxy_tunnels.get_or_create(&proxy).inc();
        self.proxy_bytes.get_or_create(&proxy).inc_by(up.saturating_add(down));
    }

    /// A tunnel established after `took`.
    pub fn established(&self, took: Duration) {
        self.establish.observe(took.as_secs_f64());
    }

    /// A connection refused before any lease, for `reason`.
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&vec![("reason", reason.to_owned())]).inc();
    }

    /// One more tunnel carried until the guard is dropped.
    pub fn active(&self) -> ActiveGuard {
        self.active.inc();
        ActiveGuard(self.active.clone())
    }
}

/// Counts a tunnel as active while it lives.
#[derive(Debug)]
pub struct ActiveGuard(Gauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The names given series of their own, at most [`MAX_NAMES`].
#[derive(Debug, Default)]
struct Bounded(Mutex<HashSet<String>>);

impl Bounded {
    fn label(&self, name: &str) -> String {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(name) {
            return name.to_owned();
        }
        if seen.len() < MAX_NAMES {
            seen.insert(name.to_owned());
            return name.to_owned();
        }
        "other".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_the_bound_share_one_series() {
        let b = Bounded::default();
        for i in 0..MAX_NAMES {
            assert_eq!(b.label(&format!("c{i}")), format!("c{i}"));
        }
        assert_eq!(b.label("one-too-many"), "other");
        assert_eq!(b.label("c7"), "c7", "a name already seen keeps its series");
    }

    #[test]
    fn what_is_carried_is_counted_by_client_and_proxy() {
        let m = Metrics::default();
        m.carried("team-a", "ns/p1", 10, 32);
        m.carried("team-a", "ns/p1", 1, 1);
        m.ended("team-a", Front::Socks, "closed");
        {
            let _one = m.active();
            assert_eq!(m.active.get(), 1);
        }
        assert_eq!(m.active.get(), 0);
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "proxy_gateway_bytes_total{client=\"team-a\",direction=\"up\"} 11",
            "proxy_gateway_bytes_total{client=\"team-a\",direction=\"down\"} 33",
            "proxy_gateway_proxy_bytes_total{proxy=\"ns/p1\"} 44",
            "proxy_gateway_proxy_tunnels_total{proxy=\"ns/p1\"} 2",
            "proxy_gateway_tunnels_total{client=\"team-a\",front=\"socks\",outcome=\"closed\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
