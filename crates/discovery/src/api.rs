//! The routes: what each answers, as pure functions of the request, the proxies and the store.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use egress_lease::{
    Candidate, Grant, LeaseRequest, LeaseStore, NoMatch, NotRenewed, ProxyRef, ReportResult, Scope, Session,
    SessionName, SessionRefused, StoreError, Target, effective_ttl,
};

use crate::fleet::Fleet;
use crate::proxy::ProxyInfo;
use crate::scope::ClientScope;
use crate::wire::{self, ErrorBody, ExitView, Lease, LeasedProxy, NoMatchCounts, ProxyList, ProxyView, Report};

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

/// Live sessions one client may hold unless told otherwise (`--max-sessions-per-client`): a
/// session per crawler login, say, for a thousand at once; every session is also a lease, so
/// the fleet's capacity bounds them all.
pub const DEFAULT_MAX_SESSIONS: usize = 1000;

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
    /// What each client may see and lease ([`crate::scope`]); a client without a scope sees
    /// every proxy.
    pub scopes: crate::Scopes,
    /// Live sessions one client may hold (`--max-sessions-per-client`).
    pub max_sessions: usize,
}

impl std::fmt::Debug for DiscoveryApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryApi")
            .field("max_ttl", &self.max_ttl)
            .field("auth", &self.auth)
            .field("admission", &self.admission)
            .field("scopes", &self.scopes)
            .field("max_sessions", &self.max_sessions)
            .finish_non_exhaustive()
    }
}

/// An answer: status and its JSON body, already encoded (`None`: no body).
pub(crate) type Answer = (u16, Option<Vec<u8>>);

fn encoded(value: &impl serde::Serialize) -> Option<Vec<u8>> {
    Some(serde_json::to_vec(value).unwrap_or_default())
}

pub(crate) fn error(status: u16, code: &str, message: &str) -> Answer {
    let body = ErrorBody {
        error: Cow::Borrowed(code),
        message: Cow::Borrowed(message),
        no_match: None,
    };
    (status, encoded(&body))
}

/// The proxy view of §5.5, lending the directory's data: encoded without a copy.
fn view(p: &ProxyInfo, active: usize) -> ProxyView<'_> {
    ProxyView {
        id: Cow::Borrowed(&p.id),
        ip: Cow::Borrowed(&p.ip),
        port: p.port,
        attributes: Cow::Borrowed(&p.attributes),
        phase: Cow::Borrowed(&p.phase),
        healthy: p.healthy,
        latency_millis: p.latency_millis,
        active_leases: u64::try_from(active).unwrap_or(u64::MAX),
        max_leases: i64::from(p.max_leases),
        pool_role: p.pool_role.map(Cow::Borrowed),
        exit: p.exit.as_ref().map(|e| ExitView {
            address: Cow::Borrowed(&e.address),
            verification: Cow::Borrowed(&e.verification),
            country: e.country.as_deref().map(Cow::Borrowed),
            asn: e.asn,
            organization: e.organization.as_deref().map(Cow::Borrowed),
        }),
    }
}

/// The view of a leased proxy: the list's, and its credentials when it has them.
fn leased(p: &ProxyInfo, active: usize) -> LeasedProxy<'_> {
    let c = p.credentials.as_ref();
    LeasedProxy {
        view: view(p, active),
        username: c.map(|c| Cow::Borrowed(c.username())),
        password: c.map(|c| Cow::Borrowed(c.password())),
        url: c.map(|c| Cow::Owned(c.proxy_url(&p.ip, p.port))),
    }
}

use crate::selection::{Plan, Selector};

fn matches(p: &ProxyInfo, selector: &Selector) -> bool {
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

/// Whether `p` is one the caller may see and lease: any, for a caller without a scope.
fn in_scope(scope: Option<&ClientScope>, p: &ProxyInfo) -> bool {
    scope.is_none_or(|s| s.allows(p))
}

/// The list's query: `healthy` and the `attr.<k>` selector.
fn list_query(query: Option<&str>) -> Result<(Option<bool>, Selector), Answer> {
    let mut healthy = None;
    let mut selector = Selector::new();
    for (k, v) in form_pairs(query.unwrap_or_default()) {
        if k == "healthy" {
            healthy = match v.as_str() {
                "" => None,
                "true" => Some(true),
                "false" => Some(false),
                _ => return Err(error(400, "invalid_query", "healthy must be true or false")),
            };
        } else if let Some(attr) = k.strip_prefix("attr.") {
            selector.entry(attr.to_string()).or_default().push(v);
        }
    }
    Ok((healthy, selector))
}

/// The lease candidates among `proxies` that `plan` reads, lazily, in (latency, id) order: the
/// store stops at the first idle eligible proxy, so a lease costs the same with ten proxies or
/// ten thousand. Standby and draining pool members, and proxies outside the caller's scope, are
/// none.
fn candidates<'a>(
    proxies: &'a Fleet,
    plan: &Plan,
    selector: &'a Selector,
    scope: Option<&'a ClientScope>,
) -> impl Iterator<Item = Candidate<'a>> + Send + 'a {
    crate::selection::read(plan, proxies)
        .filter(move |p| leasable(p, selector, scope))
        .map(candidate)
}

