//! The API's bodies as they travel: one set of types that the server encodes or decodes, the
//! Rust client ([`crate::client`]) decodes or sends, and docs/discovery-openapi.json describes
//! (its schemas `Proxy`, `LeasedProxy`, `ProxyList`, `Lease`, `LeaseRequest`, `Renewal`,
//! `Report`, `Error` and `NoMatch`; the OpenAPI tests hold the types and the schemas to the same fields).
//!
//! Each answer type takes a lifetime: the server lends it the strings of its directory snapshot
//! (`Cow::Borrowed`, nothing copied per request), the client owns what it read (`'static`, the
//! client's aliases). The request bodies are owned: the server decodes them by the Go operator's
//! rules (keys in any case, `null` as absent), so each field has a default.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A proxy as the list shows it (schema `Proxy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyView<'a> {
    /// `<namespace>/<name>`.
    pub id: Cow<'a, str>,
    /// Where to send traffic; empty until a Managed instance is up.
    pub ip: Cow<'a, str>,
    pub port: u16,
    /// Left out when empty.
    #[serde(default, skip_serializing_if = "no_attributes")]
    pub attributes: Cow<'a, BTreeMap<String, String>>,
    pub phase: Cow<'a, str>,
    pub healthy: bool,
    pub latency_millis: i64,
    /// Unexpired, unreleased leases on it now.
    pub active_leases: u64,
    /// Effective capacity (0: never leased).
    pub max_leases: i64,
    /// A pool member's role (`active`, `standby`, `draining`); left out for a proxy in no pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_role: Option<Cow<'a, str>>,
    /// The observed exit (schema `ProxyExit`); left out while none is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitView<'a>>,
}

/// A proxy's observed exit (schema `ProxyExit`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitView<'a> {
    pub address: Cow<'a, str>,
    /// What the exit check concluded: `Verified`, `Shared`, `OperatorAddress`, `Unexpected` or
    /// `Unknown`.
    pub verification: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asn: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub organization: Option<Cow<'a, str>>,
}

fn no_attributes(attributes: &BTreeMap<String, String>) -> bool {
    attributes.is_empty()
}

/// A leased proxy (schema `LeasedProxy`): the list's view and, when the proxy demands them, its
/// credentials. `Debug` never shows the password or the URL that holds it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasedProxy<'a> {
    #[serde(flatten)]
    pub view: ProxyView<'a>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Cow<'a, str>>,
    /// `http://user:password@ip:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<Cow<'a, str>>,
}

impl std::fmt::Debug for LeasedProxy<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedProxy")
            .field("view", &self.view)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("url", &self.url.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl<'a> std::ops::Deref for LeasedProxy<'a> {
    type Target = ProxyView<'a>;

    fn deref(&self) -> &ProxyView<'a> {
        &self.view
    }
}

impl LeasedProxy<'_> {
    /// What an HTTP client takes as its proxy: the answer's `url` (with the credentials), or
    /// `http://ip:port` for a proxy that demands none.
    pub fn proxy_url(&self) -> String {
        match &self.url {
            Some(url) => url.clone().into_owned(),
            None if self.view.ip.contains(':') => format!("http://[{}]:{}", self.view.ip, self.view.port),
            None => format!("http://{}:{}", self.view.ip, self.view.port),
        }
    }
}

/// `GET /v1/proxies`' answer (schema `ProxyList`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyList<'a> {
    pub count: u64,
    pub proxies: Vec<ProxyView<'a>>,
}

/// A lease granted (schema `Lease`): `POST /v1/leases`' answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease<'a> {
    #[serde(rename = "leaseID")]
    pub lease_id: Cow<'a, str>,
    pub proxy: LeasedProxy<'a>,
    /// RFC 3339, UTC.
    pub expires_at: Cow<'a, str>,
    pub ttl_seconds: u64,
}

/// `GET /v1/whoami`'s answer (schema `WhoAmI`): the client the caller's token belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhoAmI<'a> {
    pub client: Cow<'a, str>,
}

/// `POST /v1/leases`' body (schema `LeaseRequest`): what to borrow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRequest {
    /// Attributes the proxy must have, and `pool`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// `None` or 0: the server's default (300 s). Signed, so the server can answer a negative
    /// one with `invalid_ttl` rather than a body it cannot read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<i64>,
    /// The site to be crawled, which scopes cooldowns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A sticky session of the caller's client (1 to 64 of `A-Za-z0-9_-`): while its lease
    /// lives and its proxy stays fit, the same lease is answered again, extended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// `POST /v1/leases/{id}/renew`'s body (schema `Renewal`): how long from now the lease should
/// live.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Renewal {
    /// `None` or 0: the server's default (300 s); at most its `--max-lease-ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<i64>,
}

/// `POST /v1/leases/{id}/report`'s body (schema `Report`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// `ok`, `rate_limited` or `banned`; anything else (or nothing) is `invalid_result`.
    #[serde(default)]
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// Every error answer (schemas `Error` and, for `no_match`, `NoMatch`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody<'a> {
    /// The code (`no_match`, `invalid_ttl`, ...).
    pub error: Cow<'a, str>,
    #[serde(default)]
    pub message: Cow<'a, str>,
    /// `no_match` only: how the candidates the caller may lease fell short.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub no_match: Option<NoMatchCounts>,
}

/// The candidates of a `no_match`, by why each was passed over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoMatchCounts {
    pub considered: u64,
    pub at_capacity: u64,
    pub in_cooldown: u64,
    pub unhealthy: u64,
}
