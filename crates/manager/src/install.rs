//! Who this install is: the namespace it runs in, the namespaces it serves, its installation
//! id, and this replica's name. Read once at start.

use std::time::Duration;

use egress_api::served::Namespaces;

use crate::flags::Options;
use egress_runtime::Fatal;

/// How long the start waits for the cluster to say who it is, when it does not answer.
const INSTALLATION_BUDGET: Duration = Duration::from_secs(30);

/// The installation id: `--installation-id`, or derived from the cluster and the operator's
/// namespace (`egress_controller::installation`). A cluster that does not answer is asked again
/// for [`INSTALLATION_BUDGET`]; one that refuses (no grant to read `kube-system`) stops the
/// start at once, saying what to grant or set.
pub(crate) async fn installation_id(
    options: &Options,
    client: &kube::Client,
    own_namespace: &str,
) -> Result<String, Fatal> {
    use egress_controller::installation::{CLUSTER_NAMESPACE, cluster_uid, derive};
    if !options.installation_id.is_empty() {
        tracing::info!(installation = %options.installation_id, "Installation id set by --installation-id");
        return Ok(options.installation_id.clone());
    }
    let deadline = tokio::time::Instant::now() + INSTALLATION_BUDGET;
    let uid = loop {
        match cluster_uid(client).await {
            Ok(uid) => break uid,
            Err(kube::Error::Api(s)) if (400..500).contains(&s.code) => {
                return Err(Fatal::new(
                    "Failed to derive the installation id",
                    format!(
                        "reading namespace {CLUSTER_NAMESPACE}: {} ({}); grant get on it (deploy/rbac/role.yaml) or set --installation-id",
                        s.message, s.code
                    ),
                ));
            }
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(Fatal::new(
                    "Failed to derive the installation id",
                    format!("reading namespace {CLUSTER_NAMESPACE}: {e}"),
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading namespace {CLUSTER_NAMESPACE} for the installation id failed; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let id = derive(&uid, own_namespace);
    tracing::info!(installation = %id, namespace = own_namespace, "Installation id derived from the cluster and the namespace");
    Ok(id)
}

/// The operator's own namespace and the namespaces it serves.
#[derive(Debug, Clone)]
pub(crate) struct Namespaced {
    /// Where the operator runs: its leader Lease, token Secret, and by default the only
    /// namespace it serves and takes External Proxies in.
    pub(crate) own: String,
    /// `--proxy-namespace`: the Proxies, pools and Secrets it watches and serves.
    pub(crate) served: Namespaces,
}

/// The namespaces a list flag names (`--proxy-namespace`, `--external-proxy-namespaces`): its
/// names, every namespace for `*`, or by default only the operator's own.
pub(crate) fn namespaces(flag: &[String], own_namespace: &str) -> Namespaces {
    match flag {
        [all] if all == "*" => Namespaces::All,
        [] => Namespaces::one(own_namespace),
        names => Namespaces::Only(names.iter().cloned().collect()),
    }
}

/// The pod's own namespace (downward API or service account), or the kubeconfig's when run
/// outside a cluster, else `default` (a start without any kubeconfig fails later, building its
/// client, with the reason).
pub(crate) async fn own_namespace(kubeconfig: &str) -> String {
    let from_pod = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
        });
    match from_pod {
        Some(namespace) => namespace,
        None => crate::kube_config(kubeconfig)
            .await
            .map_or_else(|_| "default".to_owned(), |c| c.default_namespace),
    }
}

/// This replica's name in the Lease: the pod (or host) name plus a random suffix, as
/// controller-runtime makes it, so a restarted pod is a new candidate.
pub(crate) fn replica_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "egress-operator".into());
    let suffix = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|u| u.trim().to_string())
        .unwrap_or_else(|_| format!("{}", std::process::id()));
    format!("{host}_{suffix}")
}
