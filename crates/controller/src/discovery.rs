//! The seam between Proxies and the discovery API (which knows no Kubernetes): the proxies it
//! lists and leases, from the operator's cache, Proxies being deleted left out.

use std::sync::{Arc, Mutex};

use egress_api::{Mode, PoolRole, Proxy};
use egress_discovery::{ProxyDirectory, ProxyInfo};
use kube::ResourceExt;

use crate::credentials::{CredentialCache, Lookup};
use crate::proxy_cache::ProxyCache;

/// A Proxy as the discovery API shows it, with the credentials it demands; `None` while it is
/// being deleted. One that asks for credentials the cache cannot give is shown unhealthy, so
/// it is never leased: a lease without them would be refused by the proxy.
pub fn info(proxy: &Proxy, credentials: Lookup) -> Option<ProxyInfo> {
    if proxy.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let (credentials, usable) = match credentials {
        Lookup::Found(c) => (Some(c), true),
        Lookup::NotNeeded => (None, true),
        Lookup::Missing => (None, false),
    };
    let status = proxy.status.clone().unwrap_or_default();
    let (ip, port) = match proxy.spec.mode {
        Mode::External => proxy.spec.external_address().unwrap_or_default(),
        Mode::Managed => (status.ip.clone(), proxy.spec.port),
    };
    let verdict = crate::decide::last_verdict(&status);
    let role = proxy.pool().map(|m| m.role);
    Some(ProxyInfo {
        id: format!("{}/{}", proxy.namespace().unwrap_or_default(), proxy.name_any()),
        ip,
        port: u16::try_from(port).unwrap_or(0),
        attributes: proxy.spec.attributes.clone(),
        phase: status.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
        healthy: usable && verdict.is_some_and(|v| v.healthy),
        latency_millis: status.latency_millis.unwrap_or(0),
        max_leases: proxy.spec.effective_max_leases(),
        credentials,
        offered: role.is_none_or(PoolRole::offered),
        pool_role: role.map(PoolRole::as_str),
    })
}

/// The operator's Proxy cache as the discovery API's directory. The views are rebuilt only when
/// the cache has changed since the last request, and kept in (latency, id) order.
#[derive(Debug)]
pub struct CachedDirectory {
    cache: ProxyCache,
    credentials: CredentialCache,
    snapshot: Mutex<Option<(u64, Arc<Vec<ProxyInfo>>)>>,
}

impl CachedDirectory {
    pub fn new(cache: ProxyCache, credentials: CredentialCache) -> Self {
        Self {
            cache,
            credentials,
            snapshot: Mutex::default(),
        }
    }
}

impl ProxyDirectory for CachedDirectory {
    fn proxies(&self) -> Result<Arc<Vec<ProxyInfo>>, String> {
        // Either cache changing changes the sum: a rotated password reaches the next lease.
        let generation = self.cache.generation().wrapping_add(self.credentials.generation());
        let mut snapshot = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, views)) = snapshot.as_ref()
            && *seen == generation
        {
            return Ok(views.clone());
        }
        let mut views: Vec<ProxyInfo> = self
            .cache
            .store()
            .state()
            .iter()
            .filter_map(|p| info(p, self.credentials.lookup(p)))
            .collect();
        views.sort_by(|a, b| (a.latency_millis, &a.id).cmp(&(b.latency_millis, &b.id)));
        let views = Arc::new(views);
        *snapshot = Some((generation, views.clone()));
        Ok(views)
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        Some(self.cache.changes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::{Condition, ConditionStatus, Endpoint, Phase, ProxySpec, ProxyStatus};

    #[test]
    fn the_view_of_a_proxy() {
        let mut p = Proxy::new(
            "out",
            ProxySpec {
                mode: Mode::External,
                endpoint: Some(Endpoint {
                    host: "proxy.example".into(),
                    port: None,
                }),
                attributes: [("geo".to_string(), "eu".to_string())].into(),
                max_leases: Some(0),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.status = Some(ProxyStatus {
            phase: Some(Phase::Ready),
            latency_millis: Some(42),
            conditions: vec![Condition {
                type_: "Healthy".into(),
                status: ConditionStatus::True,
                observed_generation: None,
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                reason: "ProbeSucceeded".into(),
                message: String::new(),
            }],
            ..Default::default()
        });
        let v = info(&p, Lookup::NotNeeded).unwrap();
        assert_eq!(
            (
                v.id.as_str(),
                v.ip.as_str(),
                v.port,
                v.phase.as_str(),
                v.healthy,
                v.latency_millis,
                v.max_leases
            ),
            ("ns/out", "proxy.example", 3128, "Ready", true, 42, 0)
        );
        assert_eq!(v.attributes["geo"], "eu");
        // Credentials asked for and not to be had: listed, never leased.
        let v = info(&p, Lookup::Missing).unwrap();
        assert_eq!((v.healthy, v.credentials), (false, None));
        let found = egress_credentials::Credentials::new("u", "p").unwrap();
        let v = info(&p, Lookup::Found(found.clone())).unwrap();
        assert_eq!((v.healthy, v.credentials), (true, Some(found)));
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(info(&p, Lookup::NotNeeded), None);
    }
}
