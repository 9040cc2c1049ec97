//! The one serving stack the operator's HTTP servers share (the discovery API, metrics, health
//! probes): an accept loop with a connection cap, budgets for every way a client can hold a
//! connection, optional TLS with the protocol chosen by ALPN, and a bounded drain at shutdown.
//! Routing is an [`axum::Router`]; this crate knows nothing of what the routes do.
//!
//! What a client gets when it misbehaves:
//!
//! | client                                   | outcome                                             |
//! |------------------------------------------|-----------------------------------------------------|
//! | connects beyond [`Limits::max_connections`], or beyond [`Limits::max_connections_per_source`] from its address | the server's [`Rejection::Overloaded`] answer (plain HTTP), then close; over TLS, closed |
//! | sends its head (or its TLS handshake) slower than [`Limits::header_read`] | closed (hyper's header timer) |
//! | stays idle between requests for [`Limits::header_read`] | closed: hyper starts the header timer the moment an HTTP/1 connection waits for its next request, so this is also the keep-alive idle timeout; an HTTP/2 connection closes once no request has been in flight that long, whatever frames (PINGs, window updates) it sends |
//! | HTTP/1 headers over [`Limits::max_header_bytes`] | [`Rejection::HeadersTooLarge`] (the server's own body) |
//! | HTTP/1 headers over [`HYPER_BUFFER`] (64 KiB), or more than 100 header fields | hyper's bare `431` with no body, then close |
//! | HTTP/2 headers over [`Limits::max_header_bytes`] (as HTTP/2 counts them: 32 bytes more a field) | hyper's bare `431` |
//! | a malformed request line or header       | hyper's bare `400` with no body, then close         |
//! | reads a response slower than [`Limits::write`] | closed once a response has waited that long to be written |
//! | sends a body slower than the route allows | the route's answer: see [`read_body`]              |
//!
//! At shutdown the listener closes at once, handshakes in progress end, every connection is asked
//! to finish its request in flight (HTTP/1 stops keep-alive; HTTP/2 sends GOAWAY), and whatever is
//! still open after [`Limits::drain`] is aborted.

mod body;
mod io;
mod sources;
pub mod tls_files;
mod token_bucket;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use axum::Router;
pub use axum::body::Body;
pub use body::{BodyError, read_body};
pub use token_bucket::TokenBucket;

/// hyper's read buffer: a head larger than this gets hyper's own bare `431`. It is larger than
/// [`Limits::max_header_bytes`] so that the common oversized head reaches our check and gets
/// the server's own answer.
pub const HYPER_BUFFER: usize = 64 * 1024;

/// The budgets a server holds its clients to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; one more is answered [`Rejection::Overloaded`] and closed.
    pub max_connections: usize,
    /// Connections served at once from one source address (clients behind one SNAT address
    /// share it); one more is answered as over [`Limits::max_connections`], before any byte of
    /// it is read.
    pub max_connections_per_source: usize,
    /// The request line and headers together, in bytes (names, values and line ends).
    pub max_header_bytes: usize,
    /// A request's head must arrive within this of the connection waiting for it (its first
    /// request, or the next one on a kept-alive connection).
    pub header_read: Duration,
    /// A response that has to wait for the client to read must be written within this of the
    /// first wait.
    pub write: Duration,
    /// At shutdown, how long requests in flight get to finish.
    pub drain: Duration,
}

impl Limits {
    /// The operator's defaults: 1024 connections, 64 from one source, 16 KiB of headers, 5 s
    /// for a head (and for an idle keep-alive), 10 s to write a response, 5 s to drain.
    pub const DEFAULT: Self = Self {
        max_connections: 1024,
        max_connections_per_source: 64,
        max_header_bytes: 16 * 1024,
        header_read: Duration::from_secs(5),
        write: Duration::from_secs(10),
        drain: Duration::from_secs(5),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Why the stack itself answered instead of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The connection cap is reached (`503`).
    Overloaded,
    /// The head is over [`Limits::max_header_bytes`] (`431`).
    HeadersTooLarge,
}

/// How a server words the stack's own answers (the discovery API answers in its JSON envelope,
/// the metrics and probe servers in plain text, as controller-runtime does).
pub type Rejecter = fn(Rejection) -> Response<Body>;

/// Plain-text answers: `503 overloaded` (with `Retry-After: 1`) and `431 request header fields
/// too large`.
#[must_use]
pub fn plain_rejection(rejection: Rejection) -> Response<Body> {
    let (status, text) = match rejection {
        Rejection::Overloaded => (http::StatusCode::SERVICE_UNAVAILABLE, "overloaded\n"),
        Rejection::HeadersTooLarge => (
            http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request header fields too large\n",
        ),
    };
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if rejection == Rejection::Overloaded {
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    response
}

/// One server: its name (in logs), budgets, TLS, and how it words rejections.
pub struct Server {
    name: &'static str,
    limits: Limits,
    tls: Option<tls_files::CurrentTls>,
    reject: Rejecter,
    open: watch::Sender<usize>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("limits", &self.limits)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A plain HTTP/1.1 server with the default limits and plain-text rejections.
    #[must_use]
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            limits: Limits::DEFAULT,
            tls: None,
            reject: plain_rejection,
            open: watch::Sender::new(0),
        }
    }

