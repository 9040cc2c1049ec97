//! TLS on the discovery API, so tokens and lease answers (proxy passwords) never cross the
//! network in clear. Three ways, by the flags:
//!
//! - `--discovery-tls-cert-file` and `--discovery-tls-key-file` (a cert-manager Certificate's
//!   Secret, say): served, and followed, so a renewal is in force for the next connection.
//! - neither, with `--discovery-tls=auto` (the default): the certificate of the Secret
//!   `discovery-tls` in the manager's namespace, made at first start (a CA and a server
//!   certificate for the install's Service names), so a fresh cluster serves TLS as applied.
//!   Until the Secret is read the API serves a certificate made in memory that no client
//!   trusts, and so answers no one, as it refuses everyone until it has a token.
//! - `--discovery-tls=off`: plain HTTP, logged as a warning (a network nobody else reaches, or
//!   a service mesh that adds TLS).

use std::time::Duration;

use egress_controller::tls_secret::{self, Certified, CertifiedOrigin, SECRET_NAME, TlsSecretError};
use egress_http::tls_files::{self, CurrentTls, TlsFiles};
use egress_runtime::Fatal;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::flags::{DiscoveryTls, Options};

const FAILED: &str = "Failed to set up TLS on the discovery API";
/// One attempt at the Secret, and the longest pause between attempts.
const SECRET_CALL_BUDGET: Duration = Duration::from_secs(10);
const SECRET_RETRY_MAX: Duration = Duration::from_secs(30);

/// The TLS the discovery API serves with (`None`: plain HTTP), with the task that keeps it
/// current spawned on `tasks`.
///
/// # Errors
/// Files that cannot be used, or only one of the two flags.
pub(crate) fn start(
    options: &Options,
    client: &kube::Client,
    namespace: &str,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<Option<CurrentTls>, Fatal> {
    let (cert, key) = (&options.discovery_tls_cert_file, &options.discovery_tls_key_file);
    if options.discovery_tls == DiscoveryTls::Off {
        if !cert.is_empty() || !key.is_empty() {
            return Err(Fatal::new(
                FAILED,
                "--discovery-tls=off with certificate files: choose one",
            ));
        }
        tracing::warn!(
            "--discovery-tls=off: the discovery API serves plain HTTP; tokens and proxy passwords cross the network in clear"
        );
        return Ok(None);
    }
    match (cert.is_empty(), key.is_empty()) {
        (false, false) => {
            let files = TlsFiles {
                cert: cert.into(),
                key: key.into(),
            };
            let (current, follower) = tls_files::load(files).map_err(|e| Fatal::new(FAILED, e))?;
            let follower = egress_runtime::files::Follower::new(follower);
            tasks.spawn(follower.run(crate::followed::FILE_POLL, shutdown.clone()));
            tracing::info!(certificate = %cert, "Discovery API over TLS, from the certificate files");
            Ok(Some(current))
        }
        (true, true) => {
            let names = service_names(&options.discovery_tls_service, namespace);
            let made = make_certificate(&names).map_err(|e| Fatal::new(FAILED, e))?;
            // In force until the Secret's is: a key nobody else has, a CA nobody trusts.
            let current = CurrentTls::from(
                tls_files::acceptor(made.cert_pem.as_bytes(), made.key_pem.as_bytes())
                    .map_err(|e| Fatal::new(FAILED, e))?,
            );
            let secrets = kube::Api::namespaced(client.clone(), namespace);
            tasks.spawn(keep_secret_certificate(
                secrets,
                made,
                current.clone(),
                shutdown.clone(),
            ));
            Ok(Some(current))
        }
        _ => Err(Fatal::new(
            FAILED,
            "--discovery-tls-cert-file and --discovery-tls-key-file go together",
        )),
    }
}

/// The names the made certificate holds: the Service's in each form a client may use, and
/// `localhost` and 127.0.0.1 (a `kubectl port-forward`).
pub(crate) fn service_names(service: &str, namespace: &str) -> Vec<String> {
    let mut names = vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    names.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]);
    names
}

