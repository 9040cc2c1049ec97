//! The thin Compute client: one request at a time, with transport timeouts, a bearer token,
//! the wire log, a client span per request when the caller has a span, internal retries for
//! reads, and every failure turned into a [`RequestFailure`] that classify reads (transport
//! failures by [`crate::transport`], which the token source shares).

use std::time::Duration;

use reqwest::Url;
use serde_json::Value;
use tracing::Instrument;

use crate::auth::Tokens;
use crate::classify::{ApiError, Call, RequestFailure};
use crate::transport::{read_capped, transport};
use crate::wire::{self, WireOptions};

/// Google's Compute API.
pub const DEFAULT_BASE_URL: &str = "https://compute.googleapis.com/compute/v1";
/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take, answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts of a read (get, list, operation) that meets a 5xx or a reset.
pub const READ_ATTEMPTS: u32 = 3;
/// The most of one answer read.
pub const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// The HTTP client of one provider: the timeouts above, TLS on ring with the system's roots,
/// no redirects (the API never redirects; a redirect would carry the token elsewhere).
///
/// # Errors
/// The client cannot be built.
pub fn http_client() -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a default crypto provider; ring is the workspace's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("egress-proxies-operator/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// One project's Compute API.
#[derive(Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    project: String,
    tokens: Tokens,
    wire: WireOptions,
}

impl Client {
    /// A client of `project` at `base` (no trailing slash).
    pub fn new(
        http: reqwest::Client,
        base: impl Into<String>,
        project: impl Into<String>,
        tokens: Tokens,
        wire: WireOptions,
    ) -> Self {
        Self {
            http,
            base: base.into().trim_end_matches('/').to_owned(),
            project: project.into(),
            tokens,
            wire,
        }
    }

    /// The host the calls go to (the health check's `address`).
    pub fn host(&self) -> String {
        Url::parse(&self.base)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| self.base.clone())
    }

    /// The token source.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// The URL of `path` under the project, with `query`.
    fn url(&self, path: &str, query: &[(&str, &str)]) -> Result<Url, RequestFailure> {
        let raw = format!(
            "{}/projects/{}/{}",
            self.base,
            self.project,
            path.trim_start_matches('/')
        );
        let mut url = Url::parse(&raw).map_err(|e| RequestFailure::Transport {
            message: format!("bad request URL {raw}: {e}"),
            timed_out: false,
        })?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    /// Sends one call and reads its JSON answer. Reads (get, list, operation) are tried up to
    /// [`READ_ATTEMPTS`] times on a 5xx or a connection failure, with jittered backoff; insert,
    /// delete and setLabels are sent once (the reconciler retries them, and a retried insert is
    /// recognised by its requestId). A 401 drops the cached token and the call is sent once more
    /// with a fresh one. `sent_secret` (an insert's cloud-init) is scrubbed from the wire log of
    /// the answer. The caller bounds the whole.
    ///
    /// # Errors
    /// Why it failed.
    pub async fn call(
        &self,
        call: Call,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
        sent_secret: &[u8],
    ) -> Result<Value, RequestFailure> {
        let url = self.url(path, query)?;
        let attempts = match call {
            Call::Get | Call::List | Call::Operation => READ_ATTEMPTS,
            Call::Insert | Call::Delete | Call::SetLabels => 1,
        };
        let mut attempt = 1;
        let mut refreshed = false;
        loop {
            let result = self.once(call, &url, body, sent_secret).await;
            if let Err(RequestFailure::Api(e)) = &result
                && e.status == 401
                && !refreshed
            {
                // The token was refused (revoked, or its key rotated): a refused request was not
                // carried out, so it is sent once more with a fresh token.
                refreshed = true;
                continue;
            }
            let retry = match &result {
                Err(RequestFailure::Api(e)) => e.status >= 500,
                Err(RequestFailure::Transport { timed_out, .. }) => !timed_out,
                _ => false,
            };
            if !retry || attempt >= attempts {
                return result;
            }
            let base = 200u64 << (attempt - 1);
            let jitter = rand::random_range(0..=base / 2);
            tokio::time::sleep(Duration::from_millis(base + jitter)).await;
            attempt += 1;
        }
    }

    /// Sends one request, never retried (the health check's probe: exactly one request).
    ///
    /// # Errors
    /// Why it failed.
    pub async fn call_once(&self, call: Call, path: &str, query: &[(&str, &str)]) -> Result<Value, RequestFailure> {
        let url = self.url(path, query)?;
        self.once(call, &url, None, &[]).await
    }

    async fn once(
        &self,
        call: Call,
        url: &Url,
        body: Option<&Value>,
        sent_secret: &[u8],
    ) -> Result<Value, RequestFailure> {
        let method = call.method();
        let token = self.tokens.token().await?;
        // A client span only under a caller's span: background work starts no traces.
        let span = if tracing::Span::current().is_none() {
            tracing::Span::none()
        } else {
            tracing::info_span!(
                "gcp.http",
                otel.kind = "client",
                gcp.call = call.as_str(),
                http.request.method = %method,
                url.path = url.path(),
                http.response.status_code = tracing::field::Empty,
            )
        };
        let sent = async {
            wire::request(method.as_str(), url.as_str(), body, self.wire);
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .header(reqwest::header::AUTHORIZATION, token.bearer());
            if let Some(b) = body {
                request = request.json(b);
            }
            let response = request.send().await.map_err(|e| transport(&e))?;
            let status = response.status().as_u16();
            tracing::Span::current().record("http.response.status_code", status);
            let bytes = read_capped(response, MAX_ANSWER).await?;
            wire::response(method.as_str(), url.as_str(), status, &bytes, self.wire, sent_secret);
            if !(200..300).contains(&status) {
                return Err(RequestFailure::Api(ApiError::from_body(status, &bytes)));
            }
            if bytes.is_empty() {
                return Ok(Value::Null);
            }
            serde_json::from_slice(&bytes).map_err(|e| RequestFailure::Undecodable(format!("undecodable answer: {e}")))
        }
        .instrument(span)
        .await;
        if let Err(RequestFailure::Api(e)) = &sent
            && e.status == 401
        {
            // A refused token is not reused: the next call fetches a fresh one.
            self.tokens.forget().await;
        }
        sent
    }
}
