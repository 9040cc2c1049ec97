//! The seam between Proxies and the health engine (which knows no Kubernetes): what to probe for
//! each Proxy, and the engine's verdicts as the reconciler reads them (spec/core.md §3.11, §4.2).

use std::time::Duration;

use egress_api::{Mode, Proxy};
use egress_health::{ProbeSettings, ProxyKey, ProxySource, ProxyView, Snapshot};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use crate::proxy::credentials::Lookup;
use crate::proxy::status::Verdict;

/// Where the reconciler reads health verdicts: the health engine's snapshot.
pub trait HealthVerdicts: Send + Sync + 'static {
    fn verdict(&self, namespace: &str, name: &str) -> Option<Verdict>;

    /// The verdict for this very Proxy: a source that knows which object and address it probed
    /// refuses a verdict about an earlier Proxy of the same name, or an earlier address.
    fn verdict_for(&self, proxy: &Proxy) -> Option<Verdict> {
        self.verdict(&proxy.namespace().unwrap_or_default(), &proxy.name_any())
    }
}

impl HealthVerdicts for Snapshot {
    fn verdict(&self, namespace: &str, name: &str) -> Option<Verdict> {
        self.get(namespace, name)
    }

    /// Only a verdict about this very Proxy (UID) at its current address.
    fn verdict_for(&self, proxy: &Proxy) -> Option<Verdict> {
        let view = view(proxy, "", Lookup::NotNeeded)?;
        self.get_for(&view)
    }
}

/// The Proxies of the operator's cache, as the engine probes them.
#[derive(Clone)]
pub struct CachedProxies {
    pub cache: crate::proxy_cache::ProxyCache,
    /// The target when a Proxy's `spec.healthCheck.url` is unset (`--health-check-url`).
    pub default_url: String,
    /// Where the credentials of Proxies that have them are read.
    pub credentials: crate::proxy::credentials::CredentialCache,
    /// Where External Proxies are accepted, and the internal destinations they may not point
    /// at nor resolve to.
    pub external: std::sync::Arc<crate::proxy::destinations::ExternalRules>,
}

impl std::fmt::Debug for CachedProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedProxies")
            .field("default_url", &self.default_url)
            .finish_non_exhaustive()
    }
}

/// What to probe for one Proxy, with its credentials as the cache has them: `None` while it is
/// being deleted. An empty host (a Managed Proxy without an IP yet) tells the engine to prune.
///
/// A Generated Proxy whose credentials the cache cannot give (its Secret not yet bound to the
/// new instance, or lost) is pruned too: a probe without them would only be refused, and count
/// against an instance that works. An External Proxy whose user Secret is missing is probed
/// without: the refusal (`ProxyAuthRequired`) is what its author needs to see. One whose Secret
/// does not name it ([`Lookup::Refused`]) is pruned: it is refused, and its status says why.
pub fn view(proxy: &Proxy, default_url: &str, credentials: Lookup) -> Option<ProxyView> {
    if proxy.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let generated = proxy.spec.credentials_type() == egress_api::CredentialsType::Generated;
    let (credentials, unprobeable) = match credentials {
        Lookup::Found(c) => (Some(c), false),
        Lookup::NotNeeded => (None, false),
        Lookup::Missing => (None, generated),
        Lookup::Refused(_) => (None, true),
    };
    let (host, port) = match proxy.spec.mode {
        Mode::External => proxy.spec.external_address().unwrap_or_default(),
        Mode::Managed => (
            proxy.status.as_ref().map(|s| s.ip.clone()).unwrap_or_default(),
            proxy.spec.port,
        ),
    };
    // A port no proxy can listen on leaves nothing to probe.
    let port = u16::try_from(port).ok().filter(|p| *p != 0);
    let host = if port.is_some() && !unprobeable {
        host
    } else {
        String::new()
    };
    let check = proxy.spec.effective_health_check();
    let url = proxy
        .spec
        .health_check
        .as_ref()
        .and_then(|h| h.url.clone())
        .unwrap_or_else(|| default_url.to_string());
    Some(ProxyView {
        key: ProxyKey::new(&proxy.namespace().unwrap_or_default(), &proxy.name_any()),
        uid: proxy.uid().unwrap_or_default(),
        host,
        port: port.unwrap_or(0),
        settings: ProbeSettings {
            credentials,
            url,
            expected_status: check.expected_status,
            interval: check.interval.max(Duration::from_secs(1)),
            timeout: check.timeout,
            success_threshold: check.success_threshold,
            failure_threshold: check.failure_threshold,
            destinations: None,
        },
        known: proxy.status.as_ref().and_then(crate::proxy::status::last_verdict),
    })
}

/// `view` of an External Proxy within `rules`: pruned (nothing dialled) when it is refused, else
/// probed with the guard, so that a name resolving to an internal address is refused at the
/// dial. Managed Proxies live on internal addresses by design.
pub fn guarded(proxy: &Proxy, mut view: ProxyView, rules: &crate::proxy::destinations::ExternalRules) -> ProxyView {
    if proxy.spec.mode != Mode::External {
        return view;
    }
    if rules.refusal(proxy).is_some() {
        view.host.clear();
    } else {
        view.settings.destinations = Some(rules.guard.clone());
    }
    view
}

