//! The engine's only I/O: a probe of one proxy, and the exit check through it. Tests replace it.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::exit::EchoError;
use crate::probe::{ProbeError, ProbeOutcome, ProbeRequest, ProbeTls};

/// Probes one proxy. A probe, and an exit check, must end within `req.timeout`: the engine does
/// not cut them off.
pub trait Prober: Send + Sync + 'static {
    fn probe(&self, req: Arc<ProbeRequest>) -> impl Future<Output = ProbeOutcome> + Send;

    /// The proxy's exit: `req.url` is the echo URL ([`crate::exit::exit_through`]). A prober
    /// that cannot tell answers Unknown, which is what this default does.
    fn exit(&self, req: Arc<ProbeRequest>) -> impl Future<Output = Result<IpAddr, EchoError>> + Send {
        drop(req);
        std::future::ready(Err(EchoError::Fetch(ProbeError::BadUrl(
            "this prober has no exit check".into(),
        ))))
    }
}

/// The real probe ([`crate::probe::probe`]) and exit check, with TLS settings that can be
/// replaced while probes run (a CA file rotated): each probe uses the settings in force when it
/// starts. Clones share the settings, so a clone kept outside the engine replaces them for it.
#[derive(Debug, Clone)]
pub struct ConnectProber {
    tls: Arc<RwLock<ProbeTls>>,
}

impl ConnectProber {
    #[must_use]
    pub fn new(tls: ProbeTls) -> Self {
        Self {
            tls: Arc::new(RwLock::new(tls)),
        }
    }

    /// Probes that start from now on use `tls`; those running end with what they began with.
    pub fn use_tls(&self, tls: ProbeTls) {
        *self.tls.write().unwrap_or_else(std::sync::PoisonError::into_inner) = tls;
    }

    fn tls(&self) -> ProbeTls {
        self.tls
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Fetches `url` with no proxy ([`crate::probe::fetch_directly`]), trusting what probes
    /// trust now.
    pub async fn fetch_directly(&self, url: &str, expected_status: u16, timeout: Duration) -> ProbeOutcome {
        crate::probe::fetch_directly(url, expected_status, timeout, &self.tls()).await
    }

    /// This process's own exit ([`crate::exit::own_exit`]), trusting what probes trust now.
    ///
    /// # Errors
    /// As [`crate::exit::own_exit`].
    pub async fn own_exit(&self, url: &str, timeout: Duration) -> Result<IpAddr, EchoError> {
        crate::exit::own_exit(url, timeout, &self.tls()).await
    }
}

impl Prober for ConnectProber {
    fn probe(&self, req: Arc<ProbeRequest>) -> impl Future<Output = ProbeOutcome> + Send {
        let tls = self.tls();
        async move { crate::probe::probe(&req, &tls).await }
    }

    fn exit(&self, req: Arc<ProbeRequest>) -> impl Future<Output = Result<IpAddr, EchoError>> + Send {
        let tls = self.tls();
        async move { crate::exit::exit_through(&req, &tls).await }
    }
}
