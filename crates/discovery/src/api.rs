//! The routes: what each answers, as pure functions of the request, the proxies and the store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use egress_lease::{Candidate, LeaseRequest, LeaseStore, ReportResult, Scope, StoreError, Target, effective_ttl};
use serde::Deserialize;
use serde_json::json;

use crate::fleet::Fleet;

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
}

/// Where the API reads proxies from.
pub trait ProxyDirectory: Send + Sync + 'static {
    /// Every proxy, or why they could not be listed: a shared, consistent snapshot.
    /// Implementations hand out the same one until their proxies change, so a reader may tell
    /// "unchanged" by `Arc::ptr_eq`.
    ///
    /// # Errors
    ///
    /// The list failed; the API answers `500 internal` and logs the reason.
    fn proxies(&self) -> Result<Arc<Fleet>, String>;

    /// A signal that fires when the proxies may have changed, for a publisher that must not
    /// wait for its next look (a standby promoted). `None`: the directory has none, and the
    /// publisher looks on its schedule only.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        None
    }
}

/// What the routes share.
pub struct DiscoveryApi {
    pub directory: Arc<dyn ProxyDirectory>,
    pub store: Arc<dyn LeaseStore>,
    /// `--max-lease-ttl`.
    pub max_ttl: Duration,
    /// Who may call it.
    pub auth: crate::Auth,
    /// Where refused lease requests are counted for the pool autoscaler; `None`: nowhere.
    pub refusals: Option<Arc<crate::Refusals>>,
    /// Which request is served when, per client ([`crate::admission`]).
    pub admission: crate::Admission,
}

impl std::fmt::Debug for DiscoveryApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryApi")
            .field("max_ttl", &self.max_ttl)
            .field("auth", &self.auth)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

/// An answer: status and its JSON body, already encoded (`None`: no body).
pub(crate) type Answer = (u16, Option<Vec<u8>>);

fn encoded(value: &impl serde::Serialize) -> Option<Vec<u8>> {
    Some(serde_json::to_vec(value).unwrap_or_default())
}

pub(crate) fn error(status: u16, code: &str, message: &str) -> Answer {
    (status, encoded(&json!({"error": code, "message": message})))
}

/// The proxy view of §5.5, encoded straight from the directory's data.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct View<'a> {
    id: &'a str,
    ip: &'a str,
    port: u16,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    attributes: &'a BTreeMap<String, String>,
    phase: &'a str,
    healthy: bool,
    latency_millis: i64,
    active_leases: usize,
    max_leases: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool_role: Option<&'static str>,
}

fn view(p: &ProxyInfo, active: usize) -> View<'_> {
    View {
        id: &p.id,
        ip: &p.ip,
        port: p.port,
        attributes: &p.attributes,
        phase: &p.phase,
        healthy: p.healthy,
        latency_millis: p.latency_millis,
        active_leases: active,
        max_leases: p.max_leases,
        pool_role: p.pool_role,
    }
}

/// The view of a leased proxy: the list's, and its credentials when it has them.
#[derive(serde::Serialize)]
struct Leased<'a> {
    #[serde(flatten)]
    view: View<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    username: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    password: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
}

fn leased(p: &ProxyInfo, active: usize) -> Leased<'_> {
    let c = p.credentials.as_ref();
    Leased {
        view: view(p, active),
        username: c.map(egress_credentials::Credentials::username),
        password: c.map(egress_credentials::Credentials::password),
        url: c.map(|c| c.proxy_url(&p.ip, p.port)),
    }
}

fn matches(p: &ProxyInfo, selector: &BTreeMap<String, Vec<String>>) -> bool {
    selector
        .iter()
        .all(|(k, values)| values.iter().all(|v| p.attributes.get(k) == Some(v)))
}

/// The store is unreachable: `503 store_unavailable`, nothing done.
fn store_failed(e: &StoreError, what: &str) -> Answer {
    tracing::error!(error = %e, "{what}");
    error(
        503,
        "store_unavailable",
        "the lease store is unreachable; try again shortly",
    )
}

fn list_failed(e: &str, what: &str) -> Answer {
    tracing::error!(error = %e, "{what}");
    error(500, "internal", "listing proxies failed")
}

