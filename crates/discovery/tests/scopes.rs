//! Client scopes over real HTTP: a client scoped to one pool of one namespace lists and leases
//! only that pool's members, whatever it asks and however often; its refusals show and count
//! nothing outside its scope; it never takes the store's installation-wide path; a scope put in
//! force applies to the next request. A client without a scope, and every caller without
//! auth, sees every proxy as before.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{Fixed, info, serve_on_loopback};
use egress_discovery::{Auth, ClientName, ClientScope, DiscoveryApi, ProxyInfo, Refusals, Scopes, TokenSet};
use egress_lease::testing::{Hooked, Hooks};
use egress_lease::{Candidate, LeaseRequest, ManualClock, MemoryStore, Scope};
use serde_json::Value;

const TEAM_A: &str = "team-a-token";
const TEAM_B: &str = "team-b-token";
const DEFAULT: &str = "default-token";
const CAPACITY: i32 = 3;

/// A member of `pool` in its namespace (the `pool` attribute as the pool controller writes it).
fn member(id: &str, pool: &str, latency: i64) -> ProxyInfo {
    ProxyInfo {
        pool_role: Some("active"),
        pool: Some(pool.into()),
        ..info(id, true, latency, CAPACITY, &[("pool", pool)])
    }
}

/// Two members of pool-a in crawlers (team-a's scope), and, all of them better candidates by
/// latency: pool-b's members, a pool-a of another namespace, a proxy that carries the attribute
/// `pool: pool-a` without being a member, and a proxy in no pool.
fn fleet() -> Vec<ProxyInfo> {
    vec![
        member("crawlers/a-1", "pool-a", 20),
        member("crawlers/a-2", "pool-a", 30),
        member("crawlers/b-1", "pool-b", 0),
        member("crawlers/b-2", "pool-b", 0),
        member("team-b/a-1", "pool-a", 0),
        info("crawlers/spoof", true, 0, CAPACITY, &[("pool", "pool-a")]),
        info("crawlers/lone", true, 0, CAPACITY, &[]),
    ]
}

const IN_SCOPE: [&str; 2] = ["crawlers/a-1", "crawlers/a-2"];

fn team_a_scope(pool: &str) -> Arc<ClientScope> {
    Arc::new(ClientScope::new(Some(vec!["crawlers".into()]), Some(vec![pool.into()])).unwrap())
}

/// The memory store, recording the scope of every acquire; when `rogue` is set, its next
/// acquire grants `crawlers/b-1` whatever the candidates (as an index that knew no scopes
/// would).
struct Recording {
    scopes: Mutex<Vec<Scope>>,
    rogue: AtomicBool,
}

impl Hooks for Recording {
    fn acquiring(&self, req: &LeaseRequest) -> Option<Candidate<'static>> {
        self.scopes.lock().unwrap().push(req.scope.clone());
        self.rogue.swap(false, Ordering::SeqCst).then_some(Candidate {
            id: "crawlers/b-1",
            healthy: true,
            latency_millis: 0,
            max_leases: CAPACITY,
            pool: None,
        })
    }
}

struct Server {
    url: String,
    store: Arc<Hooked<Recording>>,
    scopes: Scopes,
    refusals: Arc<Refusals>,
    http: reqwest::Client,
    _stop: tokio_util::sync::DropGuard,
}

