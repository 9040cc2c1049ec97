//! The API over real HTTP: auth, listing, leases, reports, and what every client mistake gets.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{Changing, info, serve_on_loopback_within};
use egress_discovery::{DiscoveryApi, MAX_BODY, ProxyInfo};
use egress_lease::{ManualClock, MemoryStore};
use serde_json::{Value, json};

struct Server {
    url: String,
    directory: Arc<Changing>,
    refusals: Arc<egress_discovery::Refusals>,
    clock: ManualClock,
    http: reqwest::Client,
    _stop: tokio_util::sync::DropGuard,
}

async fn start(token: Option<&str>) -> Server {
    start_within(token, egress_http::Limits::DEFAULT).await
}

async fn start_within(token: Option<&str>, limits: egress_http::Limits) -> Server {
    let directory = Arc::new(Changing::default());
    let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let refusals = Arc::new(egress_discovery::Refusals::new("pool"));
    let (url, stop) = serve_on_loopback_within(
        DiscoveryApi {
            directory: directory.clone(),
            store: Arc::new(MemoryStore::new(Arc::new(clock.clone()), Duration::from_secs(900))),
            max_ttl: Duration::from_secs(3600),
            auth: token.map_or(egress_discovery::Auth::None, |t| {
                egress_discovery::Auth::Tokens(Arc::new(egress_discovery::TokenSet::new(vec![t.to_owned()])))
            }),
            refusals: Some(refusals.clone()),
            admission: egress_discovery::Admission::default(),
            scopes: egress_discovery::Scopes::default(),
            max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        },
        limits,
    )
    .await;
    Server {
        url,
        directory,
        refusals,
        clock,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        _stop: stop,
    }
}

impl Server {
    fn set(&self, proxies: Vec<ProxyInfo>) {
        self.directory.set(proxies);
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<&str>) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b.to_string());
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }
}

fn assert_error(answer: &(u16, Value), status: u16, code: &str) {
    assert_eq!(answer.0, status, "{answer:?}");
    assert_eq!(answer.1["error"], code, "{answer:?}");
    assert!(
        answer.1["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{answer:?}"
    );
}

#[tokio::test]
async fn the_bearer_token_guards_everything_but_healthz() {
    let s = start(Some("s3cret")).await;
    let healthz = s.http.get(format!("{}/healthz", s.url)).send().await.unwrap();
    assert_eq!(healthz.status(), 200);
    assert_eq!(healthz.text().await.unwrap(), "ok");
    assert_error(&s.get("/v1/proxies").await, 401, "unauthorized");
    for auth in ["Bearer wrong", "Bearer s3cret2", "s3cret", "Basic czNjcmV0", "Bearer "] {
        let r = s
            .http
            .get(format!("{}/v1/proxies", s.url))
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{auth}");
    }
    let r = s
        .http
        .post(format!("{}/v1/leases", s.url))
        .bearer_auth("s3cret")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409, "authenticated; no proxy to lease");
    // Unknown paths are answered only after auth, so they reveal nothing.
    assert_error(&s.get("/v2/anything").await, 401, "unauthorized");
    // Every route of the API, with the JSON envelope.
    for (method, path) in [
        (reqwest::Method::GET, "/v1/proxies"),
        (reqwest::Method::POST, "/v1/leases"),
        (reqwest::Method::DELETE, "/v1/leases/L1"),
        (reqwest::Method::POST, "/v1/leases/L1/report"),
        (reqwest::Method::GET, "/openapi.json"),
    ] {
        let r = s
            .http
            .request(method.clone(), format!("{}{path}", s.url))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{method} {path}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], "unauthorized", "{method} {path}");
    }
}

#[tokio::test]
async fn a_stranger_s_body_is_never_read() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let s = start(Some("s3cret")).await;
    let addr = s.url.trim_start_matches("http://").to_owned();
    // A body announced and never sent: read first, it would end in 400 invalid_body once the
    // read budget ran out; refused first, the answer is 401 at once.
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n")
        .await
        .unwrap();
    let mut head = vec![0u8; 64];
    // A liveness guard, not a speed check: far beyond the server's 10 s read budget.
    let n = tokio::time::timeout(Duration::from_secs(60), tcp.read(&mut head))
        .await
        .expect("an answer")
        .unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
}

