//! A client's tunnel, whichever front it came in by.
//!
//! ```text
//! establish: the client's name (the API's, cached) ─► a slot under its cap ─► a lease for the
//!            destination's host ─► CONNECT through the lease's proxy (2xx; or, when it
//!            failed, report it for the host, give it back and take one more lease; when it
//!            refused the destination by its rules, give it back and answer that)
//! carry:     bytes both ways (relay) while a session's lease is renewed ─► the lease given
//!            back (a session keeps its own) ─► metrics and the access log line
//! ```

use std::time::{Duration, Instant};

use egress_discovery::client::ReportResult;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::Gateway;
use crate::auth::ClientAuth;
use crate::caps::Slot;
use crate::chain::{self, ChainError, Tunnel};
use crate::leases::{Held, LeaseError, Renewal};
use crate::metrics::Front;
use crate::relay::{Relayed, relay};
use crate::username::Routing;

/// The shortest gap between two renewals of one tunnel's lease (a 1 s session TTL is renewed
/// twice a second).
const MIN_RENEWAL_GAP: Duration = Duration::from_millis(200);

/// Why a client got no tunnel.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No lease: the API's answer.
    Lease(LeaseError),
    /// The client holds as many tunnels as it may.
    TooMany,
    /// No backend opened it (the last one's error).
    Chain(Option<ChainError>),
}

impl Failure {
    /// The outcome's name in metrics and the access log.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Self::Lease(LeaseError::Unauthorized(_)) => "unauthorized",
            Self::Lease(LeaseError::NoProxy(_)) => "no_proxy",
            Self::Lease(LeaseError::Api(_)) => "api_error",
            Self::TooMany => "client_cap",
            Self::Chain(Some(ChainError::Refused(hyper::StatusCode::FORBIDDEN | hyper::StatusCode::BAD_REQUEST))) => {
                "refused"
            }
            Self::Chain(_) => "backend_failed",
        }
    }
}

/// A client's request on its way: who, how it came, where to, since when.
#[derive(Debug)]
pub(crate) struct Request {
    pub client: ClientAuth,
    pub routing: Routing,
    pub front: Front,
    /// `host:port`.
    pub authority: String,
    /// The cooldowns' target.
    pub host: String,
    pub since: Instant,
}

/// What a tunnel or request carried, and how it ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Carried {
    pub up: u64,
    pub down: u64,
    pub outcome: &'static str,
}

impl From<Relayed> for Carried {
    fn from(r: Relayed) -> Self {
        Self {
            up: r.up,
            down: r.down,
            outcome: r.ending.as_str(),
        }
    }
}

/// A tunnel through a leased proxy, not yet carrying anything.
#[derive(Debug)]
pub(crate) struct Opened {
    pub held: Held,
    pub tunnel: Tunnel,
    /// The client's name, as the API gave it.
    pub name: String,
    _slot: Slot,
}

impl Gateway {
    /// A lease and a tunnel through its proxy to the request's destination; a failure is
    /// accounted for here.
    pub(crate) async fn establish(&self, req: &Request) -> Result<Opened, Failure> {
        let mut name = None;
        let opened = self.try_establish(req, &mut name).await;
        if let Err(failure) = &opened {
            self.account_failure(req, name.as_deref().unwrap_or_default(), failure);
        }
        opened
    }

    async fn try_establish(&self, req: &Request, known_as: &mut Option<String>) -> Result<Opened, Failure> {
        let (name, slot) = self.admit(req, known_as).await?;
        let mut failed = None;
        for _ in 0..2 {
            let held = self
                .leases
                .acquire(req.client.token(), &req.routing, &req.host)
                .await
                .map_err(Failure::Lease)?;
            match chain::tunnel(&held.backend, &req.authority, self.settings.chain).await {
                Ok(tunnel) => {
                    self.metrics.established(req.since.elapsed());
                    return Ok(Opened {
                        held,
                        tunnel,
                        name,
                        _slot: slot,
                    });
                }
                Err(e) => {
                    // A proxy that refused the destination by its own rules did its job: no
                    // report (a cooldown would turn the next such request's 403 into a 503).
                    let again = e.worth_another();
                    if again {
                        self.report_and_give_back(&req.client, &held, &req.host).await;
                    } else {
                        self.give_back(&req.client, &held).await;
                    }
                    failed = Some(e);
                    // One more proxy only while the request is within one backend budget: a
                    // client is not kept waiting for two slow backends.
                    if !again || req.since.elapsed() > self.settings.chain.budget {
                        break;
                    }
                }
            }
        }
        Err(Failure::Chain(failed))
    }