/// Whether `p` is one of the caller's lease candidates for `selector`.
fn leasable(p: &ProxyInfo, selector: &Selector, scope: Option<&ClientScope>) -> bool {
    p.offered && matches(p, selector) && in_scope(scope, p)
}

fn candidate(p: &ProxyInfo) -> Candidate<'_> {
    Candidate {
        id: &p.id,
        healthy: p.healthy,
        latency_millis: p.latency_millis,
        max_leases: p.max_leases,
        pool: p.lease_pool(),
    }
}

type Acquired = Result<Grant, NoMatch>;

/// `POST /v1/leases`' body, validated.
struct Asked {
    ttl: Duration,
    target: Option<Target>,
    session: Option<SessionName>,
    /// The selector as given (what a refusal is counted for).
    pairs: BTreeMap<String, String>,
    /// The same as the list's selector.
    selector: Selector,
}

/// The acquire's body, or the `400` that says what is wrong with it (a TTL over `max_ttl`).
fn asked(body: &[u8], max_ttl: Duration) -> Result<Asked, Answer> {
    let body: wire::LeaseRequest = decode(body)?;
    let ttl = effective_ttl(body.ttl_seconds, max_ttl).map_err(|e| error(400, "invalid_ttl", &e.to_string()))?;
    let target = target(body.target.as_deref())?;
    let session = body
        .session
        .as_deref()
        .map(SessionName::parse)
        .transpose()
        .map_err(|e| error(400, "invalid_session", &e.to_string()))?;
    let selector = body
        .selector
        .iter()
        .map(|(k, v)| (k.clone(), vec![v.clone()]))
        .collect();
    Ok(Asked {
        ttl,
        target,
        session,
        pairs: body.selector,
        selector,
    })
}

impl DiscoveryApi {
    /// `GET /v1/proxies?healthy=&attr.<k>=`: the proxies the caller may see (its scope's).
    pub(crate) async fn list(&self, scope: Option<&ClientScope>, query: Option<&str>) -> Answer {
        let (healthy, selector) = match list_query(query) {
            Ok(q) => q,
            Err(answer) => return answer,
        };
        let all = match self.directory.proxies() {
            Ok(p) => p,
            Err(e) => return list_failed(&e, "listing proxies"),
        };
        let proxies: Vec<&ProxyInfo> = all
            .in_id_order()
            .filter(|p| healthy.is_none_or(|h| p.healthy == h) && matches(p, &selector) && in_scope(scope, p))
            .collect();
        let placed: Vec<ProxyRef<'_>> = proxies
            .iter()
            .map(|p| ProxyRef {
                id: &p.id,
                pool: p.lease_pool(),
            })
            .collect();
        let active = match self.store.active_leases(&placed).await {
            Ok(a) => a,
            Err(e) => return store_failed(&e, "reading active leases"),
        };
        let views: Vec<ProxyView<'_>> = proxies.iter().zip(active).map(|(p, n)| view(p, n)).collect();
        (
            200,
            encoded(&ProxyList {
                count: views.len() as u64,
                proxies: views,
            }),
        )
    }

    /// `POST /v1/leases`, choosing among the proxies the caller may lease (its scope's).
    pub(crate) async fn acquire(&self, client: &crate::ClientName, scope: Option<&ClientScope>, body: &[u8]) -> Answer {
        let asked = match asked(body, self.max_ttl) {
            Ok(a) => a,
            Err(answer) => return answer,
        };
        let proxies = match self.directory.proxies() {
            Ok(p) => p,
            Err(e) => return list_failed(&e, "listing proxies for lease"),
        };
        let plan = crate::selection::plan(&asked.selector, &proxies);
        if let Some(name) = &asked.session {
            let session = Session {
                client: client.as_str(),
                name,
                cap: self.max_sessions,
            };
            return self.acquire_in_session(&proxies, &plan, &asked, scope, &session).await;
        }
        let req = LeaseRequest {
            ttl: asked.ttl,
            target: asked.target,
            scope: crate::selection::store_scope(&plan, scope.is_some(), &proxies),
        };
        let acquired = match self
            .store
            .acquire(&mut candidates(&proxies, &plan, &asked.selector, scope), &req)
            .await
        {
            Ok(a) => a,
            Err(e) => return store_failed(&e, "acquiring a lease"),
        };
        let acquired = match self
            .among_own(acquired, &proxies, &plan, &asked.selector, scope, req)
            .await
        {
            Ok(a) => a,
            Err(answer) => return answer,
        };
        match acquired {
            Ok(grant) => granted(&proxies, &grant),
            Err(n) => {
                self.record_refusal(scope, &asked.pairs);
                no_match(&n)
            }
        }
    }

