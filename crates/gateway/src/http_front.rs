//! The HTTP front: `CONNECT` tunnels and plain-HTTP forward requests (absolute-form
//! `http://`), each through a proxy leased for it. A request without the client's credentials,
//! or with a username outside the grammar, gets 407 with `Proxy-Authenticate` and nothing is
//! dialled. The client's `Proxy-Authorization` and the hop-by-hop headers never reach a backend.
//!
//! hyper serves the client side (its head bounded and timed) and speaks to the backends.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use egress_discovery::client::ReportResult;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::Gateway;
use crate::auth::ClientAuth;
use crate::caps::Slot;
use crate::chain::{self, ChainError};
use crate::leases::{Held, LeaseError};
use crate::metrics::Front;
use crate::tunnels::{Carried, Failure, Request as Asked};
use crate::username::{self, Routing};

/// The bodies the front answers with.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// The realm the front's 407 names.
const REALM: &str = "Basic realm=\"egress-gateway\"";

/// Serves HTTP proxy clients on `listener` until the drain begins (or the task is dropped): at
/// most the gateway's connections at once (the others are closed as they come).
pub async fn serve(listener: TcpListener, gateway: Arc<Gateway>) {
    crate::accept(listener, gateway, serve_connection).await;
}

/// [`serve`] over TLS (an `https://` proxy URL), with the certificate in force when each
/// connection comes ([`crate::tls_front`]); the handshake within the head timeout.
pub async fn serve_tls(listener: TcpListener, gateway: Arc<Gateway>, tls: crate::tls_front::CurrentTls) {
    crate::accept(listener, gateway, move |gateway, tcp| {
        let acceptor = tls.acceptor();
        async move {
            let handshake = tokio::time::timeout(gateway.settings.head_timeout, acceptor.accept(tcp)).await;
            match handshake {
                Ok(Ok(stream)) => serve_connection(gateway, stream).await,
                Ok(Err(_)) | Err(_) => gateway.metrics.refused("tls"),
            }
        }
    })
    .await;
}

