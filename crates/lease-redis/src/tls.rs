//! What the store is given to reach a Redis over TLS (`rediss://`, `rediss+cluster://`): the CA
//! certificates the server's certificate must chain to, and the certificate the store shows the
//! server when it asks for one (mutual TLS). Checked when they are made, so a broken file stops
//! the start with a clear error (or, given to a running store with `RedisStore::use_tls`, is
//! refused while the connection in use stays); the server's certificate is always checked.

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::TLS_CLUSTER_SCHEME;

/// How the store reaches a Redis over TLS.
#[derive(Clone, Debug, Default)]
pub struct Tls {
    /// What the server's certificate must chain to.
    pub roots: TlsRoots,
    /// The certificate the store shows a server that asks for one (`tls-auth-clients yes`,
    /// Redis's default once TLS is on).
    pub client: Option<ClientIdentity>,
}

/// What the certificate of a Redis reached over TLS must chain to. It is always checked, names
/// included.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum TlsRoots {
    /// The system's CA certificates.
    #[default]
    System,
    /// These CA certificates only (PEM), such as a managed Redis's own CA.
    Only(Vec<u8>),
}

impl TlsRoots {
    /// The CA certificates of the PEM text `pem`, and no others.
    ///
    /// # Errors
    /// `pem` holds no certificate, or one that is not a usable CA certificate.
    pub fn only(pem: &[u8]) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        for (i, cert) in CertificateDer::pem_slice_iter(pem).enumerate() {
            let cert = cert.map_err(|e| format!("certificate {}: not PEM: {e}", i + 1))?;
            roots
                .add(cert)
                .map_err(|e| format!("certificate {}: not a CA certificate: {e}", i + 1))?;
        }
        if roots.is_empty() {
            return Err("no certificate in it".to_owned());
        }
        Ok(Self::Only(pem.to_vec()))
    }
}

impl std::fmt::Debug for TlsRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::System => f.write_str("System"),
            Self::Only(pem) => write!(f, "Only({} bytes of PEM)", pem.len()),
        }
    }
}

/// A client certificate (with its chain) and its private key, as PEM. The key is a secret: no
/// error and no `Debug` output shows any of it.
#[derive(Clone)]
pub struct ClientIdentity {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl ClientIdentity {
    /// The certificate chain of `cert_pem` (the client's own first) with the key of `key_pem`.
    ///
    /// # Errors
    /// No certificate, a certificate that is not PEM, no readable private key, or a key that
    /// is not the certificate's; the error names which, never their contents.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, String> {
        let mut chain = Vec::new();
        for (i, cert) in CertificateDer::pem_slice_iter(cert_pem).enumerate() {
            // The parser's message is about the framing, never the text.
            chain.push(cert.map_err(|e| format!("certificate {}: not PEM: {e}", i + 1))?);
        }
        if chain.is_empty() {
            return Err("no certificate in the client certificate file".to_owned());
        }
        let Ok(key) = PrivateKeyDer::from_pem_slice(key_pem) else {
            return Err("no private key (PKCS#8, PKCS#1 or SEC1 PEM) in the client key file".to_owned());
        };
        // What the connection will do with them, now: load the key and match it to the
        // certificate, so a wrong pair stops the start instead of failing every call.
        rustls::sign::CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
            .map_err(|e| format!("the client key does not fit the client certificate: {e}"))?;
        Ok(Self {
            cert_pem: cert_pem.to_vec(),
            key_pem: key_pem.to_vec(),
        })
    }
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientIdentity(<redacted>)")
    }
}

