//! The HTTP side: listening, the middleware chain and routing.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::middleware::Next;
use axum::routing::{delete, get, post};
use bytes::Bytes;
use egress_http::{Body, Limits, Router};
use futures::FutureExt as _;
use http::{Method, Request, Response, header};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{Answer, DiscoveryApi, error};

/// The largest request body (64 KiB); a larger one is `400 invalid_body`.
pub const MAX_BODY: usize = 64 * 1024;

/// A request's body must arrive within this.
const READ_BUDGET: Duration = Duration::from_secs(10);

fn respond((status, body): Answer) -> Response<Body> {
    let mut builder = Response::builder().status(status);
    let bytes = match body {
        Some(encoded) => {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
            Bytes::from(encoded)
        }
        None => Bytes::new(),
    };
    builder.body(Body::from(bytes)).unwrap_or_default()
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
        ["v1", "leases", _, "renew"] => "/v1/leases/{id}/renew",
        ["v1", "sessions", _, "report"] => "/v1/sessions/{session}/report",
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

/// The routes and the chain every request passes, outermost first: observe (a server span
/// continuing the client's trace from `traceparent`, the request log, and recovery: a panic is
/// a 500, never a dead connection; `/healthz` is neither traced nor logged) → auth (before any
/// byte of the body is read) → the route; around it all, the JSON envelope for the answers the
/// router makes itself (405 with `Allow`). `GET` routes answer `HEAD` too.
pub fn router(api: Arc<DiscoveryApi>) -> Router {
    use tower::Layer as _;
    let routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route("/v1/proxies", get(list))
        .route("/v1/whoami", get(whoami))
        .route("/v1/leases", post(acquire))
        .route("/v1/leases/{id}", delete(release))
        .route("/v1/leases/{id}/report", post(report))
        .route("/v1/leases/{id}/renew", post(renew))
        .route("/v1/sessions/{session}/report", post(report_session))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(api.clone(), admit))
        .layer(axum::middleware::from_fn_with_state(api.clone(), authenticate))
        .layer(axum::middleware::from_fn(observe))
        .with_state(api);
    // Around the whole router: the method router adds `Allow` outside any route layer.
    Router::new().fallback_service(axum::middleware::map_response(envelope).layer(routes))
}

type Shared = State<Arc<DiscoveryApi>>;

async fn healthz() -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from("ok"))
        .unwrap_or_default()
}

async fn openapi() -> Response<Body> {
    respond((200, Some(crate::openapi::TEXT.as_bytes().to_vec())))
}

/// The scope of the request's client (put there by `authenticate`); `None`: it sees every
/// proxy. Release and report need none: a lease id is 128 random bits only its holder was told,
/// and a scoped client is granted leases in its scope only.
fn scope(api: &DiscoveryApi, req: &Request<Body>) -> Option<Arc<crate::ClientScope>> {
    let client = req.extensions().get::<crate::ClientName>()?;
    api.scopes.of(client.as_str())
}

async fn list(State(api): Shared, req: Request<Body>) -> Response<Body> {
    let scope = scope(&api, &req);
    respond(api.list(scope.as_deref(), req.uri().query()).await)
}

/// The caller's client: what a gateway checks a client's token with before it routes for it.
async fn whoami(req: Request<Body>) -> Response<Body> {
    let client = req.extensions().get::<crate::ClientName>().cloned().unwrap_or_default();
    let answer = crate::wire::WhoAmI {
        client: client.as_str().into(),
    };
    respond((200, serde_json::to_vec(&answer).ok()))
}

async fn acquire(State(api): Shared, req: Request<Body>) -> Response<Body> {
    let scope = scope(&api, &req);
    // Sessions are the client's: without authentication every caller is `default`.
    let client = req.extensions().get::<crate::ClientName>().cloned().unwrap_or_default();
    match body(req).await {
        Ok(body) => respond(api.acquire(&client, scope.as_deref(), &body).await),
        Err(answer) => respond(answer),
    }
}

async fn release(State(api): Shared, req: Request<Body>) -> Response<Body> {
    respond(api.release(lease_id(&req)).await)
}

async fn report(State(api): Shared, req: Request<Body>) -> Response<Body> {
    let id = lease_id(&req).to_owned();
    match body(req).await {
        Ok(body) => respond(api.report(&id, &body).await),
        Err(answer) => respond(answer),
    }
}

async fn renew(State(api): Shared, req: Request<Body>) -> Response<Body> {
    let id = lease_id(&req).to_owned();
    match body(req).await {
        Ok(body) => respond(api.renew(&id, &body).await),
        Err(answer) => respond(answer),
    }
}