impl ProxySource for CachedProxies {
    fn proxies(&self) -> Vec<ProxyView> {
        self.cache
            .store()
            .state()
            .iter()
            .filter_map(|p| {
                let v = view(p, &self.default_url, self.credentials.lookup(p))?;
                Some(guarded(p, v, &self.external))
            })
            .collect()
    }

    /// Changes with either cache: a rotated password reaches the probe.
    fn generation(&self) -> Option<u64> {
        Some(self.cache.generation().wrapping_add(self.credentials.generation()))
    }
}

/// The reconciler's trigger for a Proxy the engine names.
pub fn object_ref(key: &ProxyKey) -> ObjectRef<Proxy> {
    ObjectRef::new(&key.name).within(&key.namespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::{Endpoint, HealthCheckSpec, ProxySpec, ProxyStatus};

    fn proxy(mode: Mode) -> Proxy {
        let mut p = Proxy::new(
            "p",
            ProxySpec {
                mode,
                provider: "x".into(),
                port: 3128,
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("u".into());
        p
    }

    #[test]
    fn what_each_proxy_is_probed_at() {
        let mut managed = proxy(Mode::Managed);
        let v = view(&managed, "https://default.test/204", Lookup::NotNeeded).unwrap();
        assert_eq!((v.host.as_str(), v.port), ("", 3128), "no IP yet: the engine prunes");
        assert_eq!(v.settings.url, "https://default.test/204");
        managed.status = Some(ProxyStatus {
            ip: "10.0.0.5".into(),
            ..Default::default()
        });
        managed.spec.health_check = Some(HealthCheckSpec {
            url: Some("https://own.test/".into()),
            success_threshold: Some(4),
            ..Default::default()
        });
        let v = view(&managed, "https://default.test/204", Lookup::NotNeeded).unwrap();
        assert_eq!(
            (v.host.as_str(), v.settings.url.as_str(), v.settings.success_threshold),
            ("10.0.0.5", "https://own.test/", 4)
        );
        assert_eq!(v.key, ProxyKey::new("ns", "p"));

        let mut external = proxy(Mode::External);
        external.spec.endpoint = Some(Endpoint {
            host: "proxy.example".into(),
            port: Some(8080),
        });
        let v = view(&external, "u", Lookup::NotNeeded).unwrap();
        assert_eq!((v.host.as_str(), v.port), ("proxy.example", 8080));

        external.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(
            view(&external, "u", Lookup::NotNeeded),
            None,
            "a Proxy being deleted is not probed"
        );
    }

    #[test]
    fn an_external_proxy_pointing_inside_is_pruned_and_others_carry_the_guard() {
        let rules = crate::proxy::destinations::ExternalRules::default();
        let guard = rules.guard.clone();
        let mut external = proxy(Mode::External);
        let at = |host: &str| {
            Some(Endpoint {
                host: host.into(),
                port: Some(3128),
            })
        };
        external.spec.endpoint = at("169.254.169.254");
        let v = guarded(&external, view(&external, "u", Lookup::NotNeeded).unwrap(), &rules);
        assert_eq!((v.host.as_str(), v.settings.destinations), ("", None), "pruned");
        external.spec.endpoint = at("proxy.example");
        let v = guarded(&external, view(&external, "u", Lookup::NotNeeded).unwrap(), &rules);
        assert_eq!(
            (v.host.as_str(), v.settings.destinations),
            ("proxy.example", Some(guard.clone()))
        );

        let mut managed = proxy(Mode::Managed);
        managed.status = Some(ProxyStatus {
            ip: "10.0.0.5".into(),
            ..Default::default()
        });
        let v = guarded(&managed, view(&managed, "u", Lookup::NotNeeded).unwrap(), &rules);
        assert_eq!((v.host.as_str(), v.settings.destinations), ("10.0.0.5", None));
    }

    #[test]
    fn credentials_the_cache_cannot_give_prune_a_generated_proxy_but_not_an_external_one() {
        let credentials = |type_| {
            Some(egress_api::Credentials {
                type_,
                secret_ref: None,
            })
        };
        let mut managed = proxy(Mode::Managed);
        managed.spec.credentials = credentials(egress_api::CredentialsType::Generated);
        managed.status = Some(ProxyStatus {
            ip: "10.0.0.5".into(),
            ..Default::default()
        });
        let found = egress_credentials::Credentials::new("u", "p").unwrap();
        let v = view(&managed, "u", Lookup::Found(found.clone())).unwrap();
        assert_eq!((v.host.as_str(), v.settings.credentials), ("10.0.0.5", Some(found)));
        let v = view(&managed, "u", Lookup::Missing).unwrap();
        assert_eq!((v.host.as_str(), v.settings.credentials), ("", None), "pruned");

        let mut external = proxy(Mode::External);
        external.spec.endpoint = Some(Endpoint {
            host: "proxy.example".into(),
            port: None,
        });
        external.spec.credentials = credentials(egress_api::CredentialsType::Secret);
        let v = view(&external, "u", Lookup::Missing).unwrap();
        assert_eq!((v.host.as_str(), v.settings.credentials), ("proxy.example", None));
    }
}
