//! The kubernetes provider (spec/providers.md §4): one Squid Pod per Proxy, in the Proxy's
//! namespace of the operator's own cluster (or only in `kubernetes.namespace`, when the entry
//! names one: Proxies elsewhere are refused and Pods are listed there alone; else, in an
//! operator that serves some namespaces only, Pods are placed and listed in those alone).
//!
//! - [`squid`], [`pod`]: the Squid config and the Pod, pure functions of the request;
//! - [`id`], [`state`], [`classify`]: providerIDs, what a Pod's phase means, what an API answer
//!   means;
//! - [`provider`]: create, get, delete, list and the health check over a `kube::Client`.
//!
//! [`construct`] builds it from a config entry as the operator does, with a client of its own.

pub mod classify;
pub mod config;
pub mod id;
pub mod pod;
pub mod provider;
pub mod squid;
pub mod state;

use std::sync::Arc;

use egress_provider::config::ProviderConfig;
use egress_provider::{BoxError, Provider, ProviderType};

pub use config::{KubernetesConfig, KubernetesResources, ProxyAccess};
pub use provider::KubernetesProvider;

/// The `type:` value.
pub const TYPE_NAME: &str = "kubernetes";

/// The `kubernetes` provider type, serving every namespace.
pub fn provider_type() -> ProviderType {
    provider_type_serving(None)
}

/// The `kubernetes` provider type of an operator that serves only `namespaces` (`None`: every
/// namespace): an entry without `kubernetes.namespace` places and lists Pods only there.
pub fn provider_type_serving(namespaces: Option<Vec<String>>) -> ProviderType {
    ProviderType::with_block::<KubernetesConfig>(TYPE_NAME, move |entry| {
        Ok(Arc::new(built(entry)?.serving(namespaces.clone())))
    })
}

/// Builds a provider from a `kubernetes` entry with a client of its own (uncached, independent
/// of the manager's), from `KUBECONFIG`, `~/.kube/config` or the in-cluster service account, in
/// kube's order. Contacts nothing. Must run inside the operator's (multi-threaded) runtime.
///
/// # Errors
/// No config can be found, or the client cannot be built.
pub fn construct(entry: &ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> {
    Ok(Arc::new(built(entry)?))
}

fn built(entry: &ProviderConfig) -> Result<KubernetesProvider, BoxError> {
    let block: KubernetesConfig = entry.block()?.unwrap_or_default();
    let name = &entry.name;
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| format!("kubernetes provider {name:?}: loading kubeconfig: no async runtime: {e}"))?;
    let config = tokio::task::block_in_place(|| runtime.block_on(kube::Config::infer()))
        .map_err(|e| format!("kubernetes provider {name:?}: loading kubeconfig: {e}"))?;
    let api_host = config.cluster_url.to_string();
    let client =
        kube::Client::try_from(config).map_err(|e| format!("kubernetes provider {name:?}: building client: {e}"))?;
    let settings = pod::PodSettings {
        namespace: block.namespace,
        image: block.image,
        resources: block.resources.map(|r| pod::requirements(&r.requests, &r.limits)),
        access: squid::AccessRules::from_config(block.access.as_ref()),
    };
    Ok(KubernetesProvider::new(name, client, api_host, settings))
}