    /// The client's name (the API's, cached; also set in `known_as`) and a slot under its cap.
    pub(crate) async fn admit(&self, req: &Request, known_as: &mut Option<String>) -> Result<(String, Slot), Failure> {
        let name = self
            .leases
            .client_of(req.client.token())
            .await
            .map_err(Failure::Lease)?;
        *known_as = Some(name.clone());
        let slot = self.caps.take(&name).ok_or(Failure::TooMany)?;
        Ok((name, slot))
    }

    /// Carries `client` ↔ the opened tunnel to its end, renewing a session's lease meanwhile;
    /// then gives the lease back and accounts for the tunnel.
    pub(crate) async fn carry<C>(&self, req: &Request, opened: Opened, client: C)
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let Opened { held, tunnel, name, .. } = opened;
        let _active = self.metrics.active();
        let relayed = {
            let renewing = self.renew_while_open(req, &held);
            tokio::pin!(renewing);
            let relaying = relay(client, tunnel, self.settings.idle_timeout, &self.closing);
            tokio::select! {
                relayed = relaying => relayed,
                never = &mut renewing => match never {},
            }
        };
        self.give_back(&req.client, &held).await;
        self.account(req, &name, &held.proxy_id, relayed.into());
    }

    /// Renews the tunnel's lease at half its TTL for as long as it is polled, so a long tunnel
    /// keeps its lease (and its proxy's capacity counted) to the end; a session's keeps its
    /// proxy. Once the API refuses (the lease ended, or its proxy may no longer be leased) it
    /// stops, and a session moves at its next tunnel; an API that could not answer is asked
    /// again at the next turn.
    async fn renew_while_open(&self, req: &Request, held: &Held) -> std::convert::Infallible {
        let every = (held.ttl / 2).max(MIN_RENEWAL_GAP);
        loop {
            tokio::time::sleep(every).await;
            let renewed = self.leases.renew(req.client.token(), held, req.routing.ttl).await;
            self.metrics.renewal(renewed.as_str());
            if renewed == Renewal::Refused {
                break;
            }
        }
        std::future::pending().await
    }

    /// A tunnel opened that carried nothing (`outcome`: the client left before its `200`, or
    /// its connection broke at the upgrade or the SOCKS5 reply): given back and counted.
    pub(crate) async fn not_carried(&self, req: &Request, opened: Opened, outcome: &'static str) {
        self.give_back(&req.client, &opened.held).await;
        let nothing = Carried {
            up: 0,
            down: 0,
            outcome,
        };
        self.account(req, &opened.name, &opened.held.proxy_id, nothing);
    }

    /// Reports a proxy that failed the client's request as banned for its host, and gives its
    /// lease back.
    pub(crate) async fn report_and_give_back(&self, client: &ClientAuth, held: &Held, host: &str) {
        self.leases
            .report(client.token(), held, ReportResult::Banned, host)
            .await;
        self.give_back(client, held).await;
    }

    /// Gives a connection's lease back, unless a session holds it.
    pub(crate) async fn give_back(&self, client: &ClientAuth, held: &Held) {
        if !held.in_session {
            self.leases.release(client.token(), held).await;
        }
    }

    /// The metrics and the access log line of a tunnel or request that was carried.
    pub(crate) fn account(&self, req: &Request, name: &str, proxy: &str, carried: Carried) {
        self.metrics.ended(name, req.front, carried.outcome);
        self.metrics.carried(name, proxy, carried.up, carried.down);
        self.access_line(req, name, proxy, carried);
    }

    /// The metrics and the access log line of a request that got no tunnel (`name` empty: the
    /// client is not known).
    pub(crate) fn account_failure(&self, req: &Request, name: &str, failure: &Failure) {
        let outcome = failure.outcome();
        self.metrics.ended(name, req.front, outcome);
        let nothing = Carried {
            up: 0,
            down: 0,
            outcome,
        };
        self.access_line(req, name, "", nothing);
    }

    /// One access log line, when they are on (`proxy` empty: none was used). What it holds is
    /// safe to log: names, the destination, counts; never a token or a password.
    fn access_line(&self, req: &Request, name: &str, proxy: &str, carried: Carried) {
        if self.settings.access_log {
            tracing::info!(
                target: "egress_gateway::access",
                client = name,
                front = req.front.as_str(),
                destination = req.authority.as_str(),
                proxy,
                up = carried.up,
                down = carried.down,
                duration_ms = u64::try_from(req.since.elapsed().as_millis()).unwrap_or(u64::MAX),
                outcome = carried.outcome,
                "Tunnel"
            );
        }
    }
}
