//! The discovery API's metrics per client name (never per token): requests answered, by status
//! code; requests refused by admission, by reason; requests being served and waiting. Client names come
//! from the token files, so the series are bounded by the clients configured (at most 64).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The families; clones share the series.
#[derive(Clone, Default)]
pub struct AdmissionMetrics {
    requests: Family<Labels, Counter>,
    refusals: Family<Labels, Counter>,
    in_flight: Family<Labels, Gauge>,
    waiting: Family<Labels, Gauge>,
}

impl std::fmt::Debug for AdmissionMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionMetrics").finish_non_exhaustive()
    }
}

fn client(name: &str) -> Labels {
    vec![("client", name.to_owned())]
}

impl AdmissionMetrics {
    /// Registers the four families.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "proxy_operator_discovery_requests",
            "Discovery API requests answered, by client name and status code (client \"\": no valid token).",
            self.requests.clone(),
        );
        registry.register(
            "proxy_operator_discovery_refusals",
            "Discovery API requests refused before they were served, by client name and reason (rate, concurrency, overloaded).",
            self.refusals.clone(),
        );
        registry.register(
            "proxy_operator_discovery_requests_in_flight",
            "Discovery API requests being served, by client name.",
            self.in_flight.clone(),
        );
        registry.register(
            "proxy_operator_discovery_requests_waiting",
            "Discovery API requests waiting for their turn, by client name.",
            self.waiting.clone(),
        );
    }

    /// A request of `name` was answered with `code`.
    pub fn answered(&self, name: &str, code: u16) {
        let mut labels = client(name);
        labels.push(("code", code.to_string()));
        self.requests.get_or_create(&labels).inc();
    }

    /// A request of `name` was refused for `reason` (a `Refusal`'s bounded reason: the metrics
    /// take its label, not the admission's type, so they stay below admission).
    pub(crate) fn refused(&self, name: &str, reason: &str) {
        let mut labels = client(name);
        labels.push(("reason", reason.to_owned()));
        self.refusals.get_or_create(&labels).inc();
    }

    pub(crate) fn started(&self, name: &str) {
        self.in_flight.get_or_create(&client(name)).inc();
    }

    pub(crate) fn finished(&self, name: &str) {
        self.in_flight.get_or_create(&client(name)).dec();
    }

    pub(crate) fn queued(&self, name: &str) {
        self.waiting.get_or_create(&client(name)).inc();
    }

    pub(crate) fn dequeued(&self, name: &str) {
        self.waiting.get_or_create(&client(name)).dec();
    }

    /// Requests of `name` waiting for their turn now.
    pub fn waiting(&self, name: &str) -> i64 {
        self.waiting.get(&client(name)).map_or(0, |g| g.get())
    }

    /// Requests of `name` being served now.
    pub fn in_flight(&self, name: &str) -> i64 {
        self.in_flight.get(&client(name)).map_or(0, |g| g.get())
    }

    /// The count of answers `name` got with `code` (tests and benches read it).
    pub fn answers(&self, name: &str, code: u16) -> u64 {
        let mut labels = client(name);
        labels.push(("code", code.to_string()));
        self.requests.get(&labels).map_or(0, |c| c.get())
    }

    /// The count of refusals of `name` for `reason`.
    pub fn refusals(&self, name: &str, reason: &str) -> u64 {
        let mut labels = client(name);
        labels.push(("reason", reason.to_owned()));
        self.refusals.get(&labels).map_or(0, |c| c.get())
    }
}
