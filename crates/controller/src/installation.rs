//! The installation id: the mark this install writes on every instance it makes (orphan GC
//! collects only instances carrying it) and the prefix of its Redis keys. `--installation-id`
//! names it; by default it is derived from the cluster (the `kube-system` namespace's UID, which
//! lives as long as the cluster) and the operator's namespace, so two installs, in one cluster or
//! in two, never share one unless told to, and an install keeps its id across restarts and
//! upgrades.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use sha2::{Digest, Sha256};

/// The namespace whose UID identifies the cluster: every cluster has it, and it is never
/// deleted.
pub const CLUSTER_NAMESPACE: &str = "kube-system";
/// What a derived id starts with, so one can tell it from an id a person chose.
pub const DERIVED_PREFIX: &str = "auto-";

/// The id of the install in `namespace` of the cluster whose `kube-system` has `cluster_uid`:
/// [`DERIVED_PREFIX`] and 16 hex digits of SHA-256 over both (a valid label value on every
/// backend).
pub fn derive(cluster_uid: &str, namespace: &str) -> String {
    let digest = Sha256::new()
        .chain_update(cluster_uid.as_bytes())
        .chain_update(b"/")
        .chain_update(namespace.as_bytes())
        .finalize();
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{DERIVED_PREFIX}{hex}")
}

/// The UID of the cluster's `kube-system` namespace (one GET, by name).
///
/// # Errors
/// The API's refusal or a transport failure; a namespace without a UID is an error too.
pub async fn cluster_uid(client: &kube::Client) -> Result<String, kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = namespaces.get(CLUSTER_NAMESPACE).await?;
    namespace
        .metadata
        .uid
        .filter(|uid| !uid.is_empty())
        .ok_or_else(|| kube::Error::Api(Box::new(no_uid())))
}

fn no_uid() -> kube::core::Status {
    kube::core::Status::failure(&format!("namespace {CLUSTER_NAMESPACE} has no uid"), "Invalid").with_code(500)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_id_is_a_label_value_that_differs_by_cluster_and_namespace() {
        let id = derive("0f3c9e5a-1b2d-4c6e-8f0a-123456789abc", "egress-proxies-operator-system");
        assert_eq!(id.len(), DERIVED_PREFIX.len() + 16, "{id}");
        assert!(id.starts_with(DERIVED_PREFIX));
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{id}"
        );
        assert_eq!(
            id,
            derive("0f3c9e5a-1b2d-4c6e-8f0a-123456789abc", "egress-proxies-operator-system")
        );
        assert_ne!(id, derive("0f3c9e5a-1b2d-4c6e-8f0a-123456789abc", "crawlers"));
        assert_ne!(
            id,
            derive("7a1e0c2b-0000-4000-8000-000000000000", "egress-proxies-operator-system")
        );
        // The separator keeps the two parts apart.
        assert_ne!(derive("ab", "c"), derive("a", "bc"));
    }
}