async fn report_session(State(api): Shared, req: Request<Body>) -> Response<Body> {
    let client = req.extensions().get::<crate::ClientName>().cloned().unwrap_or_default();
    // `/v1/sessions/{session}/report`: the third segment, as sent (a session name needs no
    // escaping; one that does is refused as a name).
    let session = req.uri().path().split('/').nth(3).unwrap_or_default().to_owned();
    match body(req).await {
        Ok(body) => respond(api.report_session(&client, &session, &body).await),
        Err(answer) => respond(answer),
    }
}

async fn not_found() -> Response<Body> {
    respond(error(404, "not_found", "no such endpoint"))
}

/// The `{id}` of `/v1/leases/{id}[/report|/renew]`, as sent (lease ids need no escaping; one that
/// does names no lease).
fn lease_id<B>(req: &Request<B>) -> &str {
    req.uri().path().split('/').nth(3).unwrap_or_default()
}

/// The body, within the 64 KiB cap and the read budget.
async fn body(req: Request<Body>) -> Result<Bytes, Answer> {
    egress_http::read_body(req.into_body(), MAX_BODY, READ_BUDGET)
        .await
        .map_err(|e| match e {
            egress_http::BodyError::TooLarge(_) | egress_http::BodyError::Broken => {
                error(400, "invalid_body", "the body is over 64 KiB or could not be read")
            }
            egress_http::BodyError::TooSlow => error(400, "invalid_body", "the body did not arrive in time"),
        })
}

/// Every request but `GET /healthz` carries a configured bearer token, or is answered 401
/// before its body is read. The token's client goes into the request's extensions, for what
/// runs after, and into the response's, for the request log outside.
async fn authenticate(State(api): Shared, mut req: Request<Body>, next: Next) -> Response<Body> {
    let public = matches!(*req.method(), Method::GET | Method::HEAD) && req.uri().path() == "/healthz";
    if public {
        return next.run(req).await;
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes);
    let Some(client) = api.auth.client(authorization) else {
        api.admission.metrics().answered("", 401);
        return respond(error(401, "unauthorized", "missing or invalid bearer token"));
    };
    req.extensions_mut().insert(client.clone());
    let mut response = next.run(req).await;
    response.extensions_mut().insert(client);
    response
}

/// Admits every authenticated request before any byte of its body is read (see
/// [`crate::admission`]): served now, after its turn, or refused with `Retry-After`. Every
/// answer is counted by client and status code.
async fn admit(State(api): Shared, req: Request<Body>, next: Next) -> Response<Body> {
    let Some(client) = req.extensions().get::<crate::ClientName>().cloned() else {
        // `GET /healthz`: neither authenticated nor admitted.
        return next.run(req).await;
    };
    let response = match api.admission.admit(&client).await {
        Ok(permit) => {
            let response = next.run(req).await;
            drop(permit);
            response
        }
        Err(refusal) => refused(refusal, &req),
    };
    api.admission
        .metrics()
        .answered(client.as_str(), response.status().as_u16());
    response
}

/// The answer to a request admission refused: `429 rate_limited` (its client's budget) or
/// `503 overloaded` (the whole server), with `Retry-After`. A request that announced a body
/// leaves it unread, so on HTTP/1 its connection is closed after the answer, as the
/// connection cap's `overloaded` does.
fn refused(refusal: crate::admission::Refusal, req: &Request<Body>) -> Response<Body> {
    use axum::body::HttpBody as _;
    let mut response = match refusal {
        crate::admission::Refusal::Overloaded => respond(error(
            503,
            "overloaded",
            "the server has been busy too long to serve this request; try again after Retry-After",
        )),
        _ => respond(error(
            429,
            "rate_limited",
            "this client is over its request budget; try again after Retry-After",
        )),
    };
    let headers = response.headers_mut();
    headers.insert(
        header::RETRY_AFTER,
        http::HeaderValue::from(refusal.retry_after_seconds()),
    );
    if !req.body().is_end_stream() && req.version() < http::Version::HTTP_2 {
        headers.insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    response
}

/// Wraps the router's own bodiless error answers (405 with `Allow`) in the JSON envelope.
async fn envelope(response: Response<Body>) -> Response<Body> {
    let ours = matches!(response.status().as_u16(), 404 | 405);
    if !ours || response.headers().contains_key(header::CONTENT_TYPE) {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let (code, message) = match parts.status.as_u16() {
        405 => {
            let allowed = parts
                .headers
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            ("method_not_allowed", format!("{allowed} only"))
        }
        _ => ("not_found", "no such endpoint".to_owned()),
    };
    let (status, body) = error(parts.status.as_u16(), code, &message);
    parts.status = http::StatusCode::from_u16(status).unwrap_or(parts.status);
    parts
        .headers
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body.unwrap_or_default()))
}