    /// `POST /v1/leases` naming a session: the session's lease (`200`) while its proxy is one of
    /// the caller's candidates, healthy and not cooling down for the target; else a new one
    /// (`201`), which the session names from then on.
    async fn acquire_in_session(
        &self,
        proxies: &Fleet,
        plan: &Plan,
        asked: &Asked,
        scope: Option<&ClientScope>,
        session: &Session<'_>,
    ) -> Answer {
        let selector = &asked.selector;
        let member = |id: &str| proxies.get(id).filter(|p| leasable(p, selector, scope)).map(candidate);
        let req = LeaseRequest {
            ttl: asked.ttl,
            target: asked.target,
            scope: Scope::Listed,
        };
        let acquired = self
            .store
            .acquire_session(&mut candidates(proxies, plan, selector, scope), &member, &req, session)
            .await;
        match acquired {
            Ok(Ok(grant)) => granted(proxies, &grant),
            Ok(Err(SessionRefused::NoMatch(n))) => {
                self.record_refusal(scope, &asked.pairs);
                no_match(&n)
            }
            Ok(Err(SessionRefused::TooMany { held, cap })) => error(
                409,
                "too_many_sessions",
                &format!(
                    "this client holds {held} live sessions, its most ({cap}); release a session's lease or let one expire"
                ),
            ),
            Err(e) => store_failed(&e, "acquiring a lease in a session"),
        }
    }

