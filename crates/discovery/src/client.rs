//! A typed client of the API, for crawler code: list, acquire (in a sticky session, too),
//! renew, release, report, with the error envelope mapped to [`ClientError`]. It needs nothing
//! of the operator.
//!
//! ```no_run
//! # async fn crawl() -> Result<(), egress_discovery::client::ClientError> {
//! use egress_discovery::client::{AcquireRequest, Client, ReportResult};
//! let api = Client::new("http://discovery:8090", Some("token".into()))?;
//! let lease = api
//!     .acquire(&AcquireRequest { target: Some("example.com".into()), ..Default::default() })
//!     .await?;
//! // ... crawl through lease.proxy.proxy_url(): http://ip:port, with the credentials when the
//! // proxy demands them ...
//! api.report(&lease.lease_id, ReportResult::RateLimited, None).await?;
//! api.release(&lease.lease_id).await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

pub use egress_lease::ReportResult;

use crate::wire;

/// A proxy as the list shows it: the API's [`wire::ProxyView`], owned.
pub type ProxyView = wire::ProxyView<'static>;
/// A leased proxy: the API's [`wire::LeasedProxy`], owned. Its `Debug` never shows the password
/// or the URL that holds it; [`wire::LeasedProxy::proxy_url`] is what an HTTP client takes.
pub type LeasedProxy = wire::LeasedProxy<'static>;
/// A lease granted: the API's [`wire::Lease`], owned.
pub type Lease = wire::Lease<'static>;

/// What to borrow: the API's [`wire::LeaseRequest`].
pub type AcquireRequest = wire::LeaseRequest;

/// Which proxies to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub healthy: Option<bool>,
    /// Every attribute must match exactly.
    pub attributes: BTreeMap<String, String>,
}

/// What went wrong, by the API's error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    #[error("invalid body: {0}")]
    InvalidBody(String),
    #[error("invalid ttl: {0}")]
    InvalidTtl(String),
    #[error("invalid result: {0}")]
    InvalidResult(String),
    /// A target over 2 KiB.
    #[error("invalid target: {0}")]
    InvalidTarget(String),
    /// A session name outside 1 to 64 of `A-Za-z0-9_-`.
    #[error("invalid session: {0}")]
    InvalidSession(String),
    /// Starting the session would pass the client's cap of live sessions.
    #[error("too many sessions: {0}")]
    TooManySessions(String),
    /// The lease's proxy is draining, a standby, gone or unhealthy: the lease runs to its
    /// expiry as it was; acquire another.
    #[error("not renewable: {0}")]
    NotRenewable(String),
    #[error(
        "no match: {message} ({considered} considered: {unhealthy} unhealthy, {at_capacity} at capacity, {in_cooldown} in cooldown)"
    )]
    NoMatch {
        message: String,
        considered: u64,
        at_capacity: u64,
        in_cooldown: u64,
        unhealthy: u64,
    },
    #[error("unknown lease: {0}")]
    UnknownLease(String),
    /// A report on a session the client holds no live lease for.
    #[error("unknown session: {0}")]
    UnknownSession(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    /// The server is at its connection limit; worth retrying shortly.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// The request line and headers are over 16 KiB.
    #[error("headers too large: {0}")]
    HeadersTooLarge(String),
    #[error("the operator failed: {0}")]
    Internal(String),
    /// The shared lease store cannot be reached; nothing was changed. Worth retrying.
    #[error("lease store unavailable: {0}")]
    StoreUnavailable(String),
    /// The caller's client is over its budget (`429`), still after the retries the call's
    /// budget allowed; `retry_after` is the server's `Retry-After`.
    #[error("rate limited (retry after {retry_after:?}): {message}")]
    RateLimited { message: String, retry_after: Duration },
    /// An answer outside the API's contract (a proxy in between, a wrong URL).
    #[error("unexpected answer {status}: {body}")]
    Unexpected { status: u16, body: String },
    /// The request did not get an answer (connection, timeout).
    #[error("transport: {0}")]
    Transport(String),
}

/// The longest body of an unexpected answer kept in the error.
const MAX_UNEXPECTED: usize = 512;

