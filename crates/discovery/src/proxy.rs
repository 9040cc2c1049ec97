//! A proxy as the discovery API knows it: what the directory hands the routes, what a scope
//! judges, and what a fleet snapshot holds. Its own module, below all three, so that none of
//! them borrows it from another.

use std::collections::BTreeMap;

/// A proxy's observed exit, as its status records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    pub address: String,
    /// The `ExitVerified` condition's reason (`Verified`, `Shared`, `OperatorAddress`,
    /// `Unexpected`, `Unknown`).
    pub verification: String,
    pub country: Option<String>,
    pub asn: Option<u32>,
    pub organization: Option<String>,
}

/// A proxy as the API shows it (the caller leaves out Proxies being deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyInfo {
    /// `<namespace>/<name>`.
    pub id: String,
    /// The effective host; empty until a Managed instance is up.
    pub ip: String,
    pub port: u16,
    pub attributes: BTreeMap<String, String>,
    pub phase: String,
    /// `Healthy` is `True`.
    pub healthy: bool,
    pub latency_millis: i64,
    /// Effective capacity (0 = never leased).
    pub max_leases: i32,
    /// What the proxy demands of its clients; only lease answers show them.
    pub credentials: Option<egress_credentials::Credentials>,
    /// Whether it may get a new lease: `false` for a pool's standby (held back until it is
    /// promoted) and a draining member (its leases run out, it gets no new one). A proxy that
    /// is not offered is no candidate at all, so a refusal's counts leave it out.
    pub offered: bool,
    /// A pool member's role (`active`, `standby`, `draining`), shown as `poolRole` in the list;
    /// `None` for a proxy in no pool.
    pub pool_role: Option<&'static str>,
    /// Its observed exit, when the exit checks found one.
    pub exit: Option<ExitInfo>,
    /// The name of the ProxyPool that owns it (in its namespace); `None` for a proxy in no
    /// pool. Membership is the owner, not the `pool` attribute any Proxy may carry: what a
    /// client scope's pools match ([`crate::ClientScope`]).
    pub pool: Option<String>,
}

impl ProxyInfo {
    /// The pool a lease store keeps its leases with (a shard of their own on Redis): its `pool`
    /// attribute, which is what a `pool` selector matches, member or not.
    pub fn lease_pool(&self) -> Option<&str> {
        self.attributes.get(egress_lease::POOL_KEY).map(String::as_str)
    }
}