#[tokio::test]
async fn listing_filters_sorts_and_counts() {
    let s = start(None).await;
    s.set(vec![
        info("ns/c", true, 30, 5, &[("geo", "eu"), ("purpose", "crawl")]),
        info("ns/a", false, 10, 5, &[("geo", "eu")]),
        info("ns/b", true, 20, 5, &[]),
    ]);
    let (status, all) = s.get("/v1/proxies").await;
    assert_eq!(status, 200);
    assert_eq!(all["count"], 3);
    let ids: Vec<&str> = all["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ns/a", "ns/b", "ns/c"], "sorted by id");
    let b = &all["proxies"][1];
    assert!(b.get("attributes").is_none(), "omitted when empty: {b}");
    assert_eq!(
        all["proxies"][2],
        json!({"id": "ns/c", "ip": "10.0.0.1", "port": 3128, "attributes": {"geo": "eu", "purpose": "crawl"},
               "phase": "Ready", "healthy": true, "latencyMillis": 30, "activeLeases": 0, "maxLeases": 5})
    );
    let count = |path: &'static str| {
        let s = &s;
        async move { s.get(path).await.1["count"].as_u64().unwrap() }
    };
    assert_eq!(count("/v1/proxies?healthy=true").await, 2);
    assert_eq!(count("/v1/proxies?healthy=false").await, 1);
    assert_eq!(count("/v1/proxies?healthy=").await, 3, "empty is absent");
    assert_eq!(count("/v1/proxies?attr.geo=eu").await, 2);
    assert_eq!(
        count("/v1/proxies?attr.geo=eu&healthy=true&attr.purpose=crawl").await,
        1
    );
    assert_eq!(
        count("/v1/proxies?attr.geo=eu&attr.geo=us").await,
        0,
        "every value must match"
    );
    assert_eq!(
        count("/v1/proxies?unknown=1").await,
        3,
        "unknown parameters are ignored"
    );
    let (_, none) = s.get("/v1/proxies?attr.geo=mars").await;
    assert_eq!(none, json!({"count": 0, "proxies": []}));
    assert_error(&s.get("/v1/proxies?healthy=yes").await, 400, "invalid_query");
}

