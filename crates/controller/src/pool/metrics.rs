//! The pool controller's metrics (docs/pools.md#the-controller): counters and gauges its
//! passes set, and the member gauges read from the Proxy cache at scrape time.

use std::collections::BTreeMap;

use egress_api::{Phase, Proxy};
use kube::ResourceExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::pool::remediation::{Backoff, Gate};
use k8s_openapi::jiff::Timestamp;

/// The pool controller's counters; the member gauges are read from the cache at scrape time
/// ([`PoolMetrics::register`]).
#[derive(Clone, Debug, Default)]
pub struct PoolMetrics {
    pub(crate) promotions: Family<PoolLabels, Counter>,
    pub(crate) drains: Family<DrainLabels, Counter>,
    pub(crate) creates: Family<CreateLabels, Counter>,
    pub(crate) scaled: Family<ScaleLabels, Counter>,
    /// Active leases on the pool's members, as of its last pass.
    pub(crate) leases: Family<PoolLabels, Gauge>,
    /// The lease capacity of its active Ready members, as of its last pass.
    pub(crate) capacity: Family<PoolLabels, Gauge>,
    /// 1 while the pool may replace failed members, 0 while it may not.
    remediation_allowed: Family<PoolLabels, Gauge>,
    /// Members in a row that never became Ready within their grace.
    failed_creations: Family<PoolLabels, Gauge>,
    /// How long the next replacement still waits for the backoff, in seconds.
    replacement_delay: Family<PoolLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolLabels {
    pub(crate) namespace: String,
    pub(crate) pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DrainLabels {
    pub(crate) namespace: String,
    pub(crate) pool: String,
    /// `failed`, `exit_refused`, `rotation` (outdated: another template or past `maxAge`),
    /// `scale_down`, `pool_deleted`.
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CreateLabels {
    pub(crate) namespace: String,
    pub(crate) pool: String,
    pub(crate) role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ScaleLabels {
    pub(crate) namespace: String,
    pub(crate) pool: String,
    /// `up` or `down`.
    pub(crate) direction: &'static str,
}

/// The members of every pool by role and readiness, counted from the cache at scrape time.
#[derive(Debug)]
struct MemberGauges(kube::runtime::reflector::Store<Proxy>);

impl prometheus_client::collector::Collector for MemberGauges {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric as _;
        let mut counts: BTreeMap<(String, String, &'static str, bool), i64> = BTreeMap::new();
        for p in self.0.state() {
            if let Some(m) = p.pool() {
                let key = (
                    p.namespace().unwrap_or_default(),
                    m.pool.to_owned(),
                    m.role.as_str(),
                    p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready),
                );
                *counts.entry(key).or_default() += 1;
            }
        }
        let family = encoder.encode_descriptor(
            "proxy_operator_pool_members",
            "Members of each ProxyPool by role (active, standby, draining) and whether they are Ready.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        let mut family = family;
        for ((namespace, pool, role, ready), n) in counts {
            let labels = [
                ("namespace", namespace),
                ("pool", pool),
                ("role", role.to_owned()),
                ("ready", ready.to_string()),
            ];
            let encoder = family.encode_family(&labels)?;
            prometheus_client::metrics::gauge::ConstGauge::new(n).encode(encoder)?;
        }
        Ok(())
    }
}

impl PoolMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the counters, and the member gauges read from `proxies` at scrape time.
    pub fn register(&self, registry: &mut Registry, proxies: kube::runtime::reflector::Store<Proxy>) {
        registry.register(
            "proxy_operator_pool_promotions",
            "Standbys promoted to active members, by pool.",
            self.promotions.clone(),
        );
        registry.register(
            "proxy_operator_pool_drains",
            "Members drained, by pool and reason (failed, exit_refused, rotation, scale_down, pool_deleted).",
            self.drains.clone(),
        );
        registry.register(
            "proxy_operator_pool_member_creates",
            "Members made, by pool and the role they were made in.",
            self.creates.clone(),
        );
        registry.register(
            "proxy_operator_pool_autoscaled",
            "Changes of spec.replicas made by a pool's autoscale, by pool and direction (up, down).",
            self.scaled.clone(),
        );
        registry.register(
            "proxy_operator_pool_leases",
            "Active leases on each ProxyPool's members, as of the pool's last pass.",
            self.leases.clone(),
        );
        registry.register(
            "proxy_operator_pool_lease_capacity",
            "The lease capacity (maxLeases summed) of each ProxyPool's active Ready members, as of the pool's last pass.",
            self.capacity.clone(),
        );
        registry.register(
            "proxy_operator_pool_remediation_allowed",
            "1 while a ProxyPool replaces its failed members, 0 while too many have failed or failed creations hold it back, as of its last pass.",
            self.remediation_allowed.clone(),
        );
        registry.register(
            "proxy_operator_pool_failed_creations",
            "Members of each ProxyPool in a row that never became Ready within their startup grace, as of its last pass.",
            self.failed_creations.clone(),
        );
        registry.register(
            "proxy_operator_pool_replacement_delay_seconds",
            "How long each ProxyPool's next new member still waits for the backoff of its failed creations, as of its last pass.",
            self.replacement_delay.clone(),
        );
        registry.register_collector(Box::new(MemberGauges(proxies)));
    }

    /// Sets a pass's remediation gauges.
    pub(crate) fn record_remediation(&self, labels: &PoolLabels, gate: &Gate, backoff: &Backoff, now: Timestamp) {
        let wait = backoff.remaining(now).unwrap_or_default();
        self.remediation_allowed
            .get_or_create(labels)
            .set(i64::from(gate.allows()));
        self.failed_creations
            .get_or_create(labels)
            .set(i64::from(backoff.failed_creations));
        self.replacement_delay
            .get_or_create(labels)
            .set(i64::try_from(wait.as_secs()).unwrap_or(i64::MAX));
    }

    /// Drops a deleted pool's remediation series.
    pub(crate) fn forget_remediation(&self, labels: &PoolLabels) {
        self.remediation_allowed.remove(labels);
        self.failed_creations.remove(labels);
        self.replacement_delay.remove(labels);
    }
}
