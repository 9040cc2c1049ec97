//! The gateway: one proxy endpoint for any crawler. A client authenticates with a discovery
//! token as its proxy password and says what it wants in its proxy username ([`username`],
//! [`auth`]); each connection then goes through a proxy leased for it from the discovery API
//! with the client's own token ([`leases`]), with that proxy's credentials, which the client
//! never sees ([`chain`]). [`http_front`] serves HTTP `CONNECT` and plain-HTTP forwarding.
//!
//! [`socks_front`] serves SOCKS5; [`tls_front`] puts TLS on the HTTP front. [`relay`] carries a tunnel's bytes; each tunnel and request is
//! counted in [`metrics`] and, when asked, logged on one access line (target
//! `egress_gateway::access`; never a token or a backend's password).
//!
//! Bounded: client connections at once ([`Settings::max_connections`]), each client's tunnels
//! at once ([`Settings::per_client`]), request heads and handshakes (size and time), idle
//! tunnels, and a drain ([`Gateway::drain`]) that stops accepting, lets tunnels finish within
//! its budget and then closes the rest.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub mod auth;
mod caps;
pub mod chain;
pub mod http_front;
mod http_requests;
pub mod leases;
pub mod metrics;
pub mod program;
pub mod relay;
pub mod socks_front;
/// TLS on the HTTP front: the certificate files as the one serving stack follows them.
pub use egress_http::tls_files as tls_front;
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
    /// Tunnels and plain-HTTP requests of one client (by name) at once, at most.
    pub per_client: usize,
    /// A tunnel neither side sent a byte on for this long is closed.
    pub idle_timeout: Duration,
    /// One access log line per tunnel and request.
    pub access_log: bool,
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
            per_client: 1024,
            idle_timeout: Duration::from_secs(300),
            access_log: false,
        }
    }
}

/// A gateway: its leases, what it allows, its counts, and its tunnels (for the drain).
#[derive(Debug)]
pub struct Gateway {
    leases: leases::Leases,
    settings: Settings,
    connections: Arc<tokio::sync::Semaphore>,
    caps: Arc<caps::ClientCaps>,
    metrics: metrics::Metrics,
    /// Cancelled when the drain begins: the fronts stop accepting, idle connections close.
    stopping: CancellationToken,
    /// Cancelled when the drain's budget ran out: every tunnel still open closes.
    closing: CancellationToken,
    /// Every connection's and tunnel's task, for the drain to wait on.
    tasks: TaskTracker,
}

/// After the drain's budget, how long what is still open may take to close.
const CLOSE_BUDGET: Duration = Duration::from_secs(5);

impl Gateway {
    pub fn new(leases: leases::Leases, settings: Settings) -> Self {
        Self {
            leases,
            connections: Arc::new(tokio::sync::Semaphore::new(settings.max_connections)),
            caps: caps::ClientCaps::new(settings.per_client),
            settings,
            metrics: metrics::Metrics::default(),
            stopping: CancellationToken::new(),
            closing: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }
    }

    /// Its metrics, to register where they are served.
    pub fn metrics(&self) -> &metrics::Metrics {
        &self.metrics
    }

    /// Stops accepting, lets open tunnels and requests finish within `budget`, then closes
    /// what is left. Whether everything finished in time.
    pub async fn drain(&self, budget: Duration) -> bool {
        self.stopping.cancel();
        self.tasks.close();
        let finished = tokio::time::timeout(budget, self.tasks.wait()).await.is_ok();
        if !finished {
            self.closing.cancel();
            // Relays and client connections end at once on `closing`; a lease or a backend's
            // answer still being asked for has its own time limits, and is not waited for
            // past this.
            let _ = tokio::time::timeout(CLOSE_BUDGET, self.tasks.wait()).await;
        }
        finished
    }
}

/// A client connection's place under [`Settings::max_connections`], held by the connection and
/// by each tunnel it opened (a `CONNECT` tunnel outlives hyper's connection task).
type Permit = Arc<tokio::sync::OwnedSemaphorePermit>;

/// Accepts connections on `listener` until the drain begins (or the task is dropped), each
/// served by `serve` in a task of its own: at most the gateway's connections at once (the
/// others are closed as they come, and counted).
async fn accept<F, Fut>(listener: tokio::net::TcpListener, gateway: Arc<Gateway>, serve: F)
where
    F: Fn(Arc<Gateway>, tokio::net::TcpStream, Permit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    // After a failed accept (out of file descriptors, say), a pause doubling from 5 ms to 1 s,
    // as egress-http's server does, instead of spinning.
    let mut pause = Duration::ZERO;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = gateway.stopping.cancelled() => return,
        };
        let tcp = match accepted {
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
            gateway.metrics.refused("connection_cap");
            drop(tcp);
            continue;
        };
        gateway.tasks.spawn(serve(gateway.clone(), tcp, Arc::new(permit)));
    }
}
