//! A client's tunnel, whichever front it came in by: a lease for the destination's host, the
//! tunnel through the lease's proxy, and one more lease when that proxy failed and another may
//! do better. A proxy that fails first is reported for the host and given back.

use egress_discovery::client::ReportResult;

use crate::Gateway;
use crate::auth::ClientAuth;
use crate::chain::{self, ChainError, Tunnel};
use crate::leases::{Held, LeaseError};
use crate::username::Routing;

/// Why a client got no tunnel.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No lease: the API's answer.
    Lease(LeaseError),
    /// No backend opened it (the last one's error).
    Chain(Option<ChainError>),
}

impl Gateway {
    /// A lease and a tunnel through its proxy to `authority`, for `host`.
    pub(crate) async fn establish(
        &self,
        client: &ClientAuth,
        routing: &Routing,
        authority: &str,
        host: &str,
    ) -> Result<(Held, Tunnel), Failure> {
        let mut failed = None;
        for _ in 0..2 {
            let held = self
                .leases
                .acquire(client.token(), routing, host)
                .await
                .map_err(Failure::Lease)?;
            match chain::tunnel(&held.backend, authority, self.settings.chain).await {
                Ok(tunnel) => return Ok((held, tunnel)),
                Err(e) => {
                    self.leases
                        .report(client.token(), &held, ReportResult::Banned, host)
                        .await;
                    self.give_back(client, &held).await;
                    let again = e.worth_another();
                    failed = Some(e);
                    if !again {
                        break;
                    }
                }
            }
        }
        Err(Failure::Chain(failed))
    }

    /// Gives a connection's lease back, unless a session holds it.
    pub(crate) async fn give_back(&self, client: &ClientAuth, held: &Held) {
        if !held.in_session {
            self.leases.release(client.token(), held).await;
        }
    }
}