    #[must_use]
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Serves over TLS; HTTP/2 is spoken when the acceptor's ALPN list offers `h2` and the
    /// client picks it, HTTP/1.1 otherwise. Plain connections are always HTTP/1.1.
    #[must_use]
    pub fn tls(mut self, acceptor: impl Into<tls_files::CurrentTls>) -> Self {
        self.tls = Some(acceptor.into());
        self
    }

    #[must_use]
    pub fn rejecter(mut self, reject: Rejecter) -> Self {
        self.reject = reject;
        self
    }

    /// The number of connections open now, updated as they open and close (for tests and
    /// for whoever wants to watch the server drain).
    #[must_use]
    pub fn open_connections(&self) -> watch::Receiver<usize> {
        self.open.subscribe()
    }

    /// Serves `router` on `listener` until `shutdown`, then drains (see the crate docs).
    pub async fn serve(self, listener: TcpListener, router: Router, shutdown: CancellationToken) {
        let mut gate = Gate::new(&self);
        let (name, limits, tls) = (self.name, self.limits, self.tls);
        let shared = Arc::new(Shared {
            name,
            limits,
            reject: self.reject,
            router,
            open: self.open,
        });
        // Connection tasks; finished ones are reaped as the loop goes, and whatever outlives
        // the drain at shutdown is aborted.
        let mut connections = JoinSet::new();
        let mut pause = Duration::ZERO;
        loop {
            let (stream, peer) = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => {
                        pause = Duration::ZERO;
                        accepted
                    }
                    Err(e) => {
                        if failed_accept(name, &e, &mut pause, &shutdown).await {
                            break;
                        }
                        continue;
                    }
                },
            };
            while connections.try_join_next().is_some() {}
            let Some((source, slot)) = gate.admit(peer) else {
                gate.turn_away(stream);
                continue;
            };
            let shared = shared.clone();
            // The certificate in force when the connection came: a renewal serves the next one.
            let tls = tls.as_ref().map(tls_files::CurrentTls::acceptor);
            let shutdown = shutdown.clone();
            connections.spawn(async move {
                // Dropped in reverse: the count falls before the slots are given back, so it
                // never reads more than the cap.
                let _source = source;
                let _slot = slot;
                let open = shared.clone();
                let _open = Open::count(&open.open);
                shared.connection(stream, tls, shutdown).await;
            });
        }
        drop(listener);
        let drained =
            tokio::time::timeout(limits.drain, async { while connections.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::debug!(
                server = name,
                left = connections.len(),
                "connections outlived the drain; dropped"
            );
        }
        connections.shutdown().await;
    }
}

/// After a failed accept (out of file descriptors, say): logs it and waits before the next,
/// doubling from 5 ms to 1 s as Go's net/http does, instead of spinning. Whether `shutdown`
/// came meanwhile.
async fn failed_accept(name: &str, e: &std::io::Error, pause: &mut Duration, shutdown: &CancellationToken) -> bool {
    *pause = (*pause * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
    tracing::error!(server = name, error = %e, retry_in = ?*pause, "accepting a connection failed");
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(*pause) => false,
    }
}

/// Who gets a connection: the caps on connections, of the server and of each source address,
/// and the answer of those over one.
struct Gate {
    name: &'static str,
    limits: Limits,
    tls: bool,
    reject: Rejecter,
    slots: Arc<Semaphore>,
    sources: Arc<sources::Sources>,
    /// Over-cap clients get their answer from a few short tasks of their own; beyond those
    /// they are closed at once, so a flood costs a bounded amount of work.
    rejecting: Arc<Semaphore>,
    /// At a cap: a warning at most once a minute, however many clients are turned away.
    warned: Option<std::time::Instant>,
    warned_source: Option<std::time::Instant>,
}