#[tokio::test]
async fn a_grant_has_its_documented_shape() {
    let s = start(None).await;
    s.set(vec![info("ns/a", true, 10, 2, &[("geo", "eu")])]);
    let (status, g) = s
        .post("/v1/leases", r#"{"selector": {"geo": "eu"}, "target": "example.com"}"#)
        .await;
    assert_eq!(status, 201, "{g}");
    let id = g["leaseID"].as_str().unwrap();
    assert_eq!(id.len(), 26);
    assert_eq!(g["ttlSeconds"], 300);
    assert_eq!(g["expiresAt"], "2027-01-15T08:05:00Z");
    assert_eq!(g["proxy"]["id"], "ns/a");
    assert_eq!(g["proxy"]["activeLeases"], 1, "counts this lease");
    let (_, listed) = s.get("/v1/proxies").await;
    assert_eq!(listed["proxies"][0]["activeLeases"], 1);
    let (status, g2) = s.post("/v1/leases", r#"{"ttlSeconds": 60}"#).await;
    assert_eq!((status, g2["ttlSeconds"].as_u64()), (201, Some(60)));
    assert_ne!(g2["leaseID"], g["leaseID"]);
}

#[tokio::test]
async fn no_match_counts_each_skipped_proxy_once() {
    let s = start(None).await;
    s.set(vec![
        info("ns/sick", false, 1, 5, &[("geo", "eu")]),
        info("ns/full", true, 1, 0, &[("geo", "eu")]),
        info("ns/cool", true, 1, 5, &[("geo", "eu")]),
        info("ns/other", true, 1, 5, &[("geo", "us")]),
    ]);
    let (_, g) = s
        .post("/v1/leases", r#"{"selector": {"geo": "eu"}, "target": "t.example"}"#)
        .await;
    assert_eq!(g["proxy"]["id"], "ns/cool");
    let lease = g["leaseID"].as_str().unwrap().to_string();
    let (status, _) = s
        .post(&format!("/v1/leases/{lease}/report"), r#"{"result": "rate_limited"}"#)
        .await;
    assert_eq!(status, 204);
    let (status, refused) = s
        .post("/v1/leases", r#"{"selector": {"geo": "eu"}, "target": "t.example"}"#)
        .await;
    assert_eq!(status, 409);
    assert_eq!(
        refused,
        json!({"error": "no_match", "message": "no healthy proxy with free capacity matched the selector",
               "considered": 3, "atCapacity": 1, "inCooldown": 1, "unhealthy": 1})
    );
    // The cooldown is for that target only; after its window the proxy is leasable again.
    let (status, _) = s
        .post(
            "/v1/leases",
            r#"{"selector": {"geo": "eu"}, "target": "other.example"}"#,
        )
        .await;
    assert_eq!(status, 201);
    s.clock.advance(Duration::from_secs(900));
    let (status, _) = s
        .post("/v1/leases", r#"{"selector": {"geo": "eu"}, "target": "t.example"}"#)
        .await;
    assert_eq!(status, 201);
}

/// A pool member in `role`, with the pool's attribute.
fn member(id: &str, latency: i64, role: &'static str) -> ProxyInfo {
    ProxyInfo {
        offered: role == "active",
        pool_role: Some(role),
        pool: Some("eu".into()),
        ..info(id, true, latency, 1, &[("pool", "eu")])
    }
}

#[tokio::test]
async fn standby_and_draining_members_are_listed_but_never_leased() {
    let s = start(None).await;
    // The held-back members are the fastest: a selection that saw them would pick them.
    s.set(vec![
        member("ns/eu-standby", 1, "standby"),
        member("ns/eu-draining", 2, "draining"),
        member("ns/eu-active", 3, "active"),
        info("ns/plain", true, 4, 1, &[]),
    ]);
    let (status, list) = s.get("/v1/proxies").await;
    assert_eq!(status, 200);
    let roles: Vec<(String, Value)> = list["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap().to_owned(), p["poolRole"].clone()))
        .collect();
    assert_eq!(
        roles,
        [
            ("ns/eu-active".into(), json!("active")),
            ("ns/eu-draining".into(), json!("draining")),
            ("ns/eu-standby".into(), json!("standby")),
            ("ns/plain".into(), Value::Null),
        ]
    );
    assert!(
        list["proxies"][3].get("poolRole").is_none(),
        "absent, not null, outside pools"
    );
    let (status, g) = s.post("/v1/leases", r#"{"selector": {"pool": "eu"}}"#).await;
    assert_eq!(status, 201);
    assert_eq!(g["proxy"]["id"], "ns/eu-active");
    // The active member is full: the held-back ones are no candidates, so the refusal counts
    // the one proxy that could have served.
    let (status, refused) = s.post("/v1/leases", r#"{"selector": {"pool": "eu"}}"#).await;
    assert_eq!(status, 409);
    assert_eq!(
        (&refused["considered"], &refused["atCapacity"], &refused["unhealthy"]),
        (&json!(1), &json!(1), &json!(0))
    );
    // A lease already held on a member that starts draining is released as any other.
    let lease = g["leaseID"].as_str().unwrap().to_owned();
    s.set(vec![member("ns/eu-active", 3, "draining")]);
    let (status, _) = s
        .post(&format!("/v1/leases/{lease}/report"), r#"{"result": "ok"}"#)
        .await;
    assert_eq!(status, 204);
    let (status, _) = s
        .call(reqwest::Method::DELETE, &format!("/v1/leases/{lease}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, refused) = s.post("/v1/leases", r#"{"selector": {"pool": "eu"}}"#).await;
    assert_eq!((status, &refused["considered"]), (409, &json!(0)));
}

#[tokio::test]
async fn refusals_of_selectors_naming_a_pool_are_counted_for_the_autoscaler() {
    // Taken before the server (and its count) starts: every refusal comes after it.
    let since = std::time::Instant::now();
    let s = start(None).await;
    s.set(vec![
        member("ns/eu-active", 3, "active"),
        info("ns/plain", true, 4, 1, &[]),
    ]);
    // The pool `eu` of namespace `ns`, whose members carry geo=de, is watched.
    let attrs: std::collections::BTreeMap<String, String> = [("geo".into(), "de".into())].into();
    s.refusals.watch_pool("ns/eu", "eu", &attrs);
    // Granted: nothing to count.
    let (status, _) = s.post("/v1/leases", r#"{"selector": {"pool": "eu"}}"#).await;
    assert_eq!(status, 201);
    assert_eq!(s.refusals.count_since("ns/eu", since), 0);
    assert_eq!(s.refusals.take_refused(), Vec::<String>::new());
    // Refused: twice for the pool (once with an attribute its members have), and once each
    // for an attribute they lack, another pool, and no pool at all.
    for body in [
        r#"{"selector": {"pool": "eu"}}"#,
        r#"{"selector": {"pool": "eu", "geo": "de"}}"#,
        r#"{"selector": {"pool": "eu", "geo": "fr"}}"#,
        r#"{"selector": {"pool": "us"}}"#,
        r#"{"selector": {"geo": "de"}}"#,
    ] {
        let (status, _) = s.post("/v1/leases", body).await;
        assert_eq!(status, 409, "{body}");
    }
    assert_eq!(s.refusals.count_since("ns/eu", since), 2);
    assert_eq!(s.refusals.take_refused(), ["ns/eu"]);
}

#[tokio::test]
async fn reports_and_releases() {
    let s = start(None).await;
    s.set(vec![info("ns/a", true, 1, 1, &[])]);
    let (_, g) = s.post("/v1/leases", "{}").await;
    let lease = g["leaseID"].as_str().unwrap().to_string();
    let report = format!("/v1/leases/{lease}/report");
    assert_eq!(s.post(&report, r#"{"result": "ok"}"#).await.0, 204);
    for bad in [r#"{}"#, r#"{"result": "OK"}"#, r#"{"result": 1}"#, ""] {
        let answer = s.post(&report, bad).await;
        if bad == r#"{"result": 1}"# {
            assert_error(&answer, 400, "invalid_body");
        } else {
            assert_error(&answer, 400, "invalid_result");
        }
    }
    let unknown = s
        .post("/v1/leases/AAAAAAAAAAAAAAAAAAAAAAAAAA/report", r#"{"result": "ok"}"#)
        .await;
    assert_error(&unknown, 404, "unknown_lease");
    assert_eq!(unknown.1["message"], "no such lease");
    // Release frees the slot at once, and is idempotent.
    for _ in 0..2 {
        assert_eq!(
            s.call(reqwest::Method::DELETE, &format!("/v1/leases/{lease}"), None)
                .await
                .0,
            204
        );
    }
    assert_eq!(
        s.call(reqwest::Method::DELETE, "/v1/leases/NEVERISSUED", None).await.0,
        204
    );
    assert_eq!(s.post("/v1/leases", "{}").await.0, 201);
    // A released lease stays reportable.
    assert_eq!(s.post(&report, r#"{"result": "banned"}"#).await.0, 204);
}

/// What the Go operator's decoder took (`encoding/json`: keys in any case, `null` as nothing, the
/// first JSON value only) is taken here too; what it refused is still refused.
#[tokio::test]
async fn bodies_the_go_operator_took_are_taken() {
    let s = start(None).await;
    s.set(vec![
        info("ns/eu", true, 1, 100, &[("geo", "eu")]),
        info("ns/us", true, 2, 100, &[("geo", "us")]),
    ]);
    for body in [
        r#"{"selector": null}"#,
        "null",
        r#"{"selector": null, "ttlSeconds": null, "target": null}"#,
    ] {
        assert_eq!(s.post("/v1/leases", body).await.0, 201, "{body}");
    }
    // Keys in another case fill the fields.
    let (status, g) = s
        .post("/v1/leases", r#"{"Selector": {"geo": "us"}, "TTLSECONDS": 30}"#)
        .await;
    assert_eq!(status, 201, "{g}");
    assert_eq!(
        (g["proxy"]["id"].as_str(), g["ttlSeconds"].as_u64()),
        (Some("ns/us"), Some(30))
    );
    // What follows the first JSON value is not read.
    let (status, g) = s
        .post("/v1/leases", r#"{"ttlSeconds": 45} {"ttlSeconds": 1} trailing"#)
        .await;
    assert_eq!((status, g["ttlSeconds"].as_u64()), (201, Some(45)), "{g}");
    let lease = g["leaseID"].as_str().unwrap().to_string();
    let report = format!("/v1/leases/{lease}/report");
    assert_eq!(s.post(&report, r#"{"Result": "ok"}garbage"#).await.0, 204);
    // Still refused, as Go refused them: a body that is not an object (an array's items do not
    // fill the fields in order), on every route that reads one.
    for path in ["/v1/leases", &report, &format!("/v1/leases/{lease}/renew")] {
        for body in ["[]", r#"[{"geo": "us"}, 30]"#, r#"["ok"]"#, "7", r#""ok""#] {
            assert_error(&s.post(path, body).await, 400, "invalid_body");
        }
    }
    // Still refused, as Go refused them: a value of the wrong type, and no JSON at all.
    assert_error(
        &s.post("/v1/leases", r#"{"selector": ["geo"]}"#).await,
        400,
        "invalid_body",
    );
    assert_error(
        &s.post("/v1/leases", r#"{"ttlSeconds": "30"}"#).await,
        400,
        "invalid_body",
    );
    assert_error(&s.post("/v1/leases", "garbage {}").await, 400, "invalid_body");
}

#[tokio::test]
async fn bodies_are_json_whatever_their_type_and_at_most_64_kib() {
    let s = start(None).await;
    s.set(vec![info("ns/a", true, 1, 100, &[])]);
    // curl -d sends form encoding: still JSON to us.
    let r = s
        .http
        .post(format!("{}/v1/leases", s.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(r#"{"ttlSeconds": 30}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(s.post("/v1/leases", "").await.0, 201, "an empty body is {{}}");
    let padded = format!("{{}}{}", " ".repeat(MAX_BODY - 2));
    assert_eq!(s.post("/v1/leases", &padded).await.0, 201, "exactly 64 KiB");
    let over = format!("{{}}{}", " ".repeat(MAX_BODY - 1));
    assert_error(&s.post("/v1/leases", &over).await, 400, "invalid_body");
    assert_error(&s.post("/v1/leases", "{not json").await, 400, "invalid_body");
    assert_error(
        &s.post("/v1/leases", r#"{"ttlSeconds": "soon"}"#).await,
        400,
        "invalid_body",
    );
    assert_error(
        &s.post("/v1/leases", r#"{"ttlSeconds": 3601}"#).await,
        400,
        "invalid_ttl",
    );
    assert_error(&s.post("/v1/leases", r#"{"ttlSeconds": -5}"#).await, 400, "invalid_ttl");
    assert_eq!(
        s.post("/v1/leases", r#"{"unknown": true}"#).await.0,
        201,
        "unknown keys are ignored"
    );
}

#[tokio::test]
async fn unknown_paths_and_methods_get_json_errors() {
    let s = start(None).await;
    assert_error(&s.get("/v1/nothing").await, 404, "not_found");
    assert_error(&s.get("/").await, 404, "not_found");
    assert_error(&s.get("/v1/leases").await, 405, "method_not_allowed");
    assert_error(
        &s.call(reqwest::Method::PUT, "/v1/proxies", None).await,
        405,
        "method_not_allowed",
    );
    assert_error(&s.get("/v1/leases/abc/report").await, 405, "method_not_allowed");
    assert_error(
        &s.call(reqwest::Method::DELETE, "/healthz", None).await,
        405,
        "method_not_allowed",
    );
}

#[tokio::test]
async fn a_failing_proxy_list_is_the_only_internal_error() {
    let s = start(None).await;
    *s.directory.broken.lock().unwrap() = true;
    let answer = s.get("/v1/proxies").await;
    assert_error(&answer, 500, "internal");
    assert_eq!(answer.1["message"], "listing proxies failed");
    assert_error(&s.post("/v1/leases", "{}").await, 500, "internal");
}

#[tokio::test]
async fn no_client_mistake_is_a_500() {
    let s = start(Some("t")).await;
    s.set(vec![info("ns/a", true, 1, 1, &[])]);
    let hostile_bodies = [
        "\u{0}",
        "[]",
        "null",
        "1e999",
        "{\"selector\": []}",
        "{\"target\": {}}",
        "\u{fffd}\u{fffd}",
    ];
    let paths = [
        "/v1/leases",
        "/v1/leases/x/report",
        "/v1/leases/x/renew",
        "/v1/proxies?healthy=%ff",
        "/v1//report",
        "/v1/leases//report",
    ];
    for path in paths {
        for body in hostile_bodies {
            for method in [reqwest::Method::GET, reqwest::Method::POST, reqwest::Method::DELETE] {
                for auth in [None, Some("t")] {
                    let mut req = s
                        .http
                        .request(method.clone(), format!("{}{path}", s.url))
                        .body(body.to_string());
                    if let Some(a) = auth {
                        req = req.bearer_auth(a);
                    }
                    let status = req.send().await.unwrap().status().as_u16();
                    assert!(status < 500, "{method} {path} {body:?} auth={auth:?}: {status}");
                }
            }
        }
    }
}

#[tokio::test]
async fn wrong_methods_name_the_allowed_ones_and_get_routes_answer_head() {
    let s = start(Some("t")).await;
    s.set(vec![info("ns/a", true, 1, 1, &[])]);
    let r = s
        .http
        .get(format!("{}/v1/leases", s.url))
        .bearer_auth("t")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    assert_eq!(r.headers()["content-type"], "application/json");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body, json!({"error": "method_not_allowed", "message": "POST only"}));
    let r = s
        .http
        .put(format!("{}/v1/proxies", s.url))
        .bearer_auth("t")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET,HEAD");
    // HEAD: the GET answer's status and headers, no body; /healthz stays open.
    let r = s
        .http
        .head(format!("{}/v1/proxies", s.url))
        .bearer_auth("t")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert!(r.bytes().await.unwrap().is_empty());
    let r = s.http.head(format!("{}/healthz", s.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = s.http.head(format!("{}/v1/proxies", s.url)).send().await.unwrap();
    assert_eq!(r.status(), 401, "HEAD needs the token as GET does");
}

#[tokio::test]
async fn a_bloated_head_gets_431_in_the_envelope() {
    let s = start(Some("t")).await;
    let r = s
        .http
        .get(format!("{}/v1/proxies", s.url))
        .bearer_auth("t")
        .header("x-bloat", "a".repeat(20 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 431);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "headers_too_large", "{body}");
}

#[tokio::test]
async fn at_the_connection_cap_a_client_gets_503_overloaded() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const GUARD: Duration = Duration::from_secs(30);
    let limits = egress_http::Limits {
        max_connections: 1,
        // The first client's kept-alive connection must outlive the test's steps.
        header_read: GUARD * 2,
        ..egress_http::Limits::DEFAULT
    };
    let s = start_within(None, limits).await;
    let addr = s.url.trim_start_matches("http://").to_string();
    // The first client is served and keeps its connection, so it holds the one slot.
    let mut first = tokio::net::TcpStream::connect(&addr).await.unwrap();
    first
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(GUARD, async {
        let mut buf = [0u8; 1024];
        while !seen.ends_with(b"ok") {
            let n = first.read(&mut buf).await.unwrap();
            assert!(n > 0, "the first client was closed");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the first client was never answered");
    let mut second = tokio::net::TcpStream::connect(&addr).await.unwrap();
    second
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(GUARD, second.read_to_end(&mut answer))
        .await
        .expect("the second client was left hanging")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{answer}");
    assert!(answer.contains("\r\nretry-after: 1\r\n"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"], "overloaded", "{body}");
}

#[tokio::test]
async fn targets_are_sites_and_only_one_over_2_kib_is_refused() {
    let s = start(None).await;
    s.set(vec![info("ns/a", true, 1, 5, &[])]);
    let at_limit = format!("https://{}/", "a".repeat(egress_lease::MAX_TARGET_BYTES - 9));
    assert_eq!(at_limit.len(), egress_lease::MAX_TARGET_BYTES);
    let body = json!({"target": at_limit}).to_string();
    assert_eq!(s.post("/v1/leases", &body).await.0, 201, "2 KiB is accepted");
    let over = json!({"target": format!("{at_limit}x")}).to_string();
    let answer = s.post("/v1/leases", &over).await;
    assert_error(&answer, 400, "invalid_target");
    // A lease for a URL, banned: the site itself cools down, however it is spelled.
    let (_, g) = s
        .post("/v1/leases", r#"{"target": "https://Shop.Example/cart?x=1"}"#)
        .await;
    let lease = g["leaseID"].as_str().unwrap().to_string();
    let report = format!("/v1/leases/{lease}/report");
    assert_error(
        &s.post(
            &report,
            &json!({"result": "banned", "target": format!("{at_limit}x")}).to_string(),
        )
        .await,
        400,
        "invalid_target",
    );
    assert_eq!(s.post(&report, r#"{"result": "banned"}"#).await.0, 204);
    let refused = s.post("/v1/leases", r#"{"target": "shop.example"}"#).await;
    assert_eq!(refused.0, 409, "{refused:?}");
    assert_eq!(refused.1["inCooldown"], 1);
    assert_eq!(s.post("/v1/leases", r#"{"target": "shop.example:8443"}"#).await.0, 201);
}

#[tokio::test]
async fn a_lease_carries_the_proxys_credentials_and_the_list_never_does() {
    let s = start(None).await;
    let c = egress_credentials::Credentials::generate();
    let mut open = info("ns/open", true, 5, 2, &[("geo", "us")]);
    open.ip = "fd00::9".into();
    s.set(vec![
        ProxyInfo {
            credentials: Some(c.clone()),
            offered: true,
            pool_role: None,
            pool: None,
            ..info("ns/a", true, 10, 2, &[("geo", "eu")])
        },
        open,
    ]);
    let (status, g) = s.post("/v1/leases", r#"{"selector": {"geo": "eu"}}"#).await;
    assert_eq!(status, 201, "{g}");
    assert_eq!(g["proxy"]["username"], c.username());
    assert_eq!(g["proxy"]["password"], c.password());
    assert_eq!(
        g["proxy"]["url"],
        format!("http://{}:{}@10.0.0.1:3128", c.username(), c.password())
    );
    // The Go client's fields are all still there, unchanged.
    assert_eq!(
        (g["proxy"]["ip"].as_str(), g["proxy"]["port"].as_u64()),
        (Some("10.0.0.1"), Some(3128))
    );
    // A proxy without credentials: none of the fields.
    let (_, open) = s.post("/v1/leases", r#"{"selector": {"geo": "us"}}"#).await;
    for field in ["username", "password", "url"] {
        assert!(open["proxy"].get(field).is_none(), "{open}");
    }
    let (_, listed) = s.get("/v1/proxies").await;
    let text = listed.to_string();
    assert!(
        !text.contains(c.password()) && !text.contains("password") && !text.contains("username"),
        "{text}"
    );
}
