//! The leases behind each connection, taken from the discovery API with the client's own token
//! (so its admission and scopes apply, and the gateway holds no token of its own), over one
//! pool of keep-alive connections to the API.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use egress_discovery::client::{AcquireRequest, Client, ClientError, Lease, ReportResult};

use crate::chain::Backend;
use crate::username::Routing;

/// A lease the gateway holds for a connection.
#[derive(Debug)]
pub struct Held {
    pub lease_id: String,
    /// `<namespace>/<name>`.
    pub proxy_id: String,
    pub backend: Backend,
    /// Held by a session: it outlives the connection, which does not give it back.
    pub in_session: bool,
    /// How long it had when granted: a session's lease is renewed at half of it.
    pub ttl: Duration,
}

/// What a renewal came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    Renewed,
    /// The lease has ended, or its proxy may no longer be leased: the session moves at its
    /// next tunnel.
    Refused,
    /// The API could not be asked, or answered otherwise.
    Failed,
}

impl Renewal {
    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Renewed => "renewed",
            Self::Refused => "refused",
            Self::Failed => "api_error",
        }
    }
}

/// Why a connection got no lease, as the client is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The token is missing or wrong: 407, nothing dialled.
    #[error("the discovery API did not take the password as a token: {0}")]
    Unauthorized(String),
    /// No proxy fits (the lease API's reason): 503.
    #[error("{0}")]
    NoProxy(String),
    /// Anything else the API answered or could not (overloaded, unreachable, a bad request).
    #[error("the discovery API: {0}")]
    Api(String),
}

/// Calls the gateway makes to the discovery API at once, at most: each holds one connection,
/// and the API serves one source address 64 at once (`--max-connections-per-source`), so a
/// gateway replica stays under that with room for a probe or two; also under the API's 256
/// waiting requests per client.
pub const MAX_API_CALLS: usize = 48;

/// How long a token's client, once the API named it, is taken as known.
const KNOWN_FOR: Duration = Duration::from_secs(10);
/// Tokens whose client is kept known, at most.
const MAX_KNOWN: usize = 1024;

/// The discovery API as the gateway calls it.
pub struct Leases {
    api: Client,
    /// Calls to the API at once, at most: a burst of closing tunnels queues its releases here
    /// rather than opening a connection each and meeting the API's 429s.
    calls: tokio::sync::Semaphore,
    /// Each token the API recently took, its client and when it said so.
    known: Mutex<HashMap<String, (Instant, String)>>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The tokens it knows are the clients' secrets: never printed.
        f.debug_struct("Leases").finish_non_exhaustive()
    }
}

impl Leases {
    /// The API client for `token`, once a call may go (see [`MAX_API_CALLS`]).
    async fn api(&self, token: &str) -> (Client, tokio::sync::SemaphorePermit<'_>) {
        // Never closed: the semaphore lives as long as `self`.
        let permit = self
            .calls
            .acquire()
            .await
            .unwrap_or_else(|_| unreachable!("the semaphore is never closed"));
        (self.api.for_token(token), permit)
    }

    /// On the API client `api` (its base URL, budget and connection pool; its token unused).
    pub fn new(api: Client) -> Self {
        Self {
            api,
            known: Mutex::default(),
            calls: tokio::sync::Semaphore::new(MAX_API_CALLS),
        }
    }

    /// The client `token` belongs to, as the API named it within [`KNOWN_FOR`] or names it now
    /// (a SOCKS5 client is told whether its credentials were taken before it names a
    /// destination, so before any lease).
    ///
    /// # Errors
    /// [`LeaseError::Unauthorized`] for a token the API does not take; [`LeaseError::Api`]
    /// when it cannot say.
    pub async fn client_of(&self, token: &str) -> Result<String, LeaseError> {
        {
            let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((at, client)) = known.get(token)
                && at.elapsed() < KNOWN_FOR
            {
                return Ok(client.clone());
            }
        }
        let (api, _permit) = self.api(token).await;
        let client = api.whoami().await.map_err(refused)?;
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= MAX_KNOWN {
            known.clear();
        }
        known.insert(token.to_owned(), (Instant::now(), client.clone()));
        Ok(client)
    }

    /// A lease for a connection to `host` (the cooldowns' target) as `routing` asks.
    ///
    /// # Errors
    /// [`LeaseError`], by what the API answered.
    pub async fn acquire(&self, token: &str, routing: &Routing, host: &str) -> Result<Held, LeaseError> {
        let request = AcquireRequest {
            selector: routing.selector(),
            ttl_seconds: routing.ttl.map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX)),
            target: Some(host.to_owned()),
            session: routing.session.as_ref().map(|s| s.as_str().to_owned()),
        };
        let (api, _permit) = self.api(token).await;
        let lease = api.acquire(&request).await.map_err(refused)?;
        held(lease, routing.session.is_some())
    }

    /// Extends the lease to `ttl` from now (`None`: the API's default), as a session's lease is
    /// while its tunnels are in use.
    pub async fn renew(&self, token: &str, held: &Held, ttl: Option<Duration>) -> Renewal {
        let (api, _permit) = self.api(token).await;
        match api.renew(&held.lease_id, ttl).await {
            Ok(_) => Renewal::Renewed,
            Err(ClientError::UnknownLease(_) | ClientError::NotRenewable(_)) => Renewal::Refused,
            Err(_) => Renewal::Failed,
        }
    }

    /// Gives the lease back; one that already ended is fine.
    pub async fn release(&self, token: &str, held: &Held) {
        let (api, _permit) = self.api(token).await;
        let _ = api.release(&held.lease_id).await;
    }

    /// Reports `result` for `host` on the lease's proxy (its cooldown for that target).
    pub async fn report(&self, token: &str, held: &Held, result: ReportResult, host: &str) {
        let (api, _permit) = self.api(token).await;
        let _ = api.report(&held.lease_id, result, Some(host)).await;
    }
}

fn refused(e: ClientError) -> LeaseError {
    match e {
        ClientError::Unauthorized(m) => LeaseError::Unauthorized(m),
        e @ (ClientError::NoMatch { .. } | ClientError::TooManySessions(_)) => LeaseError::NoProxy(e.to_string()),
        e => LeaseError::Api(e.to_string()),
    }
}

/// The lease as the gateway holds it: its proxy's address and credentials.
fn held(lease: Lease, in_session: bool) -> Result<Held, LeaseError> {
    let proxy = &lease.proxy;
    let ip: IpAddr = proxy
        .ip
        .parse()
        .map_err(|_| LeaseError::Api(format!("proxy {} has no address yet", proxy.id)))?;
    let credentials = match (&proxy.username, &proxy.password) {
        (Some(u), Some(p)) => Some((u.to_string(), p.to_string())),
        _ => None,
    };
    Ok(Held {
        lease_id: lease.lease_id.to_string(),
        proxy_id: proxy.id.to_string(),
        backend: Backend {
            addr: SocketAddr::new(ip, proxy.port),
            credentials,
        },
        in_session,
        ttl: Duration::from_secs(lease.ttl_seconds),
    })
}