fn from_answer(status: u16, body: &str) -> ClientError {
    let Ok(e) = serde_json::from_str::<wire::ErrorBody<'static>>(body) else {
        return ClientError::Unexpected {
            status,
            body: body.chars().take(MAX_UNEXPECTED).collect(),
        };
    };
    let message = e.message.into_owned();
    match &*e.error {
        "unauthorized" => ClientError::Unauthorized(message),
        "invalid_query" => ClientError::InvalidQuery(message),
        "invalid_body" => ClientError::InvalidBody(message),
        "invalid_ttl" => ClientError::InvalidTtl(message),
        "invalid_result" => ClientError::InvalidResult(message),
        "invalid_target" => ClientError::InvalidTarget(message),
        "invalid_session" => ClientError::InvalidSession(message),
        "too_many_sessions" => ClientError::TooManySessions(message),
        "not_renewable" => ClientError::NotRenewable(message),
        "no_match" => {
            let counts = e.no_match.unwrap_or_default();
            ClientError::NoMatch {
                message,
                considered: counts.considered,
                at_capacity: counts.at_capacity,
                in_cooldown: counts.in_cooldown,
                unhealthy: counts.unhealthy,
            }
        }
        "unknown_lease" => ClientError::UnknownLease(message),
        "unknown_session" => ClientError::UnknownSession(message),
        "not_found" => ClientError::NotFound(message),
        "method_not_allowed" => ClientError::MethodNotAllowed(message),
        "overloaded" => ClientError::Overloaded(message),
        "headers_too_large" => ClientError::HeadersTooLarge(message),
        "internal" => ClientError::Internal(message),
        "store_unavailable" => ClientError::StoreUnavailable(message),
        "rate_limited" => ClientError::RateLimited {
            message,
            retry_after: Duration::from_secs(1),
        },
        _ => ClientError::Unexpected {
            status,
            body: body.chars().take(MAX_UNEXPECTED).collect(),
        },
    }
}

/// The most times one call is sent again after a `429` with `Retry-After`.
pub const MAX_RETRIES: u32 = 3;

/// What to do with a `429` answer: wait and send again, or give up with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRateLimit {
    Retry(Duration),
    GiveUp,
}

/// Whether a call refused with `Retry-After: retry_after` after `retries` retries, `elapsed`
/// into its budget of `budget`, is sent again: at most [`MAX_RETRIES`] times, and only when the
/// wait ends inside the budget (a retry never takes the call past its own timeout).
pub fn after_rate_limit(retry_after: Duration, retries: u32, elapsed: Duration, budget: Duration) -> AfterRateLimit {
    if retries >= MAX_RETRIES || elapsed.saturating_add(retry_after) >= budget {
        AfterRateLimit::GiveUp
    } else {
        AfterRateLimit::Retry(retry_after)
    }
}

/// `Retry-After` as whole seconds (the API's form); anything else is taken as 1 s.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    let seconds = headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1);
    Duration::from_secs(seconds.max(1))
}

/// The client. Cheap to clone; every call is bounded (10 s by default), retries included.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never printed.
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("authenticated", &self.token.is_some())
            .finish()
    }
}

/// Everything but RFC 3986's unreserved characters is escaped in a path segment.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn segment(s: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(s, SEGMENT)
}

