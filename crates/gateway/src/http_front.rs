//! The HTTP front: `CONNECT` tunnels and plain-HTTP forward requests (absolute-form
//! `http://`), each through a proxy leased for it. A request without the client's credentials,
//! or with a username outside the grammar, gets 407 with `Proxy-Authenticate` and nothing is
//! dialled. The client's `Proxy-Authorization` and the hop-by-hop headers never reach a backend.
//!
//! hyper serves the client side (its head bounded and timed) and speaks to the backends.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::auth::ClientAuth;
use crate::chain::ChainError;
use crate::leases::LeaseError;
use crate::tunnels::Failure;
use crate::username;
use crate::{Gateway, Permit};

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
    crate::accept(listener, gateway, move |gateway, tcp, permit| {
        let acceptor = tls.acceptor();
        async move {
            let handshake = tokio::time::timeout(gateway.settings.head_timeout, acceptor.accept(tcp)).await;
            match handshake {
                Ok(Ok(stream)) => serve_connection(gateway, stream, permit).await,
                Ok(Err(_)) | Err(_) => gateway.metrics.refused("tls"),
            }
        }
    })
    .await;
}

async fn serve_connection<S>(gateway: Arc<Gateway>, tcp: S, permit: Permit)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let settings = gateway.settings.clone();
    let (stopping, closing) = (gateway.stopping.clone(), gateway.closing.clone());
    let counts = gateway.clone();
    let service = hyper::service::service_fn(move |req| {
        let (gateway, permit) = (gateway.clone(), permit.clone());
        async move { Ok::<_, Infallible>(gateway.handle(req, permit).await) }
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
            // The drain: the request being answered finishes, the connection takes no other;
            // at the end of the drain's budget it is closed whatever it is doing.
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                served = connection => served,
                () = closing.cancelled() => return,
            }
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
    async fn handle(self: Arc<Self>, req: Request<Incoming>, permit: Permit) -> Response<Body> {
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
            self.connect(req, client, routing, permit).await
        } else {
            self.forward(req, client, routing, permit).await
        }
    }
}

/// The headers meant for one hop only (RFC 9110 §7.6.1), and those the `Connection` header
/// names, taken out; with them the client's `Proxy-Authorization`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
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

pub(crate) fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

pub(crate) fn text(status: StatusCode, message: &str) -> Response<Body> {
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
        // The backend refused the destination by its rules: its status, passed on.
        Some(e @ ChainError::Refused(s @ (StatusCode::FORBIDDEN | StatusCode::BAD_REQUEST))) => {
            text(*s, &e.to_string())
        }
        Some(e) => text(StatusCode::BAD_GATEWAY, &e.to_string()),
        None => text(StatusCode::BAD_GATEWAY, "no backend proxy opened the tunnel"),
    }
}

/// The answer to a request that got no tunnel or backend.
pub(crate) fn refused(failure: &Failure) -> Response<Body> {
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
            chain_failed(Some(&ChainError::Refused(StatusCode::BAD_REQUEST))).status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            chain_failed(Some(&ChainError::Refused(StatusCode::PROXY_AUTHENTICATION_REQUIRED))).status(),
            StatusCode::BAD_GATEWAY,
            "a backend refusing the gateway's credentials is the gateway's problem, not the client's"
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
