//! The HTTP side: listening, the middleware chain and routing.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt as _;
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{Answer, Api, error};

/// The largest request body (64 KiB); a larger one is `400 invalid_body`.
pub const MAX_BODY: usize = 64 * 1024;

/// A request's head must arrive within this, and its body within the read budget.
const HEADER_BUDGET: Duration = Duration::from_secs(5);
const READ_BUDGET: Duration = Duration::from_secs(10);
/// How long open connections get to finish at shutdown.
const DRAIN_BUDGET: Duration = Duration::from_secs(5);

type Body = Full<Bytes>;

fn respond((status, body): Answer) -> Response<Body> {
    let mut builder = Response::builder().status(status);
    let bytes = match body {
        Some(encoded) => {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
            Bytes::from(encoded)
        }
        None => Bytes::new(),
    };
    builder
        .body(Full::new(bytes))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// A duration the way Go prints one (`1m0s`, `1.5ms`, `250µs`): the request log writes it as
/// a string, as the Go operator did.
fn go_duration(d: Duration) -> String {
    GoDuration(d).to_string()
}

struct GoDuration(Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000_000_000 {
            let (unit, per) = match nanos {
                n if n < 1_000 => return write!(f, "{n}ns"),
                n if n < 1_000_000 => ("µs", 1_000u128),
                _ => ("ms", 1_000_000u128),
            };
            return write!(f, "{}{unit}", trim_fraction(nanos, per));
        }
        let secs = nanos / 1_000_000_000;
        let (h, m) = (secs / 3600, (secs / 60) % 60);
        let seconds = trim_fraction(nanos % 60_000_000_000, 1_000_000_000);
        if h > 0 {
            write!(f, "{h}h{m}m{seconds}s")
        } else if m > 0 {
            write!(f, "{m}m{seconds}s")
        } else {
            write!(f, "{seconds}s")
        }
    }
}

fn trim_fraction(value: u128, per: u128) -> String {
    let whole = value / per;
    let rest = value % per;
    if rest == 0 {
        return whole.to_string();
    }
    let width = per.to_string().len() - 1;
    let digits = format!("{rest:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Routes a request whose body is already read.
async fn route(api: &Api, method: &Method, path: &str, query: Option<&str>, body: &[u8]) -> Answer {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["healthz"] => match *method {
            Method::GET => (200, None),
            _ => error(405, "method_not_allowed", "GET only"),
        },
        ["openapi.json"] => match *method {
            Method::GET => (200, Some(crate::openapi::TEXT.as_bytes().to_vec())),
            _ => error(405, "method_not_allowed", "GET only"),
        },
        ["v1", "proxies"] => match *method {
            Method::GET => api.list(query).await,
            _ => error(405, "method_not_allowed", "GET only"),
        },
        ["v1", "leases"] => match *method {
            Method::POST => api.acquire(body).await,
            _ => error(405, "method_not_allowed", "POST only"),
        },
        ["v1", "leases", id] if !id.is_empty() => match *method {
            Method::DELETE => api.release(id).await,
            _ => error(405, "method_not_allowed", "DELETE only"),
        },
        ["v1", "leases", id, "report"] if !id.is_empty() => match *method {
            Method::POST => api.report(id, body).await,
            _ => error(405, "method_not_allowed", "POST only"),
        },
        _ => error(404, "not_found", "no such endpoint"),
    }
}

/// The route pattern a path matches, which names the request's span (`POST /v1/leases/{id}/report`).
fn pattern(method: &Method, path: &str) -> String {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let route = match segments.as_slice() {
        ["healthz"] => "/healthz",
        ["openapi.json"] => "/openapi.json",
        ["v1", "proxies"] => "/v1/proxies",
        ["v1", "leases"] => "/v1/leases",
        ["v1", "leases", _] => "/v1/leases/{id}",
        ["v1", "leases", _, "report"] => "/v1/leases/{id}/report",
        _ => "unmatched",
    };
    format!("{method} {route}")
}

/// Reads W3C trace context from request headers.
struct Headers<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// One request through the chain: recover → tracing (a server span, continuing the client's
/// trace from `traceparent`; `/healthz` is not traced) → request log → body cap → auth → route.
async fn handle(api: Arc<Api>, req: Request<Incoming>) -> Response<Body> {
    use opentelemetry::propagation::TextMapPropagator as _;
    use tracing::Instrument as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let traced = path != "/healthz";
    let span = if traced {
        let span = tracing::info_span!(
            "discovery request",
            otel.name = tracing::field::Empty,
            otel.kind = "server",
            http.route = tracing::field::Empty,
            http.status_code = tracing::field::Empty
        );
        // Only a span someone records costs its name and the trace context.
        if !span.is_disabled() {
            let name = pattern(&method, &path);
            span.record("otel.name", name.as_str());
            span.record("http.route", name.as_str());
            // NB: an explicit W3C propagator, not the global one, as the Go operator did.
            let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Headers(req.headers()));
            let _ = span.set_parent(parent);
        }
        span
    } else {
        tracing::Span::none()
    };
    let inner = std::panic::AssertUnwindSafe(handle_inner(api, req).instrument(span.clone())).catch_unwind();
    let response = match inner.await {
        Ok(r) => r,
        Err(_) => {
            // Logged outside the request's span, with the server's own logger.
            tracing::error!(target: "discovery", method = %method, path = %path, "a handler panicked");
            respond(error(500, "internal", "internal error"))
        }
    };
    if traced {
        span.record("http.status_code", response.status().as_u16());
        tracing::info!(
            target: "discovery",
            parent: &span,
            method = %method,
            path = %path,
            status = response.status().as_u16(),
            duration = %go_duration(started.elapsed()),
            "request"
        );
    }
    response
}

