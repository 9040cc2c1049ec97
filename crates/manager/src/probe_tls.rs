//! The health probes' TLS roots: the system's, and with `--health-check-ca-file` that file's
//! CA certificates too (a private target's CA). The file is read at start, where a problem
//! stops the start, then followed (`followed.rs`) by the leader's engine, so a rotated CA
//! reaches the probes without a restart.

use egress_health::{ConnectProber, ProbeTls};

use crate::followed::{Followed, Unusable, read_pem_file};
use egress_runtime::Fatal;

const FLAG: &str = "--health-check-ca-file";

/// The probes' roots as read at start.
pub(crate) struct ProbeRoots {
    tls: ProbeTls,
    /// The CA file and what it held.
    ca: Option<(String, Vec<u8>)>,
}

/// The system's roots, and those of `file` when it is not empty.
pub(crate) fn load(file: &str) -> Result<ProbeRoots, Fatal> {
    let failed = |e| Fatal::new("Failed to load the health probes' CA roots", e);
    if file.is_empty() {
        return Ok(ProbeRoots {
            tls: ProbeTls::system().map_err(failed)?,
            ca: None,
        });
    }
    let pem = read_pem_file(file).map_err(|e| failed(format!("{file}: {e}")))?;
    let tls = ProbeTls::system_and_pem(&pem).map_err(|e| failed(format!("{file}: {e}")))?;
    Ok(ProbeRoots {
        tls,
        ca: Some((file.to_owned(), pem)),
    })
}

impl ProbeRoots {
    /// The engine's prober, and with a CA file what follows it.
    pub(crate) fn prober(self) -> (ConnectProber, Option<CaFollower>) {
        let prober = ConnectProber::new(self.tls);
        let follower = self.ca.map(|(path, applied)| CaFollower {
            path,
            applied,
            prober: prober.clone(),
        });
        (prober, follower)
    }
}

/// Re-reads the CA file and hands the prober what changed.
pub(crate) struct CaFollower {
    path: String,
    /// What the probes' roots were made with.
    applied: Vec<u8>,
    prober: ConnectProber,
}

impl Followed for CaFollower {
    const CHANGED: &'static str = "Health check CA file changed; new probes use it";
    const UNUSABLE: &'static str = "Health check CA file cannot be used; the CA certificates in use stay";

    fn check(&mut self) -> Result<bool, Unusable> {
        let unusable = |why| Unusable {
            flag: FLAG,
            path: self.path.clone(),
            why,
        };
        let pem = read_pem_file(&self.path).map_err(unusable)?;
        if pem == self.applied {
            return Ok(false);
        }
        self.prober.use_tls(ProbeTls::system_and_pem(&pem).map_err(unusable)?);
        self.applied = pem;
        Ok(true)
    }

    fn files(&self) -> String {
        self.path.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_testkit::secret_volume::Volume;

    #[test]
    fn a_changed_ca_file_reaches_the_prober_and_an_unusable_one_changes_nothing() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (pki, other) = (egress_testkit::pki(), egress_testkit::pki());
        let mut volume = Volume::with_keys("probe-ca", &[("ca.pem", &pki.ca_pem)]);
        let path = volume.file("ca.pem").display().to_string();
        let (_prober, follower) = load(&path).unwrap_or_else(|e| panic!("{:?}", e.error)).prober();
        let mut follower = follower.expect("a CA file to follow");
        assert_eq!(follower.check(), Ok(false), "nothing changed");
        volume.update_keys(&[("ca.pem", &other.ca_pem)]);
        assert_eq!(follower.check(), Ok(true));
        assert_eq!(follower.check(), Ok(false));
        volume.update_keys(&[("ca.pem", "not a certificate\n")]);
        let garbage = follower.check().expect_err("no CA in it");
        assert_eq!((garbage.flag, garbage.path.as_str()), (FLAG, path.as_str()));
        assert!(garbage.why.contains("no certificate"), "{garbage:?}");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(follower.check().expect_err("no file").flag, FLAG);
        volume.update_keys(&[("ca.pem", &other.ca_pem)]);
        assert_eq!(follower.check(), Ok(false), "back to what the probes have");
        assert!(
            load("")
                .unwrap_or_else(|e| panic!("{:?}", e.error))
                .prober()
                .1
                .is_none()
        );
    }
}