/// One form-encoded query key or value.
fn form(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Idle keep-alive connections to the API kept for reuse, at most (each closes after 90 s
/// unused): a gateway calling for thousands of tunnels reuses these rather than keeping one
/// per call that ever ran at once.
pub const MAX_IDLE_CONNECTIONS: usize = 64;

impl Client {
    /// A client of the API at `base` (`http://host:8090`), with the bearer token when the
    /// operator has one.
    ///
    /// # Errors
    ///
    /// The HTTP client cannot be built.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, ClientError> {
        Self::with_timeout(base, token, Duration::from_secs(10))
    }

    /// As [`Client::new`], with a budget per call.
    ///
    /// # Errors
    ///
    /// The HTTP client cannot be built.
    pub fn with_timeout(base: &str, token: Option<String>, timeout: Duration) -> Result<Self, ClientError> {
        Self::build(base, token, timeout, None)
    }

    /// As [`Client::with_timeout`], an `https://` API's certificate checked against the CA
    /// certificates of `ca_pem` only (a PEM bundle: the `ca.crt` of the Secret
    /// `discovery-tls`, or a private CA's), not the system's.
    ///
    /// # Errors
    ///
    /// No certificate in `ca_pem`; the HTTP client cannot be built.
    pub fn with_ca(base: &str, token: Option<String>, timeout: Duration, ca_pem: &[u8]) -> Result<Self, ClientError> {
        let roots = reqwest::Certificate::from_pem_bundle(ca_pem)
            .map_err(|e| ClientError::Transport(format!("the CA file: {e}")))?;
        if roots.is_empty() {
            return Err(ClientError::Transport("the CA file holds no certificate".into()));
        }
        Self::build(base, token, timeout, Some(roots))
    }

    fn build(
        base: &str,
        token: Option<String>,
        timeout: Duration,
        roots: Option<Vec<reqwest::Certificate>>,
    ) -> Result<Self, ClientError> {
        // reqwest is built without a default crypto provider; ring is the workspace's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder().pool_max_idle_per_host(MAX_IDLE_CONNECTIONS);
        if let Some(roots) = roots {
            builder = builder.tls_certs_only(roots);
        }
        let http = builder.build().map_err(|e| ClientError::Transport(e.to_string()))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            token,
            timeout,
        })
    }

    /// The same client, on the same connections, presenting `token`: a gateway calls for each
    /// of its clients with that client's own token, so their admission and scopes apply.
    #[must_use]
    pub fn for_token(&self, token: &str) -> Self {
        Self {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    /// Sends `req`, again after a `429` as [`after_rate_limit`] allows, all within the call's
    /// budget. A `429` it gives up on is [`ClientError::RateLimited`].
    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(u16, String), ClientError> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let started = std::time::Instant::now();
        let mut retries = 0;
        loop {
            let left = self.timeout.saturating_sub(started.elapsed());
            // Bodies here are bytes in memory: a request can always be sent again.
            let attempt = req
                .try_clone()
                .ok_or_else(|| ClientError::Transport("a request that cannot be sent again".into()))?;
            let r = attempt
                .timeout(left)
                .send()
                .await
                .map_err(|e| ClientError::Transport(e.to_string()))?;
            let status = r.status().as_u16();
            let wait = retry_after(r.headers());
            let body = r.text().await.map_err(|e| ClientError::Transport(e.to_string()))?;
            if status != 429 {
                return Ok((status, body));
            }
            match after_rate_limit(wait, retries, started.elapsed(), self.timeout) {
                AfterRateLimit::Retry(wait) => {
                    retries += 1;
                    tokio::time::sleep(wait).await;
                }
                AfterRateLimit::GiveUp => {
                    return Err(match from_answer(status, &body) {
                        ClientError::RateLimited { message, .. } => ClientError::RateLimited {
                            message,
                            retry_after: wait,
                        },
                        other => other,
                    });
                }
            }
        }
    }

    fn expect<T: serde::de::DeserializeOwned>(status: u16, want: &[u16], body: &str) -> Result<T, ClientError> {
        if !want.contains(&status) {
            return Err(from_answer(status, body));
        }
        // A success the client cannot read keeps no part of the body: a lease answer holds the
        // proxy's password (nor serde's message, which can quote a value).
        serde_json::from_str(body).map_err(|_| ClientError::Unexpected {
            status,
            body: format!("an answer of {} bytes that does not match the API", body.len()),
        })
    }

    /// `GET /v1/proxies`.
    ///
    /// # Errors
    ///
    /// The API's error, or a transport failure.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<ProxyView>, ClientError> {
        let mut query: Vec<String> = filter
            .attributes
            .iter()
            .map(|(k, v)| format!("attr.{}={}", form(k), form(v)))
            .collect();
        if let Some(h) = filter.healthy {
            query.push(format!("healthy={h}"));
        }
        let url = format!("{}/v1/proxies?{}", self.base, query.join("&"));
        let (status, body) = self.send(self.http.get(url)).await?;
        Self::expect::<wire::ProxyList<'static>>(status, &[200], &body).map(|l| l.proxies)
    }

    /// `GET /v1/whoami`: the name of the client this client's token belongs to.
    ///
    /// # Errors
    ///
    /// [`ClientError::Unauthorized`] for a token the API does not know; the API's other
    /// errors; transport.
    pub async fn whoami(&self) -> Result<String, ClientError> {
        let (status, body) = self.send(self.http.get(format!("{}/v1/whoami", self.base))).await?;
        Self::expect::<wire::WhoAmI<'static>>(status, &[200], &body).map(|w| w.client.into_owned())
    }

    /// `POST /v1/leases`. With `req.session`, the session's lease again (same id, extended)
    /// while its proxy stays fit, else its new one.
    ///
    /// # Errors
    ///
    /// [`ClientError::NoMatch`] when no proxy is eligible, [`ClientError::TooManySessions`]
    /// when a new session would pass the client's cap; the API's other errors; transport.
    pub async fn acquire(&self, req: &AcquireRequest) -> Result<Lease, ClientError> {
        let body = serde_json::to_string(req).map_err(|e| ClientError::InvalidBody(e.to_string()))?;
        let request = self
            .http
            .post(format!("{}/v1/leases", self.base))
            .header("content-type", "application/json")
            .body(body);
        let (status, body) = self.send(request).await?;
        Self::expect(status, &[201, 200], &body)
    }

    /// `POST /v1/leases/{id}/renew`: the lease extended to `ttl` from now (never shortened;
    /// `None`: the server's default, 300 s).
    ///
    /// # Errors
    ///
    /// [`ClientError::UnknownLease`] once the lease has ended, [`ClientError::NotRenewable`]
    /// when its proxy may no longer be leased; the API's other errors; transport.
    pub async fn renew(&self, lease_id: &str, ttl: Option<Duration>) -> Result<Lease, ClientError> {
        let body = wire::Renewal {
            ttl_seconds: ttl.map(|t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX)),
        };
        let body = serde_json::to_string(&body).map_err(|e| ClientError::InvalidBody(e.to_string()))?;
        let request = self
            .http
            .post(format!("{}/v1/leases/{}/renew", self.base, segment(lease_id)))
            .header("content-type", "application/json")
            .body(body);
        let (status, body) = self.send(request).await?;
        Self::expect(status, &[200], &body)
    }

    /// `DELETE /v1/leases/{id}` (idempotent).
    ///
    /// # Errors
    ///
    /// The API's error, or a transport failure.
    pub async fn release(&self, lease_id: &str) -> Result<(), ClientError> {
        let url = format!("{}/v1/leases/{}", self.base, segment(lease_id));
        match self.send(self.http.delete(url)).await? {
            (204, _) => Ok(()),
            (status, body) => Err(from_answer(status, &body)),
        }
    }

    /// `POST /v1/leases/{id}/report`.
    ///
    /// # Errors
    ///
    /// [`ClientError::UnknownLease`]; the API's other errors; transport.
    pub async fn report(&self, lease_id: &str, result: ReportResult, target: Option<&str>) -> Result<(), ClientError> {
        let path = format!("/v1/leases/{}/report", segment(lease_id));
        self.send_report(&path, result, target).await
    }

    /// `POST /v1/sessions/{session}/report`: a report on this client's session's lease (for a
    /// client that knows only its session, as one behind the gateway does).
    ///
    /// # Errors
    ///
    /// [`ClientError::UnknownSession`] when the session has no live lease;
    /// [`ClientError::InvalidSession`]; the API's other errors; transport.
    pub async fn report_session(
        &self,
        session: &str,
        result: ReportResult,
        target: Option<&str>,
    ) -> Result<(), ClientError> {
        let path = format!("/v1/sessions/{}/report", segment(session));
        self.send_report(&path, result, target).await
    }

    async fn send_report(&self, path: &str, result: ReportResult, target: Option<&str>) -> Result<(), ClientError> {
        let result = match result {
            ReportResult::Ok => "ok",
            ReportResult::RateLimited => "rate_limited",
            ReportResult::Banned => "banned",
        };
        let body = wire::Report {
            result: result.to_owned(),
            target: target.map(str::to_owned),
        };
        let body = serde_json::to_string(&body).map_err(|e| ClientError::InvalidBody(e.to_string()))?;
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body);
        match self.send(request).await? {
            (204, _) => Ok(()),
            (status, body) => Err(from_answer(status, &body)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_envelopes_map_to_variants() {
        assert_eq!(
            from_answer(
                409,
                r#"{"error":"no_match","message":"m","considered":3,"atCapacity":1,"inCooldown":1,"unhealthy":1}"#
            ),
            ClientError::NoMatch {
                message: "m".into(),
                considered: 3,
                at_capacity: 1,
                in_cooldown: 1,
                unhealthy: 1
            }
        );
        assert_eq!(
            from_answer(404, r#"{"error":"unknown_lease","message":"no such lease"}"#),
            ClientError::UnknownLease("no such lease".into())
        );
        assert_eq!(
            from_answer(404, r#"{"error":"unknown_session","message":"none"}"#),
            ClientError::UnknownSession("none".into())
        );
        assert!(matches!(
            from_answer(502, "<html>bad gateway</html>"),
            ClientError::Unexpected { status: 502, .. }
        ));
        assert!(matches!(
            from_answer(400, r#"{"error":"brand_new"}"#),
            ClientError::Unexpected { .. }
        ));
        let long = "x".repeat(10_000);
        let ClientError::Unexpected { body, .. } = from_answer(500, &long) else {
            panic!()
        };
        assert_eq!(body.len(), MAX_UNEXPECTED);
    }

    #[test]
    fn a_429_is_retried_only_within_the_retries_and_the_call_s_budget() {
        let s = Duration::from_secs;
        assert_eq!(after_rate_limit(s(1), 0, s(0), s(10)), AfterRateLimit::Retry(s(1)));
        assert_eq!(after_rate_limit(s(1), 2, s(2), s(10)), AfterRateLimit::Retry(s(1)));
        assert_eq!(
            after_rate_limit(s(1), 3, s(3), s(10)),
            AfterRateLimit::GiveUp,
            "three retries at most"
        );
        assert_eq!(
            after_rate_limit(s(5), 0, s(6), s(10)),
            AfterRateLimit::GiveUp,
            "the wait would end past the budget"
        );
        assert_eq!(
            after_rate_limit(s(4), 0, s(6), s(10)),
            AfterRateLimit::GiveUp,
            "nor exactly at it"
        );
        assert_eq!(after_rate_limit(s(3), 1, s(6), s(10)), AfterRateLimit::Retry(s(3)));
    }

    #[test]
    fn retry_after_is_read_as_whole_seconds() {
        let headers = |v: &str| {
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(reqwest::header::RETRY_AFTER, v.parse().unwrap());
            h
        };
        assert_eq!(retry_after(&headers("7")), Duration::from_secs(7));
        assert_eq!(retry_after(&headers("0")), Duration::from_secs(1), "at least 1 s");
        assert_eq!(
            retry_after(&headers("Wed, 21 Oct 2026 07:28:00 GMT")),
            Duration::from_secs(1)
        );
        assert_eq!(retry_after(&reqwest::header::HeaderMap::new()), Duration::from_secs(1));
    }

    #[test]
    fn a_success_that_cannot_be_read_keeps_none_of_its_body() {
        let body = r#"{"leaseID":"l","proxy":{"id":"ns/p","password":"SENTINEL-pw","port":"not a number"}}"#;
        let e = Client::expect::<Lease>(200, &[200], body).unwrap_err();
        let shown = format!("{e} {e:?}");
        assert!(matches!(e, ClientError::Unexpected { status: 200, .. }), "{shown}");
        assert!(!shown.contains("SENTINEL"), "{shown}");
    }

    #[test]
    fn the_token_is_never_printed() {
        let c = Client::new("http://x", Some("sekrit".into())).unwrap();
        assert!(!format!("{c:?}").contains("sekrit"));
    }
}
