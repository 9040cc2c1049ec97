//! The two small HTTP servers every replica runs: health probes (`/healthz`, `/readyz`) and
//! metrics (`/metrics`, Prometheus text format).
//!
//! Metrics are served as controller-runtime serves them: plain HTTP with `--metrics-secure=false`;
//! otherwise HTTPS with a self-signed certificate made at start, and only for callers whose bearer
//! token the API server accepts (TokenReview) and who may `get` the `/metrics` path
//! (SubjectAccessReview). HTTP/2 is off unless `--enable-http2`, and then offered over HTTPS by
//! ALPN (plain HTTP is always HTTP/1.1, as Go's server speaks it without h2c).
//!
//! Both run on the shared stack of `egress-http` (connection cap `--max-connections`, header,
//! write and idle budgets, drain at shutdown) and answer in plain text, as controller-runtime's do.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use egress_http::{Body, Limits, Router};
use http::{HeaderMap, Request, Response, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::PostParams;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A request's headers must arrive within this, and an authn/authz review answer too.
const BUDGET: Duration = Duration::from_secs(10);

/// Turns a Go listen address into one to bind: `:8080` is every interface (IPv6 and IPv4, as
/// Go listens; [`listen`] falls back to IPv4 alone on a host without IPv6).
///
/// # Errors
///
/// Not `host:port` with a numeric port.
pub fn bind_address(flag: &str, value: &str) -> Result<SocketAddr, String> {
    let full = if value.starts_with(':') {
        format!("[::]{value}")
    } else {
        value.replace("localhost:", "127.0.0.1:")
    };
    full.parse()
        .map_err(|_| format!("--{flag}={value:?} is not an address (host:port, :port, or 0 to disable)"))
}

/// Binds `addr`; `[::]` falls back to `0.0.0.0` on a host without IPv6.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    match TcpListener::bind(addr).await {
        Err(_) if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED => {
            TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], addr.port()))).await
        }
        other => other,
    }
}

fn text(status: StatusCode, body: impl Into<Body>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(body.into())
        .unwrap_or_default()
}

async fn page_not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// Serves `/healthz` and `/readyz` (plain pings: a replica that answers is alive and ready; no
/// provider is consulted) until `shutdown`.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn probes(addr: SocketAddr, limits: Limits, shutdown: CancellationToken) -> Result<SocketAddr, String> {
    let listener = listen(addr)
        .await
        .map_err(|e| format!("binding the health probe address {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let ok = || async { text(StatusCode::OK, "ok") };
    let router = Router::new()
        .route("/healthz", get(ok))
        .route("/readyz", get(ok))
        .fallback(page_not_found);
    let server = egress_http::Server::new("health probes").limits(limits);
    tokio::spawn(server.serve(listener, router, shutdown));
    Ok(bound)
}

/// How long an authentication and authorisation answer is reused for the same token and path.
const REVIEW_TTL: Duration = Duration::from_secs(10);
/// Remembered answers at most; the memory is cleared when full.
const REVIEW_CACHE: usize = 1024;
/// Reviews in flight at most: a flood of made-up tokens costs the API server a bounded load.
const REVIEWS_AT_ONCE: usize = 4;

type Denied = (StatusCode, &'static str);

/// Remembered answers: SHA-256 of (token, path) to the answer and when it was given.
type Answers = std::collections::HashMap<[u8; 32], (Result<(), Denied>, std::time::Instant)>;

/// Who may read metrics when they are served securely: callers the API server authenticates
/// and authorises ([`Guard::new`]), or, for a program with no Kubernetes API access, callers
/// presenting one configured token ([`Guard::token`]).
#[derive(Clone)]
pub struct Guard(Check);

#[derive(Clone)]
enum Check {
    Reviewed(Reviews),
    /// SHA-256 of the one token taken: compared digest to digest, so a wrong token's length
    /// or first bytes tell nothing.
    Token([u8; 32]),
}

/// The API server's reviews, remembered.
#[derive(Clone)]
struct Reviews {
    client: kube::Client,
    /// SHA-256 of (token, path): the answer and when it was given. Tokens are not kept.
    answers: Arc<Mutex<Answers>>,
    reviews: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").finish_non_exhaustive()
    }
}

const INTERNAL: Denied = (StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error");
const UNAUTHORIZED: Denied = (StatusCode::UNAUTHORIZED, "Unauthorized");

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for part in parts {
        h.update(part);
    }
    h.finalize().into()
}

impl Guard {
    /// Callers whose bearer token the API server accepts (TokenReview) and who may `get` the
    /// path (SubjectAccessReview).
    pub fn new(client: kube::Client) -> Self {
        Self(Check::Reviewed(Reviews {
            client,
            answers: Arc::default(),
            reviews: Arc::new(tokio::sync::Semaphore::new(REVIEWS_AT_ONCE)),
        }))
    }

    /// Callers whose bearer token is `token`.
    pub fn token(token: &str) -> Self {
        Self(Check::Token(sha256(&[token.as_bytes()])))
    }

    /// `Ok` when the bearer token belongs to someone allowed to `get` the request's path;
    /// otherwise the status to answer (401 unauthenticated, 403 forbidden, 500 the review failed).
    async fn check(&self, headers: &HeaderMap, path: &str) -> Result<(), Denied> {
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
            .filter(|t| !t.is_empty())
            .ok_or(UNAUTHORIZED)?;
        match &self.0 {
            Check::Token(taken) if *taken == sha256(&[token.as_bytes()]) => Ok(()),
            Check::Token(_) => Err(UNAUTHORIZED),
            Check::Reviewed(reviews) => reviews.check(token, path).await,
        }
    }
}

impl Reviews {
    async fn check(&self, token: &str, path: &str) -> Result<(), Denied> {
        let key = sha256(&[token.as_bytes(), &[0], path.as_bytes()]);
        if let Some((answer, at)) = self.answers.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && at.elapsed() < REVIEW_TTL
        {
            return *answer;
        }
        let _permit = tokio::time::timeout(BUDGET, self.reviews.acquire())
            .await
            .map_err(|_| INTERNAL)?
            .map_err(|_| INTERNAL)?;
        let answer = self.review(token, path).await;
        if answer != Err(INTERNAL) {
            let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
            if answers.len() >= REVIEW_CACHE {
                answers.clear();
            }
            answers.insert(key, (answer, std::time::Instant::now()));
        }
        answer
    }

    /// Creates a review (cluster-scoped, never stored) within the budget; any failure is a 500.
    async fn create<K>(&self, review: &K, what: &str) -> Result<K, Denied>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: kube::Api<K> = kube::Api::all(self.client.clone());
        tokio::time::timeout(BUDGET, api.create(&PostParams::default(), review))
            .await
            .map_err(|_| INTERNAL)?
            .map_err(|e| {
                // The token is in the request, never in the error.
                tracing::info!(error = %e, "metrics {what} review failed");
                INTERNAL
            })
    }

    async fn review(&self, token: &str, path: &str) -> Result<(), Denied> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = self.create(&review, "authentication").await?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(UNAUTHORIZED);
        }
        let user = status.user.unwrap_or_default();
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = self.create(&sar, "authorization").await?;
        if answer.status.is_some_and(|s| s.allowed) {
            Ok(())
        } else {
            Err((StatusCode::FORBIDDEN, "Forbidden"))
        }
    }
}