impl Gate {
    fn new(server: &Server) -> Self {
        Self {
            name: server.name,
            limits: server.limits,
            tls: server.tls.is_some(),
            reject: server.reject,
            slots: Arc::new(Semaphore::new(server.limits.max_connections)),
            sources: sources::Sources::new(server.limits.max_connections_per_source),
            rejecting: Arc::new(Semaphore::new(REJECTERS)),
            warned: None,
            warned_source: None,
        }
    }

    /// The slots of a connection from `peer`, or `None` when its source or the server is at
    /// its cap (said at most once a minute each).
    fn admit(
        &mut self,
        peer: std::net::SocketAddr,
    ) -> Option<(sources::SourceSlot, tokio::sync::OwnedSemaphorePermit)> {
        let Some(source) = self.sources.take(peer.ip()) else {
            if self.warned_source.is_none_or(|at| at.elapsed() >= CAP_WARNING_EVERY) {
                self.warned_source = Some(std::time::Instant::now());
                tracing::warn!(
                    server = self.name,
                    source = %peer.ip(),
                    max_connections_per_source = self.limits.max_connections_per_source,
                    "a source is at its connection cap: its new connections are turned away until some close"
                );
            }
            return None;
        };
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            if self.warned.is_none_or(|at| at.elapsed() >= CAP_WARNING_EVERY) {
                self.warned = Some(std::time::Instant::now());
                tracing::warn!(
                    server = self.name,
                    max_connections = self.limits.max_connections,
                    "at the connection cap: new clients are turned away until some close"
                );
            }
            return None;
        };
        Some((source, slot))
    }

    /// Answers a connection over a cap [`Rejection::Overloaded`] from a short task of its own
    /// (plain HTTP; over TLS it is closed), or closes it when that many answers are under way.
    fn turn_away(&self, stream: TcpStream) {
        if !self.tls
            && let Ok(permit) = self.rejecting.clone().try_acquire_owned()
        {
            let answer = (self.reject)(Rejection::Overloaded);
            tokio::spawn(async move {
                turn_away(stream, answer).await;
                drop(permit);
            });
        }
    }
}

/// How often reaching the connection cap is logged, at most.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(60);
/// Over-cap answers being written at once, at most.
const REJECTERS: usize = 64;
/// How long an over-cap client gets to take its answer.
const REJECT_BUDGET: Duration = Duration::from_secs(1);

struct Shared {
    name: &'static str,
    limits: Limits,
    reject: Rejecter,
    router: Router,
    open: watch::Sender<usize>,
}

/// Counts one open connection for as long as it lives.
struct Open<'a>(&'a watch::Sender<usize>);

impl<'a> Open<'a> {
    fn count(open: &'a watch::Sender<usize>) -> Self {
        open.send_modify(|n| *n += 1);
        Self(open)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Shared {
    async fn connection(
        self: Arc<Self>,
        stream: TcpStream,
        tls: Option<tokio_rustls::TlsAcceptor>,
        shutdown: CancellationToken,
    ) {
        let _ = stream.set_nodelay(true);
        let result = match tls {
            None => self.http1(stream, &shutdown).await,
            Some(acceptor) => {
                // The handshake is part of the head: it gets the header budget, and a shutdown
                // ends it.
                let handshake = tokio::select! {
                    r = tokio::time::timeout(self.limits.header_read, acceptor.accept(stream)) => r,
                    () = shutdown.cancelled() => return,
                };
                let stream = match handshake {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(server = self.name, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(server = self.name, "TLS handshake timed out");
                        return;
                    }
                };
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                if h2 {
                    self.http2(stream, &shutdown).await
                } else {
                    self.http1(stream, &shutdown).await
                }
            }
        };
        if let Err(e) = result {
            tracing::debug!(server = self.name, error = %e, "a connection ended with an error");
        }
    }

    fn service(self: &Arc<Self>, activity: Arc<io::Activity>) -> Handler {
        Handler {
            shared: self.clone(),
            activity,
        }
    }

    async fn http1<S>(self: &Arc<Self>, stream: S, shutdown: &CancellationToken) -> hyper::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(io::Activity::default());
        let io = TokioIo::new(io::Guarded::new(stream, self.limits.write, None));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read)
            .max_buf_size(HYPER_BUFFER);
        let conn = builder.serve_connection(io, self.service(activity));
        tokio::pin!(conn);
        until_drained(conn, shutdown, self.limits.drain, |c| c.graceful_shutdown()).await
    }

