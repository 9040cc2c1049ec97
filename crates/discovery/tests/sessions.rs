//! Sessions and renewal over real HTTP: a session's lease answered again (`200`) and moved, each
//! client's sessions its own and capped, renewals, and what each mistake gets; the Rust client
//! against the same server.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{Changing, info, serve_on_loopback};
use egress_discovery::client::{AcquireRequest, Client, ClientError};
use egress_discovery::{Auth, ClientName, DiscoveryApi, TokenSet};
use egress_lease::{LeaseStore, ManualClock, MemoryStore};
use serde_json::{Value, json};

const TEAM_A: &str = "token-of-team-a";
const TEAM_B: &str = "token-of-team-b";

struct Server {
    url: String,
    directory: Arc<Changing>,
    store: Arc<MemoryStore>,
    clock: ManualClock,
    http: reqwest::Client,
    _stop: tokio_util::sync::DropGuard,
}

/// The API for the clients team-a and team-b, each holding at most `cap` sessions, over a
/// and b (capacity 5 each, a faster).
async fn start(cap: usize) -> Server {
    let name = |n: &str| ClientName::parse(n).unwrap();
    let clients = BTreeMap::from([
        (name("team-a"), vec![TEAM_A.to_owned()]),
        (name("team-b"), vec![TEAM_B.to_owned()]),
    ]);
    let directory = Arc::new(Changing::default());
    directory.set(vec![info("ns/a", true, 10, 5, &[]), info("ns/b", true, 20, 5, &[])]);
    let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone()), Duration::from_secs(900)));
    let (url, stop) = serve_on_loopback(DiscoveryApi {
        directory: directory.clone(),
        store: store.clone(),
        max_ttl: Duration::from_secs(3600),
        auth: Auth::Tokens(Arc::new(TokenSet::of_clients(&clients))),
        refusals: None,
        admission: egress_discovery::Admission::default(),
        scopes: egress_discovery::Scopes::default(),
        max_sessions: cap,
    })
    .await;
    Server {
        url,
        directory,
        store,
        clock,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        _stop: stop,
    }
}

impl Server {
    /// The status and the body as text.
    async fn post_text(&self, token: &str, path: &str, body: Value) -> (u16, String) {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    }

    async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        let (status, text) = self.post_text(token, path, body).await;
        (status, serde_json::from_str(&text).unwrap())
    }

    async fn lease(&self, token: &str, body: Value) -> (u16, Value) {
        self.post(token, "/v1/leases", body).await
    }

    /// `POST /v1/sessions/{session}/report`: the status and the body as text.
    async fn report_session(&self, token: &str, session: &str, body: Value) -> (u16, String) {
        self.post_text(token, &format!("/v1/sessions/{session}/report"), body)
            .await
    }

    async fn renew(&self, id: &Value, body: Value) -> (u16, Value) {
        self.post(TEAM_A, &format!("/v1/leases/{}/renew", id.as_str().unwrap()), body)
            .await
    }
}

#[tokio::test]
async fn a_session_is_answered_again_until_its_proxy_is_unfit() {
    let s = start(10).await;
    let (status, first) = s.lease(TEAM_A, json!({"session": "login-1"})).await;
    assert_eq!((status, &first["proxy"]["id"]), (201, &json!("ns/a")), "{first}");
    s.clock.advance(Duration::from_secs(60));
    let (status, again) = s.lease(TEAM_A, json!({"session": "login-1", "ttlSeconds": 600})).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["leaseID"], first["leaseID"]);
    assert_eq!(
        (again["ttlSeconds"].as_u64(), &again["proxy"]["activeLeases"]),
        (Some(600), &json!(1))
    );
    // The same name is another session for another client.
    let (status, theirs) = s.lease(TEAM_B, json!({"session": "login-1"})).await;
    assert_eq!(status, 201);
    assert_ne!(theirs["leaseID"], first["leaseID"]);
    // a turns unhealthy: the session moves to b, and a's slot is given back.
    s.directory
        .set(vec![info("ns/a", false, 10, 5, &[]), info("ns/b", true, 20, 5, &[])]);
    let (status, moved) = s.lease(TEAM_A, json!({"session": "login-1"})).await;
    assert_eq!((status, &moved["proxy"]["id"]), (201, &json!("ns/b")), "{moved}");
    assert_eq!(
        s.store
            .active_leases(&["ns/a", "ns/b"].map(egress_lease::ProxyRef::unpooled))
            .await
            .unwrap(),
        [0, 2],
        "a's slot given back; team-b's session is on b"
    );
    // A selector the session's proxy does not match moves it too.
    s.directory.set(vec![
        info("ns/a", true, 10, 5, &[("geo", "eu")]),
        info("ns/b", true, 20, 5, &[]),
    ]);
    let (status, eu) = s
        .lease(TEAM_A, json!({"session": "login-1", "selector": {"geo": "eu"}}))
        .await;
    assert_eq!((status, &eu["proxy"]["id"]), (201, &json!("ns/a")), "{eu}");
}

