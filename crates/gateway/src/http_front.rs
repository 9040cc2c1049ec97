//! The HTTP front: `CONNECT` tunnels and plain-HTTP forward requests (absolute-form
//! `http://`), each through a proxy leased for it. A request without the client's credentials,
//! or with a username outside the grammar, gets 407 with `Proxy-Authenticate` and nothing is
//! dialled. The client's `Proxy-Authorization` and the hop-by-hop headers never reach a backend.
//!
//! hyper serves the client side (its head bounded and timed) and speaks to the backends.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use egress_discovery::client::ReportResult;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::Gateway;
use crate::auth::ClientAuth;
use crate::chain::{self, ChainError};
use crate::leases::LeaseError;
use crate::tunnels::Failure;
use crate::username::{self, Routing};

/// The bodies the front answers with.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// The realm the front's 407 names.
const REALM: &str = "Basic realm=\"egress-gateway\"";

/// Serves HTTP proxy clients on `listener` until the task is dropped: at most the gateway's
/// connections at once (the others are closed as they come).
pub async fn serve(listener: TcpListener, gateway: Arc<Gateway>) {
    crate::accept(listener, gateway, serve_connection).await;
}

async fn serve_connection(gateway: Arc<Gateway>, tcp: TcpStream) {
    let settings = gateway.settings.clone();
    let service = hyper::service::service_fn(move |req| {
        let gateway = gateway.clone();
        async move { Ok::<_, Infallible>(gateway.handle(req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.head_timeout)
        .max_buf_size(settings.max_head.max(8192))
        .serve_connection(TokioIo::new(tcp), service)
        .with_upgrades()
        .await;
}

impl Gateway {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let client = req
            .headers()
            .get(PROXY_AUTHORIZATION)
            .and_then(|v| ClientAuth::from_basic(v.as_bytes()));
        let Some(client) = client else {
            return need_credentials(
                "proxy credentials are required: the username routes, the password is a discovery token",
            );
        };
        let routing = match username::parse(&client.username, self.settings.max_ttl) {
            Ok(r) => r,
            Err(e) => return need_credentials(&e.to_string()),
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
        let host = authority.host().to_owned();
        let (held, mut tunnel) = match self.establish(&client, &routing, authority.as_str(), &host).await {
            Ok(t) => t,
            Err(Failure::Lease(e)) => return lease_refused(&e),
            Err(Failure::Chain(e)) => return chain_failed(e.as_ref()),
        };
        tokio::spawn(async move {
            if let Ok(upgraded) = hyper::upgrade::on(req).await {
                let mut from_client = TokioIo::new(upgraded);
                let _ = tokio::io::copy_bidirectional(&mut from_client, &mut tunnel).await;
            }
            self.give_back(&client, &held).await;
        });
        Response::new(empty())
    }

    /// A plain-HTTP request, sent on to a leased backend in absolute form with the backend's
    /// credentials; an answer with a ban status is reported for the host.
    async fn forward(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        client: ClientAuth,
        routing: Routing,
    ) -> Response<Body> {
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
        let held = match self.leases.acquire(client.token(), &routing, &host).await {
            Ok(h) => h,
            Err(e) => return lease_refused(&e),
        };
        strip_hop_by_hop(req.headers_mut());
        if let Some((user, password)) = &held.backend.credentials
            && let Ok(value) = HeaderValue::from_str(&chain::basic(user, password))
        {
            req.headers_mut().insert(PROXY_AUTHORIZATION, value);
        }
        let answer = match chain::forward(&held.backend, req, self.settings.chain).await {
            Ok(a) => a,
            Err(e) => {
                self.leases
                    .report(client.token(), &held, ReportResult::Banned, &host)
                    .await;
                self.give_back(&client, &held).await;
                return chain_failed(Some(&e));
            }
        };
        if self.settings.ban_statuses.contains(&answer.status().as_u16()) {
            self.leases
                .report(client.token(), &held, ReportResult::Banned, &host)
                .await;
        }
        let (mut parts, body) = answer.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let gateway = self.clone();
        let release = move || {
            tokio::spawn(async move { gateway.give_back(&client, &held).await });
        };
        Response::from_parts(parts, Released::new(body, release).boxed())
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

/// A backend's answer body that calls `on_end` once it is done with (read to its end, or
/// dropped): the lease of a plain-HTTP request goes back then.
struct Released<F: FnOnce()> {
    body: Incoming,
    on_end: Option<F>,
}

impl<F: FnOnce()> Released<F> {
    fn new(body: Incoming, on_end: F) -> Self {
        Self {
            body,
            on_end: Some(on_end),
        }
    }
}

impl<F: FnOnce()> Drop for Released<F> {
    fn drop(&mut self) {
        if let Some(f) = self.on_end.take() {
            f();
        }
    }
}

impl<F: FnOnce() + Unpin> hyper::body::Body for Released<F> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
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