async fn serve_connection<S>(gateway: Arc<Gateway>, tcp: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let settings = gateway.settings.clone();
    let stopping = gateway.stopping.clone();
    let counts = gateway.clone();
    let service = hyper::service::service_fn(move |req| {
        let gateway = gateway.clone();
        async move { Ok::<_, Infallible>(gateway.handle(req).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.head_timeout)
        .max_buf_size(settings.max_head.max(8192))
        .serve_connection(TokioIo::new(tcp), service)
        .with_upgrades();
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = stopping.cancelled() => {
            // The drain: the request being answered finishes, the connection takes no other.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    // A head that was too large, malformed or too slow: hyper answered (431, 400) or closed.
    if let Err(e) = served
        && (e.is_parse() || e.is_parse_too_large() || e.is_timeout())
    {
        counts.metrics.refused("head");
    }
}

impl Gateway {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let client = req
            .headers()
            .get(PROXY_AUTHORIZATION)
            .and_then(|v| ClientAuth::from_basic(v.as_bytes()));
        let Some(client) = client else {
            self.metrics.refused("credentials");
            return need_credentials(
                "proxy credentials are required: the username routes, the password is a discovery token",
            );
        };
        let routing = match username::parse(&client.username, self.settings.max_ttl) {
            Ok(r) => r,
            Err(e) => {
                self.metrics.refused("credentials");
                return need_credentials(&e.to_string());
            }
        };
        if req.method() == Method::CONNECT {
            self.connect(req, client, routing).await
        } else {
            self.forward(req, client, routing).await
        }
    }

    /// A `CONNECT`: answered 200 once a backend opened the tunnel, which then carries the
    /// client's bytes both ways.
    async fn connect(self: Arc<Self>, req: Request<Incoming>, client: ClientAuth, routing: Routing) -> Response<Body> {
        let Some(authority) = req.uri().authority().filter(|a| a.port_u16().is_some()).cloned() else {
            return text(StatusCode::BAD_REQUEST, "CONNECT needs host:port");
        };
        let asked = Asked {
            client,
            routing,
            front: Front::Connect,
            authority: authority.as_str().to_owned(),
            host: authority.host().to_owned(),
            since: Instant::now(),
        };
        let opened = match self.establish(&asked).await {
            Ok(o) => o,
            Err(failure) => return refused(&failure),
        };
        let gateway = self.clone();
        self.tasks.spawn(async move {
            match hyper::upgrade::on(req).await {
                Ok(upgraded) => gateway.carry(&asked, opened, TokioIo::new(upgraded)).await,
                Err(_) => gateway.give_back(&asked.client, &opened.held).await,
            }
        });
        Response::new(empty())
    }

    /// A plain-HTTP request, sent on to a leased backend in absolute form with the backend's
    /// credentials; an answer with a ban status is reported for the host.
    async fn forward(self: Arc<Self>, req: Request<Incoming>, client: ClientAuth, routing: Routing) -> Response<Body> {
        let uri = req.uri().clone();
        let Some(host) = uri
            .host()
            .filter(|_| uri.scheme_str() == Some("http"))
            .map(str::to_owned)
        else {
            return text(
                StatusCode::BAD_REQUEST,
                "send an absolute-form http:// request, or CONNECT for anything else",
            );
        };
        let asked = Asked {
            client,
            routing,
            front: Front::Http,
            authority: format!("{host}:{}", uri.port_u16().unwrap_or(80)),
            host,
            since: Instant::now(),
        };
        let mut known_as = None;
        let admitted = self.admit(&asked, &mut known_as).await;
        let name = known_as.unwrap_or_default();
        let (held, slot) = match admitted {
            Ok((_, slot)) => match self
                .leases
                .acquire(asked.client.token(), &asked.routing, &asked.host)
                .await
            {
                Ok(held) => (held, slot),
                Err(e) => return self.failed(&asked, &name, &Failure::Lease(e)),
            },
            Err(failure) => return self.failed(&asked, &name, &failure),
        };
        self.send_on(req, asked, name, held, slot).await
    }

    /// The metrics and log line of a request that got no backend, and its answer.
    fn failed(&self, asked: &Asked, name: &str, failure: &Failure) -> Response<Body> {
        self.account_failure(asked, name, failure);
        refused(failure)
    }

    /// Sends the request to the leased backend and answers with the backend's answer, whose
    /// body gives the lease back and accounts for the request once it is done with.
    async fn send_on(
        self: Arc<Self>,
        req: Request<Incoming>,
        asked: Asked,
        name: String,
        held: Held,
        slot: Slot,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if let Some((user, password)) = &held.backend.credentials
            && let Ok(value) = HeaderValue::from_str(&chain::basic(user, password))
        {
            parts.headers.insert(PROXY_AUTHORIZATION, value);
        }
        let sent = Arc::new(AtomicU64::new(0));
        let counted = sent.clone();
        let body = Released::new(body, move |n| counted.store(n, Ordering::Relaxed));
        let req = Request::from_parts(parts, body);
        let answer = match chain::forward(&held.backend, req, self.settings.chain).await {
            Ok(a) => a,
            Err(e) => {
                self.report_and_give_back(&asked.client, &held, &asked.host).await;
                return self.failed(&asked, &name, &Failure::Chain(Some(e)));
            }
        };
        let banned = self.settings.ban_statuses.contains(&answer.status().as_u16());
        if banned {
            self.leases
                .report(asked.client.token(), &held, ReportResult::Banned, &asked.host)
                .await;
        }
        let (mut parts, body) = answer.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let active = self.metrics.active();
        let gateway = self.clone();
        let done = move |down: u64| {
            drop(active);
            let task = gateway.clone();
            gateway.tasks.spawn(async move {
                task.give_back(&asked.client, &held).await;
                let carried = Carried {
                    up: sent.load(Ordering::Relaxed),
                    down,
                    outcome: if banned { "banned" } else { "answered" },
                };
                task.account(&asked, &name, &held.proxy_id, carried);
                drop(slot);
            });
        };
        Response::from_parts(parts, Released::new(body, done).boxed())
    }
}

/// The headers meant for one hop only (RFC 9110 §7.6.1), and those the `Connection` header
/// names, taken out; with them the client's `Proxy-Authorization`.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .filter(|n| !n.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    let body = Full::new(Bytes::from(format!("{message}\n")))
        .map_err(|never| match never {})
        .boxed();
    let mut answer = Response::new(body);
    *answer.status_mut() = status;
    answer
}

/// 407, naming the problem.
fn need_credentials(message: &str) -> Response<Body> {
    let mut answer = text(StatusCode::PROXY_AUTHENTICATION_REQUIRED, message);
    answer
        .headers_mut()
        .insert(PROXY_AUTHENTICATE, HeaderValue::from_static(REALM));
    answer
}

fn lease_refused(e: &LeaseError) -> Response<Body> {
    match e {
        LeaseError::Unauthorized(_) => need_credentials(&e.to_string()),
        LeaseError::NoProxy(_) | LeaseError::Api(_) => text(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

fn chain_failed(e: Option<&ChainError>) -> Response<Body> {
    match e {
        Some(e @ ChainError::Refused(StatusCode::FORBIDDEN)) => text(StatusCode::FORBIDDEN, &e.to_string()),
        Some(e) => text(StatusCode::BAD_GATEWAY, &e.to_string()),
        None => text(StatusCode::BAD_GATEWAY, "no backend proxy opened the tunnel"),
    }
}

/// A body that counts the bytes it yields and calls `on_end` with them once it is done with
/// (read to its end, or dropped): a plain-HTTP request's lease goes back then, and its bytes
/// are counted.
struct Released<F: FnOnce(u64)> {
    body: Incoming,
    bytes: u64,
    on_end: Option<F>,
}

impl<F: FnOnce(u64)> Released<F> {
    fn new(body: Incoming, on_end: F) -> Self {
        Self {
            body,
            bytes: 0,
            on_end: Some(on_end),
        }
    }
}

impl<F: FnOnce(u64)> Drop for Released<F> {
    fn drop(&mut self) {
        if let Some(f) = self.on_end.take() {
            f(self.bytes);
        }
    }
}

impl<F: FnOnce(u64) + Unpin> hyper::body::Body for Released<F> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.bytes += data.len() as u64;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The answer to a request that got no tunnel or backend.
fn refused(failure: &Failure) -> Response<Body> {
    match failure {
        Failure::Lease(e) => lease_refused(e),
        Failure::TooMany => text(
            StatusCode::TOO_MANY_REQUESTS,
            "this client has as many tunnels and requests open as it may",
        ),
        Failure::Chain(e) => chain_failed(e.as_ref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_the_clients_credentials_are_taken_out() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("proxy-authorization", "Basic dG9rZW4="),
            ("connection", "keep-alive, X-Secret-Hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("accept", "*/*"),
            ("host", "example.test"),
        ] {
            h.insert(hyper::header::HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(hyper::header::HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "host"]);
    }

    #[test]
    fn a_407_asks_for_basic_credentials_and_names_the_problem() {
        let a = need_credentials("username names \"geo\" twice");
        assert_eq!(a.status(), StatusCode::PROXY_AUTHENTICATION_REQUIRED);
        assert_eq!(a.headers()[PROXY_AUTHENTICATE], REALM);
    }

    #[test]
    fn a_backend_refusing_the_destination_is_403_and_any_other_failure_502() {
        assert_eq!(
            chain_failed(Some(&ChainError::Refused(StatusCode::FORBIDDEN))).status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            chain_failed(Some(&ChainError::Protocol)).status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(chain_failed(None).status(), StatusCode::BAD_GATEWAY);
        assert_eq!(
            lease_refused(&LeaseError::NoProxy("no match".into())).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            lease_refused(&LeaseError::Unauthorized("x".into())).status(),
            StatusCode::PROXY_AUTHENTICATION_REQUIRED
        );
    }
}
