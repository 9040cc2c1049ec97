//! The Secrets a pass reads, and what can go wrong with them: the cloud-init Secret a Proxy's
//! `spec.cloudInit.secretRef` names (read here), and the credentials Secret
//! ([`crate::proxy::credentials`]). Both the decision and the credentials take
//! [`SecretProblem`] from here, so neither needs the other for it.

use egress_api::{LABEL_CLOUD_INIT, SecretRef};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};

/// Why a Secret gave no text: the cloud-init Secret, or the credentials Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretProblem {
    /// Missing, unlabelled, without the key, or not text: a `CloudInitError` on the Proxy.
    Unusable(String),
    /// The API server did not answer: retried with backoff, the status left as it was.
    Unavailable(String),
}

/// Reads a cloud-init Secret as the labelled-Secret cache would: an unlabelled Secret is
/// invisible. The value is taken as bytes (gzip user-data is not text). The error names the
/// Secret and key, never the content.
pub(crate) async fn read_cloud_init(client: &Client, namespace: &str, r: &SecretRef) -> Result<Vec<u8>, SecretProblem> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let missing = || {
        SecretProblem::Unusable(format!(
            "Secret \"{}\" with label {LABEL_CLOUD_INIT}=true and key \"{}\" not found in namespace {namespace}",
            r.name, r.key
        ))
    };
    let secret = match api.get_opt(&r.name).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(missing()),
        Err(e) => {
            return Err(SecretProblem::Unavailable(format!(
                "reading Secret \"{}\": {e}",
                r.name
            )));
        }
    };
    let labelled = secret.labels().get(LABEL_CLOUD_INIT).is_some_and(|v| v == "true");
    if !labelled {
        return Err(missing());
    }
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .map(|b| b.0.clone())
        .ok_or_else(missing)
}