impl DiscoveryApi {
    /// `GET /v1/proxies?healthy=&attr.<k>=`.
    pub(crate) async fn list(&self, query: Option<&str>) -> Answer {
        let mut healthy = None;
        let mut selector: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in form_pairs(query.unwrap_or_default()) {
            if k == "healthy" {
                healthy = match v.as_str() {
                    "" => None,
                    "true" => Some(true),
                    "false" => Some(false),
                    _ => return error(400, "invalid_query", "healthy must be true or false"),
                };
            } else if let Some(attr) = k.strip_prefix("attr.") {
                selector.entry(attr.to_string()).or_default().push(v);
            }
        }
        let all = match self.directory.proxies() {
            Ok(p) => p,
            Err(e) => return list_failed(&e, "listing proxies"),
        };
        let proxies: Vec<&ProxyInfo> = all
            .in_id_order()
            .filter(|p| healthy.is_none_or(|h| p.healthy == h) && matches(p, &selector))
            .collect();
        let ids: Vec<&str> = proxies.iter().map(|p| p.id.as_str()).collect();
        let active = match self.store.active_leases(&ids).await {
            Ok(a) => a,
            Err(e) => return store_failed(&e, "reading active leases"),
        };
        let views: Vec<View<'_>> = proxies.iter().zip(active).map(|(p, n)| view(p, n)).collect();
        #[derive(serde::Serialize)]
        struct List<'a> {
            count: usize,
            proxies: Vec<View<'a>>,
        }
        (
            200,
            encoded(&List {
                count: views.len(),
                proxies: views,
            }),
        )
    }

    /// `POST /v1/leases`.
    pub(crate) async fn acquire(&self, body: &[u8]) -> Answer {
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Body {
            #[serde(default)]
            selector: BTreeMap<String, String>,
            #[serde(default)]
            ttl_seconds: Option<i64>,
            #[serde(default)]
            target: Option<String>,
        }
        let body: Body = match decode(body) {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        let ttl = match effective_ttl(body.ttl_seconds, self.max_ttl) {
            Ok(t) => t,
            Err(e) => return error(400, "invalid_ttl", &e.to_string()),
        };
        let target = match target(body.target.as_deref()) {
            Ok(t) => t,
            Err(answer) => return answer,
        };
        let proxies = match self.directory.proxies() {
            Ok(p) => p,
            Err(e) => return list_failed(&e, "listing proxies for lease"),
        };
        let selector: BTreeMap<String, Vec<String>> = body
            .selector
            .iter()
            .map(|(k, v)| (k.clone(), vec![v.clone()]))
            .collect();
        // Lazily, in (latency, id) order: the store stops at the first idle eligible proxy, so
        // a lease costs the same with ten proxies or ten thousand. Standby and draining pool
        // members are no candidates.
        let candidates = || {
            proxies
                .in_lease_order()
                .filter(|p| p.offered && matches(p, &selector))
                .map(|p| Candidate {
                    id: &p.id,
                    healthy: p.healthy,
                    latency_millis: p.latency_millis,
                    max_leases: p.max_leases,
                })
        };
        // An empty selector is every offered proxy: a shared store answers it from its index.
        let scope = if body.selector.is_empty() {
            Scope::Installation
        } else {
            Scope::Listed
        };
        let req = LeaseRequest { ttl, target, scope };
        let mut acquired = match self.store.acquire(&mut candidates(), &req).await {
            Ok(a) => a,
            Err(e) => return store_failed(&e, "acquiring a lease"),
        };
        // From its index, a shared store may grant a proxy this replica does not offer yet (or
        // any more): the leader's view is newer or older than its cache. That lease is given
        // back (if that fails, it holds its slot until its expiry) and the choice made among
        // the proxies offered here.
        if let Ok(grant) = &acquired
            && !proxies.get(&grant.proxy_id).is_some_and(|p| p.offered)
        {
            if let Err(e) = self.store.release(&grant.lease_id).await {
                return store_failed(&e, "giving back a lease on an unknown proxy");
            }
            let listed = LeaseRequest {
                scope: Scope::Listed,
                ..req
            };
            acquired = match self.store.acquire(&mut candidates(), &listed).await {
                Ok(a) => a,
                Err(e) => return store_failed(&e, "acquiring a lease"),
            };
        }
        match acquired {
            Ok(grant) => {
                #[derive(serde::Serialize)]
                #[serde(rename_all = "camelCase")]
                struct Granted<'a> {
                    #[serde(rename = "leaseID")]
                    lease_id: &'a str,
                    proxy: Option<Leased<'a>>,
                    expires_at: String,
                    ttl_seconds: u64,
                }
                let proxy = proxies.get(&grant.proxy_id).map(|p| leased(p, grant.active_leases));
                let expires_at = jiff::Timestamp::try_from(grant.expires_at)
                    .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                    .unwrap_or_default();
                (
                    201,
                    encoded(&Granted {
                        lease_id: &grant.lease_id,
                        proxy,
                        expires_at,
                        ttl_seconds: grant.ttl.as_secs(),
                    }),
                )
            }
            Err(n) => {
                if let Some(refusals) = &self.refusals {
                    refusals.record(&body.selector);
                }
                (
                    409,
                    encoded(&json!({
                        "error": "no_match",
                        "message": "no healthy proxy with free capacity matched the selector",
                        "considered": n.considered,
                        "atCapacity": n.at_capacity,
                        "inCooldown": n.in_cooldown,
                        "unhealthy": n.unhealthy,
                    })),
                )
            }
        }
    }

    /// `DELETE /v1/leases/{id}`.
    pub(crate) async fn release(&self, id: &str) -> Answer {
        match self.store.release(id).await {
            Ok(()) => (204, None),
            Err(e) => store_failed(&e, "releasing a lease"),
        }
    }

    /// `POST /v1/leases/{id}/report`.
    pub(crate) async fn report(&self, id: &str, body: &[u8]) -> Answer {
        #[derive(Deserialize, Default)]
        struct Body {
            #[serde(default)]
            result: Option<String>,
            #[serde(default)]
            target: Option<String>,
        }
        let body: Body = match decode(body) {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        let Some(result) = body.result.as_deref().and_then(|r| r.parse::<ReportResult>().ok()) else {
            return error(400, "invalid_result", "result must be ok, rate_limited or banned");
        };
        let target = match target(body.target.as_deref()) {
            Ok(t) => t,
            Err(answer) => return answer,
        };
        match self.store.report(id, result, target).await {
            Ok(Ok(())) => (204, None),
            Ok(Err(_)) => error(404, "unknown_lease", "no such lease"),
            Err(e) => store_failed(&e, "recording a report"),
        }
    }
}