/// What the metrics route reads.
#[derive(Clone)]
struct Metrics {
    registry: Arc<Mutex<Registry>>,
    guard: Option<Guard>,
}

async fn scrape(State(metrics): State<Metrics>, req: Request<Body>) -> Response<Body> {
    if let Some(guard) = &metrics.guard
        && let Err((status, message)) = guard.check(req.headers(), req.uri().path()).await
    {
        return text(status, message);
    }
    let mut body = String::new();
    let encoded = {
        let registry = metrics.registry.lock().unwrap_or_else(|p| p.into_inner());
        prometheus_client::encoding::text::encode(&mut body, &registry)
    };
    match encoded {
        Ok(()) => Response::builder()
            .header(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(Body::from(body))
            .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed")),
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed"),
    }
}

/// Serves `/metrics` from `registry` until `shutdown`. With a guard, over HTTPS and only for
/// authorised callers.
///
/// # Errors
///
/// The address cannot be bound, or the certificate cannot be made.
pub async fn metrics(
    addr: SocketAddr,
    registry: Arc<Mutex<Registry>>,
    guard: Option<Guard>,
    http2: bool,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<SocketAddr, String> {
    let mut server = egress_http::Server::new("metrics").limits(limits);
    if guard.is_some() {
        server = server.tls(self_signed(http2)?);
    }
    let listener = listen(addr)
        .await
        .map_err(|e| format!("binding the metrics address {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let router = Router::new()
        .route("/metrics", get(scrape))
        .fallback(page_not_found)
        .with_state(Metrics { registry, guard });
    tokio::spawn(server.serve(listener, router, shutdown));
    Ok(bound)
}

/// A certificate for `localhost` and the pod's names, made in memory at start (controller-runtime
/// does the same when no certificate is mounted). Scrapers skip verification or pin it.
fn self_signed(http2: bool) -> Result<tokio_rustls::TlsAcceptor, String> {
    let mut names = vec!["localhost".to_string()];
    if let Ok(pod) = std::env::var("POD_NAME") {
        names.push(pod);
    }
    let key = rcgen::KeyPair::generate().map_err(|e| format!("making the metrics key: {e}"))?;
    let cert = rcgen::CertificateParams::new(names)
        .and_then(|p| p.self_signed(&key))
        .map_err(|e| format!("making the metrics certificate: {e}"))?;
    let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key_der)
        .map_err(|e| format!("loading the metrics certificate: {e}"))?;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_guard_takes_its_token_only() {
        let guard = Guard::token("s3cret");
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, http::HeaderValue::from_static(v));
            h
        };
        assert_eq!(guard.check(&with("Bearer s3cret"), "/metrics").await, Ok(()));
        assert_eq!(guard.check(&with("bearer s3cret"), "/metrics").await, Ok(()));
        for wrong in [
            with("Bearer s3cre"),
            with("Basic s3cret"),
            with("Bearer "),
            HeaderMap::new(),
        ] {
            assert_eq!(guard.check(&wrong, "/metrics").await, Err(UNAUTHORIZED));
        }
    }

    #[test]
    fn go_listen_addresses() {
        assert_eq!(bind_address("x", ":8080").unwrap(), "[::]:8080".parse().unwrap());
        assert_eq!(
            bind_address("x", "127.0.0.1:9").unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            bind_address("x", "localhost:9").unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            bind_address("metrics-bind-address", "8080").unwrap_err(),
            "--metrics-bind-address=\"8080\" is not an address (host:port, :port, or 0 to disable)"
        );
    }
}
