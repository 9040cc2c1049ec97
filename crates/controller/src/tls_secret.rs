//! The discovery API's certificate when the operator was given none: it makes a CA and a
//! server certificate and keeps them in the Secret `discovery-tls` of its own namespace
//! (`kubernetes.io/tls`: `tls.crt`, `tls.key`, and `ca.crt`, which crawlers and the gateway
//! trust), so an install serves TLS as applied and every replica serves the same certificate. An
//! existing Secret is used, never overwritten; it is read at start only (a Secret that changes,
//! such as a cert-manager Certificate's, is served from files: `deploy/cert-manager`); two
//! replicas starting together agree (the loser of the create reads the winner's).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};

/// The Secret's name (the gateway mounts its `ca.crt`).
pub const SECRET_NAME: &str = "discovery-tls";
/// Its keys, as a `kubernetes.io/tls` Secret (and cert-manager) has them.
pub const CERT_KEY: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";
pub const CA_KEY: &str = "ca.crt";

/// A certificate (its chain), its private key and the CA that signed it, as PEM text. Its
/// `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Certified {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

impl std::fmt::Debug for Certified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certified").finish_non_exhaustive()
    }
}

/// Where the certificate came from.
#[derive(Debug)]
pub enum CertifiedOrigin {
    /// The Secret was there already (made by a person, cert-manager or another replica).
    Existing(Certified),
    /// This call made it.
    Created(Certified),
}

impl CertifiedOrigin {
    pub fn certified(&self) -> &Certified {
        match self {
            Self::Existing(c) | Self::Created(c) => c,
        }
    }
}

/// Why no certificate could be had; messages never hold a key.
#[derive(Debug, thiserror::Error)]
pub enum TlsSecretError {
    /// The API server did not answer or refused (retry later).
    #[error("reading or creating Secret {SECRET_NAME}: {0}")]
    Api(String),
    /// The Secret exists without `tls.crt` and `tls.key`: a person's Secret, left as it is.
    #[error("Secret {SECRET_NAME} exists but lacks {CERT_KEY} or {KEY_KEY}: fix or delete it")]
    Unusable,
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let raw = secret.data.as_ref()?.get(key)?.0.clone();
    String::from_utf8(raw).ok()
}

fn certified_of(secret: &Secret) -> Result<Certified, TlsSecretError> {
    let (Some(cert_pem), Some(key_pem)) = (text(secret, CERT_KEY), text(secret, KEY_KEY)) else {
        return Err(TlsSecretError::Unusable);
    };
    Ok(Certified {
        cert_pem,
        key_pem,
        ca_pem: text(secret, CA_KEY).unwrap_or_default(),
    })
}

fn api_error(e: &kube::Error) -> TlsSecretError {
    TlsSecretError::Api(e.to_string())
}

/// The certificate of the Secret in `secrets`' namespace, made (as `made`) when there is none.
///
/// # Errors
/// The API failed, or the Secret exists without a certificate and key.
pub async fn ensure(secrets: &Api<Secret>, made: Certified) -> Result<CertifiedOrigin, TlsSecretError> {
    if let Some(existing) = secrets.get_opt(SECRET_NAME).await.map_err(|e| api_error(&e))? {
        return certified_of(&existing).map(CertifiedOrigin::Existing);
    }
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET_NAME.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    egress_api::MANAGED_BY.to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                (CERT_KEY.to_owned(), bytes(&made.cert_pem)),
                (KEY_KEY.to_owned(), bytes(&made.key_pem)),
                (CA_KEY.to_owned(), bytes(&made.ca_pem)),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(CertifiedOrigin::Created(made)),
        // Another replica made it first: its certificate is the one.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let winner = secrets.get(SECRET_NAME).await.map_err(|e| api_error(&e))?;
            certified_of(&winner).map(CertifiedOrigin::Existing)
        }
        Err(e) => Err(api_error(&e)),
    }
}