async fn handle_inner(api: Arc<Api>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    // Auth first: a stranger's body is never read.
    let public = parts.method == Method::GET && parts.uri.path() == "/healthz";
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes);
    if !public && !api.auth.allows(authorization) {
        return respond(error(401, "unauthorized", "missing or invalid bearer token"));
    }
    // Then the cap: a body over it is never read whole.
    let body = match tokio::time::timeout(READ_BUDGET, Limited::new(body, MAX_BODY).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(_)) => Err(error(
            400,
            "invalid_body",
            "the body is over 64 KiB or could not be read",
        )),
        Err(_) => Err(error(400, "invalid_body", "the body did not arrive in time")),
    };
    let body = match body {
        Ok(b) => b,
        // Only routes that read a body care; the others answer as usual.
        Err(answer) if matches!(parts.method, Method::POST) => return respond(answer),
        Err(_) => Bytes::new(),
    };
    if parts.uri.path() == "/healthz" && parts.method == Method::GET {
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from_static(b"ok")))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
    }
    respond(route(&api, &parts.method, parts.uri.path(), parts.uri.query(), &body).await)
}

/// Serves the API on `listener` until `shutdown`, then gives open connections a few seconds.
pub async fn serve(listener: TcpListener, api: Arc<Api>, shutdown: CancellationToken) {
    if matches!(api.auth, crate::Auth::None) {
        tracing::warn!(
            target: "discovery",
            "--discovery-auth=none: the discovery API serves anyone who can reach it"
        );
    }
    let connections = tokio_util::task::TaskTracker::new();
    let mut pause = Duration::ZERO;
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    pause = Duration::ZERO;
                    stream
                }
                Err(e) => {
                    pause = (pause * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    tracing::error!(target: "discovery", error = %e, "accepting a connection failed");
                    tokio::time::sleep(pause).await;
                    continue;
                }
            },
        };
        let api = api.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(handle(api, req).await) }
            });
            // HTTP/1.1 only: crawlers speak HTTP/1, and detecting HTTP/2 costs every connection.
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(HEADER_BUDGET);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    tokio::time::timeout(DRAIN_BUDGET, conn).await.unwrap_or(Ok(()))
                }
            };
            if let Err(e) = result {
                tracing::error!(target: "discovery", error = %e, "serving a connection failed");
            }
        });
    }
    connections.close();
    let _ = tokio::time::timeout(DRAIN_BUDGET, connections.wait()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_go_writes_them() {
        assert_eq!(go_duration(Duration::from_nanos(800)), "800ns");
        assert_eq!(go_duration(Duration::from_micros(250)), "250µs");
        assert_eq!(go_duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(go_duration(Duration::from_secs(2)), "2s");
        for (nanos, text) in [
            (0, "0s"),
            (60_000_000_000, "1m0s"),
            (5_400_000_000_000, "1h30m0s"),
            (500_000_000, "500ms"),
            (1_500_000_000, "1.5s"),
            (1_234_567, "1.234567ms"),
        ] {
            assert_eq!(go_duration(Duration::from_nanos(nanos)), text);
        }
    }

    #[test]
    fn spans_are_named_from_the_route_pattern() {
        assert_eq!(
            pattern(&Method::POST, "/v1/leases/ABC/report"),
            "POST /v1/leases/{id}/report"
        );
        assert_eq!(pattern(&Method::DELETE, "/v1/leases/ABC"), "DELETE /v1/leases/{id}");
        assert_eq!(pattern(&Method::GET, "/v1/proxies"), "GET /v1/proxies");
        assert_eq!(pattern(&Method::GET, "/nope"), "GET unmatched");
    }
}
