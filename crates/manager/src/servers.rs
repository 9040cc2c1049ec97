//! The servers every replica starts: health probes, metrics, and the discovery API with its
//! token and clients files followed, its directory, and the connection limits they share.

use std::sync::{Arc, Mutex};

use egress_runtime::Fatal;
use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::flags::Options;
use crate::{discovery_auth, serve};

/// The probe server and the metrics server, each unless its address is `0`.
pub(crate) async fn serve_probes_and_metrics(
    options: &Options,
    client: &kube::Client,
    metrics: &Arc<Mutex<prometheus_client::registry::Registry>>,
    limits: egress_http::Limits,
    shutdown: &CancellationToken,
) -> Result<(), Fatal> {
    if options.health_probe_bind_address != "0" {
        let addr = serve::bind_address("health-probe-bind-address", &options.health_probe_bind_address)
            .map_err(|e| Fatal::new("Failed to start the health probe server", e))?;
        let bound = serve::probes(addr, limits, shutdown.clone())
            .await
            .map_err(|e| Fatal::new("Failed to start the health probe server", e))?;
        tracing::info!(address = %bound, "Serving health probes");
    }
    if options.metrics_bind_address != "0" {
        let addr = serve::bind_address("metrics-bind-address", &options.metrics_bind_address)
            .map_err(|e| Fatal::new("Failed to start the metrics server", e))?;
        let guard = options.metrics_secure.then(|| serve::Guard::new(client.clone()));
        let bound = serve::metrics(
            addr,
            metrics.clone(),
            guard,
            options.enable_http2,
            limits,
            shutdown.clone(),
        )
        .await
        .map_err(|e| Fatal::new("Failed to start the metrics server", e))?;
        tracing::info!(address = %bound, secure = options.metrics_secure, "Serving metrics");
    }
    Ok(())
}

/// What the discovery API is made of, from the replica being started.
pub(crate) struct DiscoveryParts<'a> {
    pub(crate) directory: &'a Arc<egress_controller::discovery::LiveDirectory>,
    pub(crate) store: &'a Arc<dyn egress_lease::LeaseStore>,
    pub(crate) admission_metrics: egress_discovery::AdmissionMetrics,
    pub(crate) client: &'a kube::Client,
    pub(crate) own_namespace: &'a str,
}

/// The discovery API on `--discovery-addr`, with its token and clients files followed: the
/// serving task, and the refusals it records for the pool autoscaler.
pub(crate) async fn serve_discovery(
    options: &Options,
    parts: DiscoveryParts<'_>,
    limits: egress_http::Limits,
    tasks: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<(Id, Option<Arc<egress_discovery::Refusals>>), Fatal> {
    let addr = serve::bind_address("discovery-addr", &options.discovery_addr)
        .map_err(|e| Fatal::new("Failed to start the discovery server", e))?;
    let listener = serve::listen(addr)
        .await
        .map_err(|e| Fatal::new("Failed to start the discovery server", format!("binding {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Fatal::new("Failed to start the discovery server", e))?;
    let auth = discovery_auth::start(options, parts.client, parts.own_namespace, tasks, shutdown).await;
    let tls = crate::discovery_tls::start(options, parts.client, parts.own_namespace, tasks, shutdown)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let clients = crate::clients_config::clients(options, parts.admission_metrics)?;
    if let Some(following) = clients.following {
        tasks.spawn(following.run(crate::followed::FILE_POLL, shutdown.clone()));
    }
    let api = egress_discovery::DiscoveryApi {
        directory: parts.directory.clone(),
        store: parts.store.clone(),
        max_ttl: options.max_lease_ttl,
        auth,
        refusals: Some(Arc::new(egress_discovery::Refusals::new(egress_api::ATTRIBUTE_POOL))),
        admission: clients.admission,
        scopes: clients.scopes,
        max_sessions: options.max_sessions_per_client,
    };
    let refusals = api.refusals.clone();
    let serving = tasks.spawn(egress_discovery::serve_tls(
        listener,
        Arc::new(api),
        limits,
        tls,
        shutdown.clone(),
    ));
    tracing::info!(address = %bound, scheme, "Serving the discovery API");
    Ok((serving.id(), refusals))
}

/// One directory for the API and the leader's view publisher, following both caches.
pub(crate) fn live_directory(
    options: &Options,
    cache: &egress_controller::proxy_cache::ProxyCache,
    credentials: &egress_controller::proxy::credentials::CredentialCache,
) -> Arc<egress_controller::discovery::LiveDirectory> {
    let indexed = egress_discovery::IndexedKeys::new(options.lease_index_attributes.iter().cloned());
    egress_controller::discovery::LiveDirectory::following(cache, credentials, indexed, options.exit_policy)
}

/// The connection limits of every server this replica runs.
pub(crate) fn server_limits(options: &Options) -> egress_http::Limits {
    egress_http::Limits {
        max_connections: options.max_connections,
        max_connections_per_source: options.max_connections_per_source,
        ..egress_http::Limits::DEFAULT
    }
}