    async fn http2<S>(self: &Arc<Self>, stream: S, shutdown: &CancellationToken) -> hyper::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // HTTP/2 has no header timer in hyper: the connection closes once no request has been
        // in flight for the header budget (frames such as PINGs do not count).
        let activity = Arc::new(io::Activity::default());
        let idle = io::Idle {
            budget: self.limits.header_read,
            activity: activity.clone(),
        };
        let io = TokioIo::new(io::Guarded::new(stream, self.limits.write, Some(idle)));
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(self.limits.max_header_bytes).unwrap_or(u32::MAX))
            .max_concurrent_streams(MAX_STREAMS);
        let conn = builder.serve_connection(io, self.service(activity));
        tokio::pin!(conn);
        until_drained(conn, shutdown, self.limits.drain, |c| c.graceful_shutdown()).await
    }
}

/// Serves `conn` until it ends, or until `shutdown`: then asks it to finish (`graceful`) and
/// gives it `drain` to do so.
async fn until_drained<C>(
    mut conn: std::pin::Pin<&mut C>,
    shutdown: &CancellationToken,
    drain: Duration,
    graceful: impl FnOnce(std::pin::Pin<&mut C>),
) -> hyper::Result<()>
where
    C: Future<Output = hyper::Result<()>>,
{
    tokio::select! {
        r = conn.as_mut() => r,
        () = shutdown.cancelled() => {
            graceful(conn.as_mut());
            tokio::time::timeout(drain, conn).await.unwrap_or(Ok(()))
        }
    }
}

/// The hyper service of one connection: the header cap, then the router; each request counts
/// as in flight until its response is made.
#[derive(Clone)]
struct Handler {
    shared: Arc<Shared>,
    activity: Arc<io::Activity>,
}

impl hyper::service::Service<Request<Incoming>> for Handler {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let shared = self.shared.clone();
        let in_flight = io::Activity::begin(&self.activity);
        Box::pin(async move {
            let _in_flight = in_flight;
            if head_bytes(&req) > shared.limits.max_header_bytes {
                return Ok((shared.reject)(Rejection::HeadersTooLarge));
            }
            tower::ServiceExt::oneshot(shared.router.clone(), req).await
        })
    }
}

/// Requests in flight on one HTTP/2 connection, at most.
const MAX_STREAMS: u32 = 32;

/// The size of a request's head as it came on the wire (HTTP/1): the request line and each
/// `name: value\r\n`.
fn head_bytes<B>(req: &Request<B>) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + " HTTP/1.1\r\n".len() + 1;
    req.headers()
        .iter()
        .fold(line, |n, (name, value)| n + name.as_str().len() + value.len() + 4)
}

/// Writes `answer` with `Connection: close` to a client beyond the cap, lets it read, and
/// closes; within [`REJECT_BUDGET`].
async fn turn_away(mut stream: TcpStream, answer: Response<Body>) {
    let bytes = encode_closing(answer).await;
    let _ = tokio::time::timeout(REJECT_BUDGET, async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await?;
        // Read what the client sent until it closes, so the close is a FIN the client reads
        // after the answer, not a reset that may discard it.
        let mut sink = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            let n = tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// An HTTP/1.1 response written out by hand (the connection never reaches hyper).
async fn encode_closing(answer: Response<Body>) -> Vec<u8> {
    let (parts, body) = answer.into_parts();
    let body = http_body_util::BodyExt::collect(body)
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        parts.status.as_u16(),
        parts.status.canonical_reason().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_counted_as_sent() {
        let req = Request::get("/v1/proxies?healthy=true")
            .header("host", "x")
            .body(())
            .unwrap();
        // "GET /v1/proxies?healthy=true HTTP/1.1\r\n" + "host: x\r\n"
        assert_eq!(head_bytes(&req), 39 + 9);
    }

    #[tokio::test]
    async fn a_turned_away_answer_closes_the_connection() {
        let bytes = encode_closing(plain_rejection(Rejection::Overloaded)).await;
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{text}");
        assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\noverloaded\n"), "{text}");
    }
}