/// A new CA and a server certificate it signed for `names` (DNS names or IP addresses), valid
/// as long as rcgen makes them by default (until 4096): they are not renewed. Delete the Secret
/// and restart to make others, or give files, which are followed.
///
/// # Errors
/// The key or a certificate could not be made (a name that is neither).
pub(crate) fn make_certificate(names: &[String]) -> Result<Certified, String> {
    let fail = |e: rcgen::Error| format!("making the discovery API's certificate: {e}");
    let ca_key = rcgen::KeyPair::generate().map_err(fail)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    // What strict verifiers (Python 3.13's default context, say) ask of a CA and a server
    // certificate: key usages, and the authority key identifier linking the two.
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "egress-proxies discovery CA");
    let ca = ca_params.self_signed(&ca_key).map_err(fail)?;
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let key = rcgen::KeyPair::generate().map_err(fail)?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(fail)?;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer).map_err(fail)?;
    Ok(Certified {
        cert_pem: pem("CERTIFICATE", cert.der()),
        key_pem: pem("PRIVATE KEY", &key.serialize_der()),
        ca_pem: pem("CERTIFICATE", ca.der()),
    })
}

/// `der` as a PEM block labelled `label`.
fn pem(label: &str, der: &[u8]) -> String {
    let b64 = data_encoding::BASE64.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
}

/// Reads or makes the Secret's certificate until it has one (or shutdown), and puts it in
/// force.
async fn keep_secret_certificate(
    secrets: kube::Api<k8s_openapi::api::core::v1::Secret>,
    made: Certified,
    current: CurrentTls,
    shutdown: CancellationToken,
) {
    let mut pause = Duration::from_secs(1);
    loop {
        let attempt = tokio::time::timeout(SECRET_CALL_BUDGET, tls_secret::ensure(&secrets, made.clone()))
            .instrument(tracing::info_span!("discovery.tls"));
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            o = attempt => o,
        };
        let problem = match outcome {
            Ok(Ok(origin)) => match in_force(&origin, &current) {
                Ok(()) => return,
                Err(e) => e,
            },
            Ok(Err(e @ TlsSecretError::Unusable)) => {
                pause = SECRET_RETRY_MAX;
                e.to_string()
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("the API server did not answer about the Secret within {SECRET_CALL_BUDGET:?}"),
        };
        tracing::warn!(problem = %problem, "no discovery API certificate yet: clients cannot verify the API until there is");
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(SECRET_RETRY_MAX);
    }
}

/// Puts the Secret's certificate in force, and says where clients get its CA.
fn in_force(origin: &CertifiedOrigin, current: &CurrentTls) -> Result<(), String> {
    let certified = origin.certified();
    let acceptor = tls_files::acceptor(certified.cert_pem.as_bytes(), certified.key_pem.as_bytes())
        .map_err(|e| format!("Secret {SECRET_NAME}: {e}"))?;
    current.replace(acceptor);
    let read = format!("kubectl get secret {SECRET_NAME} -o jsonpath='{{.data.ca\\.crt}}' | base64 -d > ca.pem");
    match origin {
        CertifiedOrigin::Created(_) => tracing::warn!(
            secret = SECRET_NAME,
            ca_for_clients = %read,
            "No discovery API certificate was configured: made a CA and a certificate and stored them in a Secret; clients trust its ca.crt"
        ),
        CertifiedOrigin::Existing(_) => {
            tracing::info!(secret = SECRET_NAME, ca_for_clients = %read, "Discovery API over TLS, with the certificate of the Secret");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_made_certificate_serves_the_service_names_and_chains_to_its_ca() {
        let names = service_names("discovery", "egress");
        assert!(names.contains(&"discovery.egress.svc".to_owned()));
        let made = make_certificate(&names).unwrap();
        assert!(tls_files::acceptor(made.cert_pem.as_bytes(), made.key_pem.as_bytes()).is_ok());
        assert_ne!(made.ca_pem, made.cert_pem);
        assert!(!format!("{made:?}").contains("PRIVATE"), "the key never shows");
    }
}
