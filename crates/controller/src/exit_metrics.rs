//! How many distinct exits the fleet has (issue: exit addresses): counted from the Proxies'
//! `status.exit` at each scrape, per provider entry and per pool, so ten Proxies that leave
//! through one node show as one exit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use egress_api::Proxy;
use kube::ResourceExt as _;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// Distinct exit addresses, keyed by provider entry and by pool.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ExitCounts {
    /// By `spec.provider` (empty for External Proxies, which have none).
    pub by_provider: BTreeMap<String, usize>,
    /// By pool, as (namespace, pool).
    pub by_pool: BTreeMap<(String, String), usize>,
}

/// The distinct exits of `proxies` that have one recorded. Pool members count in their pool
/// whatever their role (a draining member still carries traffic).
pub fn exit_counts(proxies: &[Arc<Proxy>]) -> ExitCounts {
    let mut providers: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut pools: BTreeMap<(String, String), BTreeSet<&str>> = BTreeMap::new();
    for p in proxies {
        let Some(exit) = p.status.as_ref().and_then(|s| s.exit.as_deref()) else {
            continue;
        };
        let address = exit.address.as_str();
        providers.entry(p.spec.provider.clone()).or_default().insert(address);
        if let Some(member) = p.pool() {
            let key = (p.namespace().unwrap_or_default(), member.pool.to_owned());
            pools.entry(key).or_default().insert(address);
        }
    }
    ExitCounts {
        by_provider: providers.into_iter().map(|(k, v)| (k, v.len())).collect(),
        by_pool: pools.into_iter().map(|(k, v)| (k, v.len())).collect(),
    }
}

/// `proxy_operator_exits{provider}` and `proxy_operator_pool_exits{namespace,pool}`, from a
/// Proxy cache at each scrape. With exit checks off nothing is recorded, and no series shown.
pub struct DistinctExits(pub Store<Proxy>);

impl std::fmt::Debug for DistinctExits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistinctExits").finish_non_exhaustive()
    }
}

type Labels = Vec<(&'static str, String)>;

impl Collector for DistinctExits {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counts = exit_counts(&self.0.state());
        let providers = counts
            .by_provider
            .into_iter()
            .map(|(provider, n)| (vec![("provider", provider)], n));
        gauge(
            &mut encoder,
            "proxy_operator_exits",
            "Distinct exit addresses the exit checks found among each provider entry's Proxies (External ones under provider=\"\").",
            providers,
        )?;
        let pools = counts
            .by_pool
            .into_iter()
            .map(|((namespace, pool), n)| (vec![("namespace", namespace), ("pool", pool)], n));
        gauge(
            &mut encoder,
            "proxy_operator_pool_exits",
            "Distinct exit addresses the exit checks found among each ProxyPool's members.",
            pools,
        )
    }
}

/// One gauge family of `series`; none at all when there is no series.
fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Labels, usize)>,
) -> Result<(), std::fmt::Error> {
    let mut series = series.peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, n) in series {
        ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::{LABEL_POOL, ProxySpec, ProxyStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn proxy(name: &str, provider: &str, pool: Option<&str>, exit: Option<&str>) -> Arc<Proxy> {
        let mut p = Proxy::new(
            name,
            ProxySpec {
                provider: provider.into(),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("crawl".into());
        if let Some(pool) = pool {
            p.metadata.labels = Some([(LABEL_POOL.to_owned(), pool.to_owned())].into());
            p.metadata.owner_references = Some(vec![OwnerReference {
                api_version: egress_api::API_VERSION.into(),
                kind: "ProxyPool".into(),
                name: pool.into(),
                uid: format!("{pool}-uid"),
                controller: Some(true),
                ..Default::default()
            }]);
        }
        p.status = Some(ProxyStatus {
            exit: exit.map(|a| {
                Box::new(egress_api::ExitStatus {
                    address: a.into(),
                    ..Default::default()
                })
            }),
            ..Default::default()
        });
        Arc::new(p)
    }

    #[test]
    fn exits_are_counted_once_per_address_by_provider_and_by_pool() {
        let counts = exit_counts(&[
            proxy("a", "k8s", Some("eu"), Some("203.0.113.1")),
            proxy("b", "k8s", Some("eu"), Some("203.0.113.1")),
            proxy("c", "k8s", Some("eu"), Some("203.0.113.2")),
            proxy("d", "k8s", None, Some("203.0.113.3")),
            proxy("e", "k8s", Some("us"), None),
            proxy("f", "", None, Some("198.51.100.1")),
        ]);
        assert_eq!(
            counts.by_provider,
            BTreeMap::from([(String::new(), 1), ("k8s".into(), 3)])
        );
        assert_eq!(counts.by_pool, BTreeMap::from([(("crawl".into(), "eu".into()), 2)]));
    }

    #[test]
    fn the_gauges_show_the_counts_and_nothing_without_exits() {
        let scrape = |proxies: Vec<Arc<Proxy>>| {
            let (store, mut writer) = kube::runtime::reflector::store::<Proxy>();
            for p in proxies {
                writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(Proxy::clone(&p)));
            }
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register_collector(Box::new(DistinctExits(store)));
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        assert!(!scrape(vec![proxy("a", "k8s", None, None)]).contains("exits"));
        let text = scrape(vec![
            proxy("a", "k8s", Some("eu"), Some("203.0.113.1")),
            proxy("b", "k8s", Some("eu"), Some("203.0.113.1")),
        ]);
        for line in [
            r#"proxy_operator_exits{provider="k8s"} 1"#,
            r#"proxy_operator_pool_exits{namespace="crawl",pool="eu"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