/// The API over [`fleet`], with team-a scoped to pool-a of crawlers, team-b unscoped, and the
/// client `default`; every caller is `default` when `auth` is off.
async fn start(auth: bool) -> Server {
    let name = |n: &str| ClientName::parse(n).unwrap();
    let clients = BTreeMap::from([
        (name("team-a"), vec![TEAM_A.to_owned()]),
        (name("team-b"), vec![TEAM_B.to_owned()]),
        (ClientName::default(), vec![DEFAULT.to_owned()]),
    ]);
    let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let store = Arc::new(Hooked {
        inner: MemoryStore::new(Arc::new(clock), Duration::from_secs(900)),
        hooks: Recording {
            scopes: Mutex::default(),
            rogue: AtomicBool::new(false),
        },
    });
    let scopes = Scopes::default();
    scopes.set(BTreeMap::from([("team-a".to_owned(), team_a_scope("pool-a"))]));
    let refusals = Arc::new(Refusals::new("pool"));
    let (url, stop) = serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(fleet())),
        store: store.clone(),
        max_ttl: Duration::from_secs(3600),
        auth: if auth {
            Auth::Tokens(Arc::new(TokenSet::of_clients(&clients)))
        } else {
            Auth::None
        },
        refusals: Some(refusals.clone()),
        admission: egress_discovery::Admission::default(),
        scopes: scopes.clone(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
    })
    .await;
    Server {
        url,
        store,
        scopes,
        refusals,
        http: reqwest::Client::new(),
        _stop: stop,
    }
}