/// The serving stack's own answers, in the envelope.
fn rejection(rejection: egress_http::Rejection) -> Response<Body> {
    let mut response = match rejection {
        egress_http::Rejection::Overloaded => respond(error(
            503,
            "overloaded",
            "the server is at its connection limit; try again shortly",
        )),
        egress_http::Rejection::HeadersTooLarge => respond(error(
            431,
            "headers_too_large",
            "the request line and headers are over the server's limit (16 KiB unless configured otherwise)",
        )),
    };
    if rejection == egress_http::Rejection::Overloaded {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    response
}

async fn observe(req: Request<Body>, next: Next) -> Response<Body> {
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
    let inner = std::panic::AssertUnwindSafe(next.run(req).instrument(span.clone())).catch_unwind();
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
            client = response.extensions().get::<crate::ClientName>().map(crate::ClientName::as_str),
            duration = %go_duration(started.elapsed()),
            "request"
        );
    }
    response
}

/// Serves the API on `listener` within `limits` until `shutdown`, then drains.
pub async fn serve(listener: TcpListener, api: Arc<DiscoveryApi>, limits: Limits, shutdown: CancellationToken) {
    serve_tls(listener, api, limits, None, shutdown).await;
}

/// [`serve`], over TLS with the certificate `tls` holds (a renewal serves the next
/// connection); plain HTTP without.
pub async fn serve_tls(
    listener: TcpListener,
    api: Arc<DiscoveryApi>,
    limits: Limits,
    tls: Option<egress_http::tls_files::CurrentTls>,
    shutdown: CancellationToken,
) {
    if matches!(api.auth, crate::Auth::None) {
        tracing::warn!(
            target: "discovery",
            "--discovery-auth=none: the discovery API serves anyone who can reach it"
        );
    }
    let mut server = egress_http::Server::new("discovery").limits(limits).rejecter(rejection);
    if let Some(tls) = tls {
        server = server.tls(tls);
    }
    server.serve(listener, router(api), shutdown).await;
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

    struct NoProxies;

    impl crate::ProxyDirectory for NoProxies {
        fn proxies(&self) -> Result<Arc<crate::Fleet>, String> {
            Ok(Arc::default())
        }
    }

    /// What a route behind `authenticate` learns of its caller: the client's name, or
    /// `anonymous` when the request carries none.
    async fn whose(auth: crate::Auth, authorization: Option<&str>) -> (u16, String, Option<crate::ClientName>) {
        use http_body_util::BodyExt as _;
        use tower::ServiceExt as _;
        let api = Arc::new(DiscoveryApi {
            directory: Arc::new(NoProxies),
            store: Arc::new(egress_lease::MemoryStore::new(
                Arc::new(egress_lease::SystemClock),
                Duration::from_secs(60),
            )),
            max_ttl: Duration::from_secs(60),
            auth,
            refusals: None,
            admission: crate::Admission::default(),
            scopes: crate::Scopes::default(),
            max_sessions: crate::DEFAULT_MAX_SESSIONS,
        });
        let routes = Router::new()
            .route(
                "/v1/proxies",
                get(|req: Request<Body>| async move {
                    let client = req.extensions().get::<crate::ClientName>();
                    client.map_or_else(|| "anonymous".to_owned(), ToString::to_string)
                }),
            )
            .layer(axum::middleware::from_fn_with_state(api.clone(), admit))
            .layer(axum::middleware::from_fn_with_state(api.clone(), authenticate))
            .with_state(api);
        let mut req = Request::get("/v1/proxies");
        if let Some(value) = authorization {
            req = req.header(header::AUTHORIZATION, value);
        }
        let response = routes.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let logged = response.extensions().get::<crate::ClientName>().cloned();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned(), logged)
    }

    #[tokio::test]
    async fn the_caller_s_client_reaches_the_route_and_the_request_log() {
        let set = crate::TokenSet::new(vec!["t1".into()]);
        let auth = crate::Auth::Tokens(Arc::new(set));
        let (status, seen, logged) = whose(auth.clone(), Some("Bearer t1")).await;
        assert_eq!((status, seen.as_str()), (200, "default"));
        assert_eq!(logged, Some(crate::ClientName::default()));
        let (status, _, logged) = whose(auth, Some("Bearer t2")).await;
        assert_eq!((status, logged), (401, None));
        let (status, seen, _) = whose(crate::Auth::None, None).await;
        assert_eq!((status, seen.as_str()), (200, "default"));
    }

    #[test]
    fn spans_are_named_from_the_route_pattern() {
        assert_eq!(
            pattern(&Method::POST, "/v1/leases/ABC/report"),
            "POST /v1/leases/{id}/report"
        );
        assert_eq!(pattern(&Method::DELETE, "/v1/leases/ABC"), "DELETE /v1/leases/{id}");
        assert_eq!(pattern(&Method::GET, "/v1/proxies"), "GET /v1/proxies");
        assert_eq!(
            pattern(&Method::POST, "/v1/sessions/login-1/report"),
            "POST /v1/sessions/{session}/report"
        );
        assert_eq!(pattern(&Method::GET, "/nope"), "GET unmatched");
    }
}
