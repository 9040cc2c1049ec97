//! Where an External Proxy may point: its endpoint and its health-check URL must not be
//! internal destinations (the one list in `egress-netguard`), or the manager would dial, and
//! report on, any address its own network position reaches.

use std::sync::Arc;

use egress_api::served::Namespaces;
use egress_api::{Mode, Proxy, ProxySpec, reasons};
use egress_netguard::Guard;
use kube::ResourceExt;

/// Why an External Proxy is refused: its reason and message, for its condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// It is in a namespace where External Proxies are not accepted.
    Namespace(String),
    /// It points at an internal destination.
    Destination(String),
}

impl Refused {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Namespace(_) => reasons::EXTERNAL_NOT_ALLOWED,
            Self::Destination(_) => reasons::DESTINATION_REFUSED,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::Namespace(m) | Self::Destination(m) => m,
        }
    }
}

/// What External Proxies must keep to: where they may be, and what they may not point at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExternalRules {
    /// Where External Proxies are accepted (`All`: every namespace the operator serves).
    pub namespaces: Namespaces,
    pub guard: Arc<Guard>,
}

impl ExternalRules {
    /// Why `proxy` is refused; `None` when it is accepted, or not External.
    pub fn refusal(&self, proxy: &Proxy) -> Option<Refused> {
        if proxy.spec.mode != Mode::External {
            return None;
        }
        let namespace = proxy.namespace().unwrap_or_default();
        if !self.namespaces.contains(&namespace) {
            return Some(Refused::Namespace(format!(
                "External Proxies are accepted only in {} (--external-proxy-namespaces), not in {namespace}",
                self.namespaces
            )));
        }
        refusal(&proxy.spec, &self.guard).map(Refused::Destination)
    }
}

/// Why the External Proxy with `spec` is refused, for its condition; `None` when it may be
/// dialled, or when it is not External. Names are judged as written; what a name resolves to is
/// checked again when the probe dials it.
pub fn refusal(spec: &ProxySpec, guard: &Guard) -> Option<String> {
    if spec.mode != Mode::External {
        return None;
    }
    let endpoint = spec.endpoint.as_ref()?;
    if let Some(why) = guard.host(&endpoint.host) {
        return Some(refused("spec.endpoint.host", &endpoint.host, why));
    }
    let url = spec.health_check.as_ref()?.url.as_ref()?;
    // A URL the probe cannot use is the probe's to report.
    let host = egress_health::target_host(url).ok()?;
    guard.host(&host).map(|why| refused("spec.healthCheck.url", &host, why))
}

fn refused(field: &str, host: &str, why: egress_netguard::Internal) -> String {
    format!(
        "{field} names {host:?}, {}: External proxies may not point at internal destinations \
         unless the operator's --allowed-internal-destinations names them",
        why.describe()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::{Endpoint, HealthCheckSpec};

    fn external(host: &str, url: Option<&str>) -> ProxySpec {
        ProxySpec {
            mode: Mode::External,
            endpoint: Some(Endpoint {
                host: host.into(),
                port: Some(3128),
            }),
            health_check: url.map(|u| HealthCheckSpec {
                url: Some(u.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn internal_endpoints_and_health_urls_are_refused_with_the_field_named() {
        let guard = Guard::default();
        for (spec, field) in [
            (external("127.0.0.1", None), "spec.endpoint.host"),
            (external("169.254.169.254", None), "spec.endpoint.host"),
            (external("0xa9fea9fe", None), "spec.endpoint.host"),
            (external("10.0.0.7", None), "spec.endpoint.host"),
            (external("redis.crawlers.svc.cluster.local", None), "spec.endpoint.host"),
            (
                external("proxy.vendor.example", Some("http://metadata.google.internal/")),
                "spec.healthCheck.url",
            ),
            (
                external("proxy.vendor.example", Some("https://[::ffff:10.1.2.3]:8443/x")),
                "spec.healthCheck.url",
            ),
        ] {
            let message = refusal(&spec, &guard).expect("refused");
            assert!(message.starts_with(field), "{message}");
            assert!(message.contains("--allowed-internal-destinations"), "{message}");
        }
    }

    #[test]
    fn external_proxies_are_accepted_only_in_the_namespaces_named() {
        let rules = ExternalRules {
            namespaces: Namespaces::Only(["crawlers".to_owned()].into()),
            ..Default::default()
        };
        let in_ns = |ns: &str, spec: ProxySpec| {
            let mut p = Proxy::new("p", spec);
            p.metadata.namespace = Some(ns.into());
            p
        };
        let public = external("proxy.vendor.example", None);
        assert_eq!(rules.refusal(&in_ns("crawlers", public.clone())), None);
        let elsewhere = rules.refusal(&in_ns("team-b", public.clone())).expect("refused");
        assert_eq!(elsewhere.reason(), reasons::EXTERNAL_NOT_ALLOWED);
        assert!(elsewhere.message().contains("crawlers") && elsewhere.message().contains("team-b"));
        let inside = rules
            .refusal(&in_ns("crawlers", external("10.0.0.1", None)))
            .expect("refused");
        assert_eq!(inside.reason(), reasons::DESTINATION_REFUSED);
        let managed = ProxySpec {
            mode: Mode::Managed,
            ..public
        };
        assert_eq!(rules.refusal(&in_ns("team-b", managed)), None);
        let all = ExternalRules::default();
        assert_eq!(
            all.refusal(&in_ns("team-b", external("proxy.vendor.example", None))),
            None
        );
    }

    #[test]
    fn public_ones_pass_and_the_allowlist_and_managed_proxies_are_left_alone() {
        let guard = Guard::default();
        let public = external("proxy.vendor.example", Some("https://www.gstatic.com/generate_204"));
        assert_eq!(refusal(&public, &guard), None);
        let allowed = Guard::new(&[], &["127.0.0.1".into()]).unwrap();
        assert_eq!(
            refusal(&external("127.0.0.1", Some("http://127.0.0.1:9/")), &allowed),
            None
        );
        let managed = ProxySpec {
            mode: Mode::Managed,
            ..external("127.0.0.1", None)
        };
        assert_eq!(refusal(&managed, &guard), None);
    }
}