    /// `POST /v1/leases/{id}/renew`: the lease extended to the TTL asked for from now (never
    /// shortened), while its proxy is offered and healthy.
    pub(crate) async fn renew(&self, id: &str, body: &[u8]) -> Answer {
        let body: wire::Renewal = match decode(body) {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        let ttl = match effective_ttl(body.ttl_seconds, self.max_ttl) {
            Ok(t) => t,
            Err(e) => return error(400, "invalid_ttl", &e.to_string()),
        };
        let proxies = match self.directory.proxies() {
            Ok(p) => p,
            Err(e) => return list_failed(&e, "listing proxies for a renewal"),
        };
        let fit = |id: &str| proxies.get(id).is_some_and(|p| p.offered && p.healthy);
        match self.store.renew(id, ttl, &fit).await {
            Ok(Ok(grant)) => granted(&proxies, &grant),
            Ok(Err(NotRenewed::Ended)) => error(404, "unknown_lease", "no such active lease"),
            Ok(Err(NotRenewed::Unfit { .. })) => error(
                409,
                "not_renewable",
                "the lease's proxy is draining, a standby, gone or unhealthy: the lease runs to its expiry; acquire another",
            ),
            Err(e) => store_failed(&e, "renewing a lease"),
        }
    }

    /// From its indexes, a shared store may grant a proxy this replica does not offer yet (or
    /// any more), or whose attributes it knows otherwise: the leader's view is newer or older
    /// than its cache. That lease is given back (if that fails, it holds its slot until its
    /// expiry) and the choice made among the proxies offered here. A grant outside the caller's
    /// scope (which the listed candidates never give) would be handled the same: a lease answer
    /// never carries such a proxy.
    async fn among_own(
        &self,
        acquired: Acquired,
        proxies: &Fleet,
        plan: &Plan,
        selector: &Selector,
        scope: Option<&ClientScope>,
        req: LeaseRequest,
    ) -> Result<Acquired, Answer> {
        let Ok(grant) = &acquired else {
            return Ok(acquired);
        };
        if proxies
            .get(&grant.proxy_id)
            .is_some_and(|p| leasable(p, selector, scope))
        {
            return Ok(acquired);
        }
        if let Err(e) = self.store.release(&grant.lease_id).await {
            return Err(store_failed(&e, "giving back a lease on an unknown proxy"));
        }
        let listed = LeaseRequest {
            scope: Scope::Listed,
            ..req
        };
        self.store
            .acquire(&mut candidates(proxies, plan, selector, scope), &listed)
            .await
            .map_err(|e| store_failed(&e, "acquiring a lease"))
    }

    /// Counts a refused request for the pools it named, for their autoscalers; a scoped
    /// caller's only for the pools in its scope, so that no client grows another's pool.
    fn record_refusal(&self, scope: Option<&ClientScope>, selector: &BTreeMap<String, String>) {
        let Some(refusals) = &self.refusals else {
            return;
        };
        match scope {
            None => refusals.record(selector),
            Some(scope) => refusals.record_where(selector, |pool| scope.allows_pool(pool)),
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
        let (result, target) = match reported(body) {
            Ok(r) => r,
            Err(answer) => return answer,
        };
        match self.store.report(id, result, target).await {
            Ok(Ok(())) => (204, None),
            Ok(Err(_)) => error(404, "unknown_lease", "no such lease"),
            Err(e) => store_failed(&e, "recording a report"),
        }
    }

    /// `POST /v1/sessions/{session}/report`: the report on the caller's session's lease, as
    /// on the lease itself, for a client that knows its session but not its lease (one behind
    /// the gateway). A ban for the target moves the session at its next acquire for it.
    pub(crate) async fn report_session(&self, client: &crate::ClientName, session: &str, body: &[u8]) -> Answer {
        let name = match SessionName::parse(session) {
            Ok(n) => n,
            Err(e) => return error(400, "invalid_session", &e.to_string()),
        };
        let (result, target) = match reported(body) {
            Ok(r) => r,
            Err(answer) => return answer,
        };
        let key = Session {
            client: client.as_str(),
            name: &name,
            cap: self.max_sessions,
        }
        .key();
        let leases = match self.store.session_leases(&key).await {
            Ok(l) => l,
            Err(e) => return store_failed(&e, "finding a session's lease"),
        };
        if leases.is_empty() {
            return error(404, "unknown_session", "this client has no live session of that name");
        }
        for lease in &leases {
            // A lease that ended meanwhile is no longer the session's: nothing to report on.
            if let Err(e) = self.store.report(lease, result, target).await {
                return store_failed(&e, "recording a report");
            }
        }
        (204, None)
    }
}

/// A report's body: its result and target, or the `400` that says what is wrong.
fn reported(body: &[u8]) -> Result<(ReportResult, Option<Target>), Answer> {
    let body: Report = decode(body)?;
    let Ok(result) = body.result.parse::<ReportResult>() else {
        return Err(error(
            400,
            "invalid_result",
            "result must be ok, rate_limited or banned",
        ));
    };
    Ok((result, target(body.target.as_deref())?))
}

/// The lease and its proxy: `201` for a new lease, `200` for one extended (a session's, or a
/// renewal).
fn granted(proxies: &Fleet, grant: &Grant) -> Answer {
    // NB: the store grants only among the candidates it was given, which come from `proxies`
    // (`among_own` makes sure of it for a grant from the store's index), so the proxy is there.
    // Were it not, the answer could not be the documented one: a 500, not a lease without its
    // proxy.
    let Some(proxy) = proxies.get(&grant.proxy_id) else {
        tracing::error!(proxy = %grant.proxy_id, "A lease was granted on a proxy that is not listed");
        return error(500, "internal", "the leased proxy is not listed");
    };
    let expires_at = jiff::Timestamp::try_from(grant.expires_at)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    (
        if grant.resumed { 200 } else { 201 },
        encoded(&Lease {
            lease_id: Cow::Borrowed(&grant.lease_id),
            proxy: leased(proxy, grant.active_leases),
            expires_at: Cow::Owned(expires_at),
            ttl_seconds: grant.ttl.as_secs(),
        }),
    )
}

/// `409 no_match` with the counts of the candidates considered (only those the caller may
/// lease: a refusal reveals nothing outside its scope).
fn no_match(n: &NoMatch) -> Answer {
    (
        409,
        encoded(&ErrorBody {
            error: Cow::Borrowed("no_match"),
            message: Cow::Borrowed("no healthy proxy with free capacity matched the selector"),
            no_match: Some(NoMatchCounts {
                considered: n.considered as u64,
                at_capacity: n.at_capacity as u64,
                in_cooldown: n.in_cooldown as u64,
                unhealthy: n.unhealthy as u64,
            }),
        }),
    )
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
/// `null` for a field or the whole body as nothing (`{"selector": null}` is no selector), and
/// any other value than an object refused (serde would fill a struct from an array's items in
/// order, which Go never did).
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
    if !(value.is_object() || value.is_null()) {
        return Err(error(400, "invalid_body", "the body must be a JSON object"));
    }
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