/// A request's `target`, reduced to `host[:port]`; over 2 KiB is `400 invalid_target`.
fn target(raw: Option<&str>) -> Result<Option<Target>, Answer> {
    match raw.map(Target::parse) {
        None => Ok(None),
        Some(Ok(t)) => Ok(t),
        Some(Err(e)) => Err(error(400, "invalid_target", &e.to_string())),
    }
}

/// Decodes a JSON body whatever its content type; an empty body is `{}`. As the Go operator's
/// decoder read it: the first JSON value only (what follows it is ignored), keys in any case,
/// `null` for a field or the whole body as nothing (`{"selector": null}` is no selector).
fn decode<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, Answer> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let invalid = |e: serde_json::Error| {
        error(
            400,
            "invalid_body",
            &format!("the body is not valid JSON for this endpoint: {e}"),
        )
    };
    let value: serde_json::Value = serde_json::Deserializer::from_slice(body)
        .into_iter()
        .next()
        .unwrap_or(Ok(serde_json::Value::Null))
        .map_err(invalid)?;
    egress_go_decode::from_value(&value, egress_go_decode::Rules::Json).map_err(invalid)
}

/// `application/x-www-form-urlencoded` pairs of a query string, percent-decoded (`+` is a
/// space; bytes that are not UTF-8 become U+FFFD).
fn form_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_as_forms() {
        let pairs = |q| form_pairs(q).collect::<Vec<_>>();
        assert_eq!(
            pairs("healthy=true&attr.geo=eu%2Dwest&attr.x=a+b&flag"),
            [
                ("healthy".into(), "true".into()),
                ("attr.geo".into(), "eu-west".into()),
                ("attr.x".into(), "a b".into()),
                ("flag".into(), String::new())
            ]
        );
        assert_eq!(pairs("a=100%"), [("a".into(), "100%".into())]);
        assert_eq!(pairs("a=%zz"), [("a".into(), "%zz".into())]);
        assert_eq!(pairs("a=%4"), [("a".into(), "%4".into())]);
    }
}
