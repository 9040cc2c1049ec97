//! A server's certificate and key from PEM files (a `kubernetes.io/tls` Secret's `tls.crt` and
//! `tls.key`), followed with the one file follower ([`egress_files::Follower`]): a renewed
//! certificate is in force for the next connection, without a restart; files that cannot be
//! used leave the certificate in force, and say why once. The gateway's TLS front and the
//! discovery API serve with it; [`CurrentTls::fixed`] holds a certificate made in memory.
//!
//! The key is a secret: no error, log line or `Debug` output shows any of it.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// The most a certificate or key file may hold.
const MAX_PEM_FILE: u64 = 1024 * 1024;

/// The certificate (with its chain) and key files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The acceptor in force; the follower replaces it.
#[derive(Clone)]
pub struct CurrentTls(Arc<RwLock<TlsAcceptor>>);

impl From<TlsAcceptor> for CurrentTls {
    fn from(acceptor: TlsAcceptor) -> Self {
        Self(Arc::new(RwLock::new(acceptor)))
    }
}

impl std::fmt::Debug for CurrentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CurrentTls(..)")
    }
}

impl CurrentTls {
    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Puts `acceptor` in force for the next connection.
    pub fn replace(&self, acceptor: TlsAcceptor) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = acceptor;
    }
}

/// Why the files cannot be used: which file, and what is wrong, never their contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(pub String);

/// Reads both files.
fn read(files: &TlsFiles) -> Result<(Vec<u8>, Vec<u8>), Unusable> {
    let one = |path: &PathBuf, what: &str| {
        egress_files::read_regular_file(path, MAX_PEM_FILE)
            .map_err(|e| Unusable(format!("the TLS {what} file {}: {}", path.display(), e.problem)))
    };
    Ok((one(&files.cert, "certificate")?, one(&files.key, "key")?))
}

/// An acceptor for the certificate chain in `cert_pem` and the key in `key_pem` (HTTP/1.1 by
/// ALPN: the servers that use it speak HTTP/1).
///
/// # Errors
/// No certificate, no key, or a key that is not the certificate's.
pub fn acceptor(cert_pem: &[u8], key_pem: &[u8]) -> Result<TlsAcceptor, Unusable> {
    let mut chain = Vec::new();
    for (i, cert) in CertificateDer::pem_slice_iter(cert_pem).enumerate() {
        chain.push(cert.map_err(|e| Unusable(format!("certificate {}: not PEM: {e}", i + 1)))?);
    }
    if chain.is_empty() {
        return Err(Unusable("no certificate in the TLS certificate file".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| Unusable("no private key (PKCS#8, PKCS#1 or SEC1 PEM) in the TLS key file".into()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| Unusable(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| Unusable(format!("the TLS key does not fit the certificate: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The files read and put in force at start, and what follows them (for
/// [`egress_files::Follower`]).
///
/// # Errors
/// [`Unusable`]: a server does not start without a certificate it can serve.
pub fn load(files: TlsFiles) -> Result<(CurrentTls, TlsFollower), Unusable> {
    let (cert, key) = read(&files)?;
    let current = CurrentTls(Arc::new(RwLock::new(acceptor(&cert, &key)?)));
    let follower = TlsFollower {
        files,
        current: current.clone(),
        applied: (cert, key),
    };
    Ok((current, follower))
}

/// Re-reads the files and puts a changed certificate in force.
pub struct TlsFollower {
    files: TlsFiles,
    current: CurrentTls,
    /// The bytes in force.
    applied: (Vec<u8>, Vec<u8>),
}

impl std::fmt::Debug for TlsFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key's bytes are never shown.
        f.debug_struct("TlsFollower")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl egress_files::Followed for TlsFollower {
    type Change = ();
    type Problem = Unusable;

    /// A Secret volume swaps both files at once; files changed one by one may show a new
    /// certificate with the old key for a round, which the next round finds whole.
    fn check(&mut self) -> Result<Option<()>, Unusable> {
        let read = read(&self.files)?;
        if read == self.applied {
            return Ok(None);
        }
        self.current.replace(acceptor(&read.0, &read.1)?);
        self.applied = read;
        Ok(Some(()))
    }

    fn changed(&self, (): &()) {
        tracing::info!(certificate = %self.files.cert.display(), "TLS files changed; new connections use them");
    }

    fn unusable(&self, problem: &Unusable) {
        tracing::warn!(problem = %problem, "TLS files cannot be used; the certificate in force stays");
    }
}

#[cfg(test)]
mod tests {
    use egress_files::Followed as _;

    use super::*;

    fn write(dir: &std::path::Path, pki: &egress_testkit::Pki) -> TlsFiles {
        let files = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&files.cert, &pki.server_cert_pem).unwrap();
        std::fs::write(&files.key, &pki.server_key_pem).unwrap();
        files
    }

    #[test]
    fn a_changed_certificate_is_put_in_force_and_a_broken_one_is_not() {
        let dir = egress_testkit::ScratchDir::new("http-tls-files");
        let (first, second) = (egress_testkit::pki(), egress_testkit::pki());
        let files = write(dir.path(), &first);
        let (current, mut follower) = load(files.clone()).unwrap();
        let before = current.acceptor();
        assert_eq!(follower.check(), Ok(None), "unchanged");
        write(dir.path(), &second);
        assert_eq!(follower.check(), Ok(Some(())));
        assert!(!Arc::ptr_eq(before.config(), current.acceptor().config()));
        let in_force = current.acceptor();
        std::fs::write(&files.key, "not a key").unwrap();
        let problem = follower.check().unwrap_err();
        assert!(problem.0.contains("no private key"), "{problem}");
        assert!(!problem.0.contains("not a key"), "the file's contents are never shown");
        assert!(
            Arc::ptr_eq(in_force.config(), current.acceptor().config()),
            "what is in force stays"
        );
        std::fs::remove_file(&files.cert).unwrap();
        assert!(follower.check().is_err());
        assert!(load(files).is_err(), "no start without a certificate");
    }
}