/// What the client library is given for `url` (`None`: no TLS, or TLS with the system's CA
/// certificates and no client certificate). Refuses what would weaken or ignore the check: a
/// URL fragment (the client library's `#insecure` turns it off), and certificates for a plain
/// URL, which would never be used.
pub(crate) fn certificates(url: &str, tls: &Tls) -> Result<Option<TlsCertificates>, String> {
    // Any '#' starts the fragment for the client library's URL parser, one in a password too.
    if url.contains('#') {
        return Err(
            "a URL fragment (such as #insecure) is not accepted: a TLS server's certificate is always checked \
             (a '#' in a password is written %23)"
                .to_owned(),
        );
    }
    let over_tls = url.starts_with("rediss://") || url.starts_with(TLS_CLUSTER_SCHEME);
    let root_cert = match &tls.roots {
        TlsRoots::System => None,
        TlsRoots::Only(pem) => Some(pem.clone()),
    };
    let client_tls = tls.client.as_ref().map(|c| ClientTlsConfig {
        client_cert: c.cert_pem.clone(),
        client_key: c.key_pem.clone(),
    });
    match (root_cert, client_tls) {
        (None, None) => Ok(None),
        _ if !over_tls => Err(
            "CA certificates or a client certificate are given for a Redis reached without TLS (use rediss:// \
             or rediss+cluster://)"
                .to_owned(),
        ),
        (root_cert, client_tls) => Ok(Some(TlsCertificates { client_tls, root_cert })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::Connection;

    #[test]
    fn ca_certificates_are_checked_when_given() {
        for (pem, why) in [
            (&b""[..], "no certificate"),
            (b"not a certificate\n", "no certificate"),
            (
                b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
                "certificate 1: not a CA certificate",
            ),
        ] {
            let e = TlsRoots::only(pem).expect_err(why);
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn a_client_identity_needs_a_certificate_and_a_key_and_never_shows_the_key() {
        let sentinel = "client-key-sentinel";
        let not_a_key = format!("-----BEGIN PRIVATE KEY-----\n{sentinel}\n-----END PRIVATE KEY-----\n");
        for (cert, key, why) in [
            ("", not_a_key.as_str(), "no certificate"),
            (CA_PEM, not_a_key.as_str(), "no private key"),
            (CA_PEM, sentinel, "no private key"),
        ] {
            let e = ClientIdentity::from_pem(cert.as_bytes(), key.as_bytes()).expect_err(why);
            assert!(e.contains(why) && !e.contains(sentinel), "{e}");
        }
        let redacted = format!(
            "{:?}",
            Tls {
                roots: TlsRoots::System,
                client: Some(ClientIdentity {
                    cert_pem: CA_PEM.as_bytes().to_vec(),
                    key_pem: sentinel.as_bytes().to_vec(),
                }),
            }
        );
        assert!(
            !redacted.contains(sentinel) && redacted.contains("redacted"),
            "{redacted}"
        );
    }

    #[tokio::test]
    async fn tls_urls_open_and_nothing_turns_the_check_off() {
        let ca = Tls {
            roots: TlsRoots::only(CA_PEM.as_bytes()).expect("a CA certificate"),
            client: None,
        };
        let system = Tls::default();
        for url in ["rediss://127.0.0.1:1", "rediss+cluster://127.0.0.1:1,127.0.0.1:2"] {
            for tls in [&system, &ca] {
                let opened = Connection::open(url, tls);
                assert!(opened.is_ok(), "{url}: {:?}", opened.err());
            }
        }
        // The client library's switch that accepts any certificate, and CA certificates that
        // a plain connection would never use: refused, naming neither URL nor password.
        for (url, tls) in [
            ("rediss://:s3cret@127.0.0.1:1/#insecure", &system),
            ("rediss+cluster://:s3cret@127.0.0.1:1#insecure", &ca),
            ("redis://:s3cret@127.0.0.1:1", &ca),
            ("redis+cluster://:s3cret@127.0.0.1:1", &ca),
        ] {
            let Err(e) = Connection::open(url, tls) else {
                panic!("{url} opened");
            };
            assert!(!e.contains("s3cret") && !e.contains("127.0.0.1"), "{e}");
        }
        // A '#' in a password is written as the client library reads it.
        assert!(Connection::open("rediss://:pa%23ss@127.0.0.1:1", &system).is_ok());
    }

    /// A CA certificate, made once with `openssl req -x509` for these tests (no server here
    /// holds a certificate it signed).
    const CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBkzCCATmgAwIBAgIUD+88Ptbrr+T0qVAdoYrXCzeAZqwwCgYIKoZIzj0EAwIw
HjEcMBoGA1UEAwwTZWdyZXNzIHVuaXQtdGVzdCBDQTAgFw0yNjEyMDUwMzQzNTJa
GA8yMTI2MTExMTAzNDM1MlowHjEcMBoGA1UEAwwTZWdyZXNzIHVuaXQtdGVzdCBD
QTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABL9v0aH5wxP/tGHLntFDJG11rU3W
5/ZfbY/fSPy2hie2hBhvx4jvqWfosaVimkNBx2W4oqzZar3YEhSJDJJW6kajUzBR
MB0GA1UdDgQWBBTQ6Kacz8wFz7IeA6JmxZs26BbNezAfBgNVHSMEGDAWgBTQ6Kac
z8wFz7IeA6JmxZs26BbNezAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gA
MEUCIC+0/EJetQEBnXgpQ0cHynS6NwYCTmP8wMBUr8+DjlcUAiEAlStoa+0sn+gW
UTUlS5sMx7znXvbCSp+cEfSm/qzW/Nk=
-----END CERTIFICATE-----
";
}
