//! The per-probe metrics (fed on every probe, not only on transitions):
//! `healthcheck_duration_seconds{proxy}` (a histogram with Prometheus' default buckets) and
//! `healthcheck_failures_total{proxy}`. `proxy` is `<namespace>/<name>`. A pruned proxy's series
//! are removed, so a gone proxy leaves nothing behind.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

fn labels(proxy: &str) -> Labels {
    vec![("proxy".to_string(), proxy.to_string())]
}

fn histogram() -> Histogram {
    // Prometheus' default buckets.
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

/// The engine's metrics; clones share the series.
#[derive(Clone)]
pub struct HealthMetrics {
    duration: Family<Labels, Histogram, fn() -> Histogram>,
    failures: Family<Labels, Counter>,
}

impl std::fmt::Debug for HealthMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthMetrics").finish_non_exhaustive()
    }
}

impl Default for HealthMetrics {
    fn default() -> Self {
        Self {
            duration: Family::new_with_constructor(histogram),
            failures: Family::default(),
        }
    }
}

impl HealthMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers both families (the names are written without a prefix, as the Go operator's).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "healthcheck_duration_seconds",
            "Duration of health probes through each proxy.",
            self.duration.clone(),
        );
        registry.register(
            "healthcheck_failures",
            "Health probes through each proxy that failed.",
            self.failures.clone(),
        );
    }

    /// Records one probe.
    pub fn observe(&self, proxy: &str, latency: Duration, ok: bool) {
        self.series(proxy).observe(latency, ok);
    }

    /// A proxy's two series, resolved once so each probe records without a lookup.
    pub fn series(&self, proxy: &str) -> ProxySeries {
        let labels = labels(proxy);
        ProxySeries {
            duration: self.duration.get_or_create(&labels).clone(),
            failures: self.failures.get_or_create(&labels).clone(),
        }
    }

    /// Removes a proxy's series (`ForgetProxy`).
    pub fn forget(&self, proxy: &str) {
        let labels = labels(proxy);
        self.duration.remove(&labels);
        self.failures.remove(&labels);
    }

    /// The failure count of a proxy, if it has a series.
    pub fn failures(&self, proxy: &str) -> Option<u64> {
        let labels = labels(proxy);
        self.failures.get(&labels).map(|c| c.get())
    }

    /// Whether a proxy has a duration series.
    pub fn has_series(&self, proxy: &str) -> bool {
        self.duration.get(&labels(proxy)).is_some()
    }
}

/// One proxy's series (handles into the families).
#[derive(Debug, Clone)]
pub struct ProxySeries {
    duration: Histogram,
    failures: Counter,
}

impl ProxySeries {
    /// Records one probe.
    pub fn observe(&self, latency: Duration, ok: bool) {
        self.duration.observe(latency.as_secs_f64());
        if !ok {
            self.failures.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_and_forgetting() {
        let m = HealthMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.observe("ns/a", Duration::from_millis(30), true);
        m.observe("ns/a", Duration::from_millis(30), false);
        m.observe("ns/b", Duration::from_millis(30), true);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(r#"healthcheck_failures_total{proxy="ns/a"} 1"#), "{text}");
        assert!(
            text.contains(r#"healthcheck_duration_seconds_count{proxy="ns/b"} 1"#),
            "{text}"
        );
        assert!(text.contains("# TYPE healthcheck_duration_seconds histogram"), "{text}");
        m.forget("ns/a");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("ns/a"), "{text}");
        assert!(text.contains("ns/b"));
    }
}