#[tokio::test]
async fn each_client_s_sessions_are_capped() {
    let s = start(1).await;
    assert_eq!(s.lease(TEAM_A, json!({"session": "one"})).await.0, 201);
    let (status, refused) = s.lease(TEAM_A, json!({"session": "two"})).await;
    assert_eq!(
        (status, &refused["error"]),
        (409, &json!("too_many_sessions")),
        "{refused}"
    );
    assert!(refused["message"].as_str().unwrap().contains("(1)"), "{refused}");
    assert_eq!(
        s.lease(TEAM_A, json!({"session": "one"})).await.0,
        200,
        "resumed at the cap"
    );
    assert_eq!(s.lease(TEAM_A, json!({})).await.0, 201, "a plain lease is no session");
    assert_eq!(s.lease(TEAM_B, json!({"session": "two"})).await.0, 201, "its own cap");
    assert_eq!(
        s.store.sessions_now(),
        [("team-a".to_owned(), 1), ("team-b".to_owned(), 1)]
    );
}

#[tokio::test]
async fn a_held_lease_is_renewed_and_an_ended_or_unfit_one_is_not() {
    let s = start(10).await;
    let (_, lease) = s.lease(TEAM_A, json!({"ttlSeconds": 60})).await;
    s.clock.advance(Duration::from_secs(30));
    let (status, renewed) = s.renew(&lease["leaseID"], json!({"ttlSeconds": 120})).await;
    assert_eq!((status, &renewed["leaseID"]), (200, &lease["leaseID"]), "{renewed}");
    assert_eq!(renewed["ttlSeconds"], 120);
    let (status, default) = s.renew(&lease["leaseID"], json!({})).await;
    assert_eq!((status, &default["ttlSeconds"]), (200, &json!(300)), "absent is 300 s");
    for (body, code) in [
        (json!({"ttlSeconds": 3601}), "invalid_ttl"),
        (json!({"ttlSeconds": -1}), "invalid_ttl"),
        (json!({"ttlSeconds": "soon"}), "invalid_body"),
    ] {
        let (status, e) = s.renew(&lease["leaseID"], body).await;
        assert_eq!((status, &e["error"]), (400, &json!(code)), "{e}");
    }
    // Its proxy drained: not renewable, and the lease is untouched.
    let mut draining = info("ns/a", true, 10, 5, &[]);
    draining.offered = false;
    s.directory.set(vec![draining, info("ns/b", true, 20, 5, &[])]);
    let (status, e) = s.renew(&lease["leaseID"], json!({"ttlSeconds": 900})).await;
    assert_eq!((status, &e["error"]), (409, &json!("not_renewable")), "{e}");
    s.clock.advance(Duration::from_secs(300));
    let (status, e) = s.renew(&lease["leaseID"], json!({})).await;
    assert_eq!((status, &e["error"]), (404, &json!("unknown_lease")), "expired: {e}");
    let (status, e) = s.renew(&json!("NEVERISSUED"), json!({})).await;
    assert_eq!((status, &e["error"]), (404, &json!("unknown_lease")), "{e}");
}

