//! Where the reconciler reads what the exit checks found: the health engine's snapshot (each
//! Proxy's last finding, and who shares each address), the operator's own exit, and the GeoIP
//! databases; judged by [`crate::proxy::exit::judge`] into the `ExitVerified` condition and
//! `status.exit`.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use egress_api::{ExitStatus, Proxy};
use egress_geoip::GeoIp;
use egress_health::{ExitSeen, Snapshot};

use crate::proxy::credentials::Lookup;
use crate::proxy::exit::{ExitFacts, ExitVerdict, judge};

/// What the reconciler learns about a Proxy's exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitFinding {
    /// No exit checks run (no echo URL): the condition and `status.exit` go.
    Off,
    /// None has finished for this Proxy at its address yet (a new leader, a new address):
    /// what the status records stays.
    NotYet,
    /// The verdict, and the exit when one is known.
    Found {
        verdict: ExitVerdict,
        exit: Option<Box<ExitStatus>>,
    },
}

/// Where exit findings come from; tests replace it.
pub trait ExitFindings: Send + Sync + 'static {
    fn finding(&self, proxy: &Proxy) -> ExitFinding;
}

/// Exit checks off.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoExitChecks;

impl ExitFindings for NoExitChecks {
    fn finding(&self, _: &Proxy) -> ExitFinding {
        ExitFinding::Off
    }
}

/// The operator's own exit, as its last direct fetch of the echo URL found it. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct OwnExit(Arc<RwLock<Option<IpAddr>>>);

impl OwnExit {
    pub fn get(&self) -> Option<IpAddr> {
        *self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records what the last fetch found (`None`: it failed, and the last address is kept).
    pub fn set(&self, found: Option<IpAddr>) {
        if let Some(ip) = found {
            *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(ip);
        }
    }
}

/// The engine's findings, judged.
#[derive(Debug, Clone)]
pub struct EngineExits {
    pub snapshot: Snapshot,
    pub own: OwnExit,
    pub geoip: GeoIp,
}

impl ExitFindings for EngineExits {
    fn finding(&self, proxy: &Proxy) -> ExitFinding {
        let Some(seen) =
            crate::proxy::health::view(proxy, "", Lookup::NotNeeded).and_then(|v| self.snapshot.exit_for(&v))
        else {
            return ExitFinding::NotYet;
        };
        let expected = proxy.spec.exit.as_ref().map_or(&[][..], |e| e.countries.as_slice());
        let own = self.own.get();
        match seen {
            ExitSeen::Unknown { why } => ExitFinding::Found {
                verdict: judge(&ExitFacts {
                    seen: Err(&why),
                    sharing: 0,
                    own,
                    country: None,
                    expected,
                }),
                exit: None,
            },
            ExitSeen::Address { ip, since } => {
                let geo = self.geoip.lookup(ip);
                let verdict = judge(&ExitFacts {
                    seen: Ok(ip),
                    sharing: self.snapshot.sharing(ip),
                    own,
                    country: geo.country.as_deref(),
                    expected,
                });
                let observed_at = k8s_openapi::jiff::Timestamp::try_from(since)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                ExitFinding::Found {
                    verdict,
                    exit: Some(Box::new(ExitStatus {
                        address: ip.to_string(),
                        observed_at,
                        country: geo.country,
                        asn: geo.asn,
                        organization: geo.organization,
                    })),
                }
            }
        }
    }
}
