//! The gateway: one proxy endpoint for any crawler. A client authenticates with a discovery
//! token as its proxy password and says what it wants in its proxy username ([`username`],
//! [`auth`]); each connection then goes through a proxy leased for it from the discovery API
//! with the client's own token ([`leases`]), with that proxy's credentials, which the client
//! never sees ([`chain`]). [`http_front`] serves HTTP `CONNECT` and plain-HTTP forwarding.
//!
//! Built so far: the username grammar, the HTTP front and the chaining through a backend. The
//! SOCKS5 front, session renewal and reports by session, per-client caps, metrics, the access
//! log, the drain and the binary come next (issue "The gateway").

use std::sync::Arc;
use std::time::Duration;

pub mod auth;
pub mod chain;
pub mod http_front;
pub mod leases;
pub mod socks_front;
mod tunnels;
pub mod username;

/// What a gateway allows.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The longest `ttl` a username may ask for (the operator's `--max-lease-ttl`).
    pub max_ttl: Duration,
    /// A tunnel's setup through a backend.
    pub chain: chain::Limits,
    /// A client's request head, at most.
    pub max_head: usize,
    /// How long a client may take to send its request head.
    pub head_timeout: Duration,
    /// Client connections at once, at most.
    pub max_connections: usize,
    /// Plain-HTTP answer statuses reported as bans for their host and proxy.
    pub ban_statuses: Vec<u16>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_ttl: Duration::from_secs(3600),
            chain: chain::Limits::default(),
            max_head: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            max_connections: 4096,
            ban_statuses: vec![403, 429],
        }
    }
}

/// A gateway: its leases and what it allows.
#[derive(Debug)]
pub struct Gateway {
    leases: leases::Leases,
    settings: Settings,
    connections: Arc<tokio::sync::Semaphore>,
}

impl Gateway {
    pub fn new(leases: leases::Leases, settings: Settings) -> Self {
        let connections = Arc::new(tokio::sync::Semaphore::new(settings.max_connections));
        Self {
            leases,
            settings,
            connections,
        }
    }
}

/// Accepts connections on `listener` until the task is dropped, each served by `serve` in a
/// task of its own: at most the gateway's connections at once (the others are closed as they
/// come).
async fn accept<F, Fut>(listener: tokio::net::TcpListener, gateway: Arc<Gateway>, serve: F)
where
    F: Fn(Arc<Gateway>, tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    // After a failed accept (out of file descriptors, say), a pause doubling from 5 ms to 1 s,
    // as egress-http's server does, instead of spinning.
    let mut pause = Duration::ZERO;
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => {
                pause = Duration::ZERO;
                tcp
            }
            Err(_) => {
                pause = (pause * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let Ok(permit) = gateway.connections.clone().try_acquire_owned() else {
            drop(tcp);
            continue;
        };
        let serving = serve(gateway.clone(), tcp);
        tokio::spawn(async move {
            serving.await;
            drop(permit);
        });
    }
}