#[tokio::test]
async fn a_ban_reported_by_session_moves_it_for_that_target_only() {
    let s = start(10).await;
    let at = |target: &str| json!({"session": "login-1", "target": target});
    let (status, first) = s.lease(TEAM_A, at("shop.example")).await;
    assert_eq!((status, &first["proxy"]["id"]), (201, &json!("ns/a")), "{first}");
    let banned = json!({"result": "banned", "target": "shop.example"});
    // Another client has no session of that name; a name outside the grammar; a bad result.
    assert_eq!(s.report_session(TEAM_B, "login-1", banned.clone()).await.0, 404);
    let (status, e) = s.report_session(TEAM_A, "no%20spaces", banned.clone()).await;
    assert!(status == 400 && e.contains("invalid_session"), "{status} {e}");
    let (status, e) = s.report_session(TEAM_A, "login-1", json!({"result": "meh"})).await;
    assert!(status == 400 && e.contains("invalid_result"), "{status} {e}");
    assert_eq!(s.report_session(TEAM_A, "login-1", banned).await, (204, String::new()));
    // Elsewhere the session stays where it is; for the banned target it moves.
    let (status, other) = s.lease(TEAM_A, at("other.example")).await;
    assert_eq!((status, &other["leaseID"]), (200, &first["leaseID"]), "{other}");
    let (status, moved) = s.lease(TEAM_A, at("shop.example")).await;
    assert_eq!((status, &moved["proxy"]["id"]), (201, &json!("ns/b")), "{moved}");
    // Released, the session has ended: nothing to report on.
    let lease = moved["leaseID"].as_str().unwrap();
    s.http
        .delete(format!("{}/v1/leases/{lease}", s.url))
        .bearer_auth(TEAM_A)
        .send()
        .await
        .unwrap();
    let (status, e) = s.report_session(TEAM_A, "login-1", json!({"result": "banned"})).await;
    assert!(status == 404 && e.contains("unknown_session"), "{status} {e}");
}

#[tokio::test]
async fn session_names_outside_the_grammar_are_refused() {
    let s = start(10).await;
    for bad in [json!(""), json!("a b"), json!("x".repeat(65)), json!("ünï"), json!(7)] {
        let (status, e) = s.lease(TEAM_A, json!({"session": bad})).await;
        let code = if bad.is_string() {
            "invalid_session"
        } else {
            "invalid_body"
        };
        assert_eq!((status, &e["error"]), (400, &json!(code)), "{bad}: {e}");
    }
    assert_eq!(s.store.active_total().await.unwrap(), 0);
}

#[tokio::test]
async fn the_rust_client_resumes_renews_and_names_the_session_errors() {
    let s = start(1).await;
    let api = Client::new(&s.url, Some(TEAM_A.into())).unwrap();
    let sticky = |name: &str| AcquireRequest {
        session: Some(name.into()),
        ..Default::default()
    };
    let first = api.acquire(&sticky("s")).await.unwrap();
    let again = api.acquire(&sticky("s")).await.unwrap();
    assert_eq!(again.lease_id, first.lease_id);
    assert!(matches!(
        api.acquire(&sticky("t")).await,
        Err(ClientError::TooManySessions(_))
    ));
    assert!(matches!(
        api.acquire(&sticky("no spaces")).await,
        Err(ClientError::InvalidSession(_))
    ));
    let renewed = api
        .renew(&first.lease_id, Some(Duration::from_secs(900)))
        .await
        .unwrap();
    assert_eq!((&renewed.lease_id, renewed.ttl_seconds), (&first.lease_id, 900));
    let mut draining = info("ns/a", true, 10, 5, &[]);
    draining.offered = false;
    s.directory.set(vec![draining]);
    assert!(matches!(
        api.renew(&first.lease_id, None).await,
        Err(ClientError::NotRenewable(_))
    ));
    api.report_session("s", egress_lease::ReportResult::Banned, Some("shop.example"))
        .await
        .unwrap();
    api.release(&first.lease_id).await.unwrap();
    assert!(matches!(
        api.renew(&first.lease_id, None).await,
        Err(ClientError::UnknownLease(_))
    ));
    assert!(matches!(
        api.report_session("s", egress_lease::ReportResult::Banned, None).await,
        Err(ClientError::UnknownSession(_))
    ));
}