impl Server {
    async fn call(&self, token: &str, method: reqwest::Method, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(token)
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The ids a list as `token` shows, checked against its count.
    async fn listed(&self, token: &str, query: &str) -> Vec<String> {
        let (status, body) = self
            .call(token, reqwest::Method::GET, &format!("/v1/proxies{query}"), "")
            .await;
        assert_eq!(status, 200, "{body}");
        let ids: Vec<String> = body["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(body["count"], ids.len(), "{body}");
        ids
    }

    async fn lease(&self, token: &str, body: &str) -> (u16, Value) {
        self.call(token, reqwest::Method::POST, "/v1/leases", body).await
    }

    fn scopes_asked(&self) -> Vec<Scope> {
        std::mem::take(&mut *self.store.hooks.scopes.lock().unwrap())
    }
}

fn all_ids() -> Vec<String> {
    let mut ids: Vec<String> = fleet().into_iter().map(|p| p.id).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_scoped_client_lists_only_its_scope_and_others_list_everything() {
    let s = start(true).await;
    assert_eq!(s.listed(TEAM_A, "").await, IN_SCOPE);
    assert_eq!(s.listed(TEAM_A, "?attr.pool=pool-b").await, Vec::<String>::new());
    assert_eq!(s.listed(TEAM_A, "?attr.pool=pool-a&healthy=true").await, IN_SCOPE);
    assert_eq!(s.listed(TEAM_B, "").await, all_ids(), "no scope: every proxy");
    assert_eq!(s.listed(DEFAULT, "").await, all_ids());
    assert_eq!(
        s.listed(TEAM_B, "?attr.pool=pool-a").await.len(),
        4,
        "the attribute, as before"
    );
}

#[tokio::test]
async fn a_scoped_client_is_granted_only_its_pool_s_members_and_refused_as_if_nothing_else_existed() {
    let s = start(true).await;
    let mut granted = BTreeSet::new();
    let mut leases = Vec::new();
    for body in [
        "{}",
        r#"{"selector": {"pool": "pool-a"}}"#,
        r#"{"target": "shop.example"}"#,
    ]
    .iter()
    .cycle()
    .take(2 * CAPACITY as usize)
    {
        let (status, answer) = s.lease(TEAM_A, body).await;
        assert_eq!(status, 201, "{answer}");
        let id = answer["proxy"]["id"].as_str().unwrap().to_owned();
        assert!(IN_SCOPE.contains(&id.as_str()), "{id} is outside team-a's scope");
        granted.insert(id);
        leases.push(answer["leaseID"].as_str().unwrap().to_owned());
    }
    assert_eq!(granted.into_iter().collect::<Vec<_>>(), IN_SCOPE);
    assert!(
        s.scopes_asked().iter().all(|scope| *scope == Scope::Listed),
        "a scoped client never takes the installation's index"
    );
    // Its pool is full: refused, with counts of its own candidates only, though five other
    // proxies have room.
    for body in ["{}", r#"{"selector": {"pool": "pool-a"}}"#] {
        let (status, answer) = s.lease(TEAM_A, body).await;
        assert_eq!(status, 409, "{answer}");
        assert_eq!(
            (&answer["considered"], &answer["atCapacity"], &answer["unhealthy"]),
            (&Value::from(2), &Value::from(2), &Value::from(0)),
            "{answer}"
        );
    }
    // A pool outside its scope matches nothing, as a pool that does not exist.
    let (status, answer) = s.lease(TEAM_A, r#"{"selector": {"pool": "pool-b"}}"#).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["considered"], 0, "{answer}");
    // Its own leases it gives back and reports on as before.
    let report = format!("/v1/leases/{}/report", leases[0]);
    let (status, _) = s
        .call(TEAM_A, reqwest::Method::POST, &report, r#"{"result": "ok"}"#)
        .await;
    assert_eq!(status, 204);
    let release = format!("/v1/leases/{}", leases[0]);
    assert_eq!(s.call(TEAM_A, reqwest::Method::DELETE, &release, "").await.0, 204);
    // Meanwhile the unscoped client gets the best of the whole fleet, from the index.
    s.scopes_asked();
    let (status, answer) = s.lease(TEAM_B, "{}").await;
    assert_eq!(
        (status, answer["proxy"]["id"].as_str()),
        (201, Some("crawlers/b-1")),
        "{answer}"
    );
    assert_eq!(s.scopes_asked(), [Scope::Installation]);
}

#[tokio::test]
async fn a_grant_outside_the_scope_is_given_back_and_the_choice_made_within_it() {
    let s = start(true).await;
    s.store.hooks.rogue.store(true, Ordering::SeqCst);
    let (status, answer) = s.lease(TEAM_A, "{}").await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["proxy"]["id"], "crawlers/a-1", "{answer}");
    assert_eq!(s.scopes_asked(), [Scope::Listed, Scope::Listed]);
    let (_, list) = s.call(TEAM_B, reqwest::Method::GET, "/v1/proxies", "").await;
    let b1 = list["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "crawlers/b-1")
        .unwrap();
    assert_eq!(b1["activeLeases"], 0, "the stray lease was given back: {b1}");
}

#[tokio::test]
async fn a_scoped_client_s_refusals_count_only_for_pools_in_its_scope() {
    let s = start(true).await;
    let none = BTreeMap::new();
    for (key, name) in [
        ("crawlers/pool-a", "pool-a"),
        ("crawlers/pool-b", "pool-b"),
        ("team-b/pool-a", "pool-a"),
    ] {
        s.refusals.watch_pool(key, name, &none);
    }
    assert_eq!(s.lease(TEAM_A, r#"{"selector": {"pool": "pool-b"}}"#).await.0, 409);
    assert_eq!(s.refusals.take_refused(), Vec::<String>::new(), "not team-a's to grow");
    for _ in 0..2 * CAPACITY {
        assert_eq!(s.lease(TEAM_A, "{}").await.0, 201);
    }
    assert_eq!(s.lease(TEAM_A, r#"{"selector": {"pool": "pool-a"}}"#).await.0, 409);
    assert_eq!(s.refusals.take_refused(), ["crawlers/pool-a"]);
}

#[tokio::test]
async fn a_scope_put_in_force_applies_to_the_next_request() {
    let s = start(true).await;
    s.scopes
        .set(BTreeMap::from([("team-a".to_owned(), team_a_scope("pool-b"))]));
    assert_eq!(s.listed(TEAM_A, "").await, ["crawlers/b-1", "crawlers/b-2"]);
    let (status, answer) = s.lease(TEAM_A, r#"{"selector": {"pool": "pool-a"}}"#).await;
    assert_eq!((status, &answer["considered"]), (409, &Value::from(0)), "{answer}");
    s.scopes.set(BTreeMap::new());
    assert_eq!(s.listed(TEAM_A, "").await, all_ids(), "no scope any more: every proxy");
}

#[tokio::test]
async fn without_auth_every_caller_is_default_and_sees_every_proxy() {
    let s = start(false).await;
    assert_eq!(s.listed(TEAM_A, "").await, all_ids());
    assert_eq!(s.lease(TEAM_A, "{}").await.1["proxy"]["id"], "crawlers/b-1");
}
