//! A test certificate authority and a server certificate it signed, for TLS targets.

use std::sync::Arc;

/// A test CA and a target certificate for `localhost` and 127.0.0.1.
#[derive(Debug)]
pub struct Pki {
    pub ca_der: rustls::pki_types::CertificateDer<'static>,
    /// The CA certificate as a PEM file's text.
    pub ca_pem: String,
    pub server: Arc<rustls::ServerConfig>,
    /// The target certificate and its key as PEM files' text, for servers configured by file
    /// (such as redis-server).
    pub server_cert_pem: String,
    pub server_key_pem: String,
    /// A client certificate the CA signed and its key, as PEM files' text (mutual TLS).
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

/// [`pki_for`] `localhost` and 127.0.0.1.
pub fn pki() -> Pki {
    pki_for(&["localhost", "127.0.0.1"])
}

/// A test CA and a target certificate for `names` (DNS names or IP addresses).
pub fn pki_for(names: &[&str]) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // As strict verifiers (Python 3.13's default context) ask: key usages, and the authority
    // key identifier on what the CA signs.
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "egress test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut leaf_params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_string()).collect::<Vec<_>>()).unwrap();
    leaf_params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    // Client too: redis-server nodes show their server certificate to each other.
    leaf_params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf_params.use_authority_key_identifier_extension = true;
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let client_key = rcgen::KeyPair::generate().unwrap();
    let mut client_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "egress test client");
    let client = client_params.signed_by(&client_key, &issuer).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    Pki {
        ca_der: ca.der().clone(),
        ca_pem: pem("CERTIFICATE", ca.der()),
        server: Arc::new(server),
        server_cert_pem: pem("CERTIFICATE", leaf.der()),
        server_key_pem: pem("PRIVATE KEY", &leaf_key.serialize_der()),
        client_cert_pem: pem("CERTIFICATE", client.der()),
        client_key_pem: pem("PRIVATE KEY", &client_key.serialize_der()),
    }
}

/// `der` as a PEM block labelled `label`.
fn pem(label: &str, der: &[u8]) -> String {
    let b64 = data_encoding::BASE64.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
}

impl Pki {
    /// A root store that trusts this CA only.
    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        roots
    }
}
