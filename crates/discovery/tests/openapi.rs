//! docs/discovery-openapi.json against the server: the document served is the committed one,
//! every documented operation is routed and every route is documented, and real answers
//! validate against the documented schemas.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Fixed, info, serve_on_loopback};
use egress_discovery::DiscoveryApi;
use egress_lease::{MemoryStore, SystemClock};
use serde_json::{Value, json};
use tokio_util::sync::DropGuard;

async fn start() -> (String, DropGuard) {
    serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(vec![
            // The leased one demands credentials, so the lease answer carries them.
            egress_discovery::ProxyInfo {
                credentials: Some(egress_credentials::Credentials::generate()),
                offered: true,
                pool_role: None,
                pool: None,
                ..info("ns/a", true, 12, 1, &[("geo", "eu")])
            },
            info("ns/b", false, 12, 1, &[]),
        ])),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::None,
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    })
    .await
}

fn validator(doc: &Value, schema: &str) -> jsonschema::Validator {
    let root = json!({"$ref": format!("#/components/schemas/{schema}"), "components": doc["components"]});
    jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("schema {schema}: {e}"))
}

async fn call(url: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let client = reqwest::Client::new();
    let mut req = client.request(method.parse().unwrap(), format!("{url}{path}"));
    if let Some(b) = body {
        req = req.body(b.to_string());
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test]
async fn the_served_document_is_the_committed_one() {
    let (url, _stop) = start().await;
    let committed: Value = serde_json::from_str(egress_discovery::openapi::TEXT).unwrap();
    let (status, served) = call(&url, "GET", "/openapi.json", None).await;
    assert_eq!(status, 200);
    assert_eq!(served, committed);
    assert_eq!(served["openapi"], "3.1.0");
}

#[tokio::test]
async fn every_documented_operation_is_routed_and_every_route_documented() {
    let (url, _stop) = start().await;
    let doc = egress_discovery::openapi::document();
    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.push((
                method.to_uppercase(),
                path.replace("{id}", "SOMELEASE").replace("{session}", "some-session"),
            ));
        }
    }
    documented.sort();
    for (method, path) in &documented {
        let (status, body) = call(&url, method, path, Some("{}")).await;
        assert!(
            body.get("error") != Some(&json!("not_found")) && body.get("error") != Some(&json!("method_not_allowed")),
            "{method} {path} is documented but not routed: {status} {body}"
        );
    }
    // And the other way: each method on each documented path that the document leaves out is 405.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["GET", "POST", "DELETE", "PUT", "PATCH"] {
            if item.get(method.to_lowercase()).is_none() {
                let path = path.replace("{id}", "X").replace("{session}", "s");
                let (status, body) = call(&url, method, &path, None).await;
                assert_eq!(
                    (status, &body["error"]),
                    (405, &json!("method_not_allowed")),
                    "{method} {path}"
                );
            }
        }
    }
}

#[tokio::test]
async fn real_answers_validate_against_the_documented_schemas() {
    let (url, _stop) = start().await;
    let doc = egress_discovery::openapi::document();
    let check = |schema: &str, value: &Value| {
        let v = validator(doc, schema);
        let errors: Vec<String> = v.iter_errors(value).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{schema}: {errors:?} in {value}");
    };
    // The schemas can refuse: a lease without its fields, a proxy with an unknown key.
    assert!(!validator(doc, "Lease").is_valid(&json!({})));
    assert!(!validator(doc, "Proxy").is_valid(&json!({"id": "x", "surprise": 1})));
    let (_, list) = call(&url, "GET", "/v1/proxies", None).await;
    check("ProxyList", &list);
    let (status, me) = call(&url, "GET", "/v1/whoami", None).await;
    assert_eq!(status, 200, "{me}");
    check("WhoAmI", &me);
    let (status, lease) = call(
        &url,
        "POST",
        "/v1/leases",
        Some(r#"{"selector": {"geo": "eu"}, "target": "t"}"#),
    )
    .await;
    assert_eq!(status, 201);
    assert!(lease["proxy"]["password"].is_string(), "{lease}");
    check("Lease", &lease);
    // The list shows no credentials, and its schema has no place for them.
    assert!(!validator(doc, "Proxy").is_valid(&lease["proxy"]));
    let (status, refused) = call(&url, "POST", "/v1/leases", Some("{}")).await;
    assert_eq!(status, 409);
    check("NoMatch", &refused);
    // The lease renewed, then a session's lease granted and answered again: each a Lease.
    let id = lease["leaseID"].as_str().unwrap();
    let (status, renewed) = call(
        &url,
        "POST",
        &format!("/v1/leases/{id}/renew"),
        Some(r#"{"ttlSeconds": 600}"#),
    )
    .await;
    assert_eq!((status, &renewed["leaseID"]), (200, &lease["leaseID"]), "{renewed}");
    check("Lease", &renewed);
    call(&url, "DELETE", &format!("/v1/leases/{id}"), None).await;
    for expected in [201, 200] {
        let (status, sticky) = call(&url, "POST", "/v1/leases", Some(r#"{"session": "login-1"}"#)).await;
        assert_eq!(status, expected, "{sticky}");
        check("Lease", &sticky);
    }
    for (method, path, body) in [
        ("GET", "/v1/proxies?healthy=maybe", None),
        ("POST", "/v1/leases", Some("{")),
        ("POST", "/v1/leases", Some(r#"{"ttlSeconds": 99999}"#)),
        ("POST", "/v1/leases/X/report", Some(r#"{"result": "meh"}"#)),
        ("POST", "/v1/leases/X/report", Some(r#"{"result": "ok"}"#)),
        ("POST", "/v1/leases", Some(r#"{"session": "a b"}"#)),
        ("POST", "/v1/leases/X/renew", Some("{}")),
        ("POST", "/v1/leases/X/renew", Some(r#"{"ttlSeconds": -1}"#)),
        ("POST", "/v1/sessions/login-2/report", Some(r#"{"result": "banned"}"#)),
        ("POST", "/v1/sessions/a%20b/report", Some(r#"{"result": "banned"}"#)),
        ("GET", "/nowhere", None),
        ("PUT", "/v1/leases", None),
    ] {
        let (status, error) = call(&url, method, path, body).await;
        assert!(status >= 400, "{method} {path}");
        check("Error", &error);
    }
}

#[tokio::test]
async fn a_store_that_cannot_be_reached_answers_the_documented_503() {
    // A Redis store on a port where nothing listens.
    let store = egress_lease_redis::RedisStore::new("redis://127.0.0.1:1", "x:", Duration::from_secs(900))
        .expect("a store: it connects lazily");
    let (url, _stop) = serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(vec![info("ns/a", true, 12, 1, &[])])),
        store: Arc::new(store),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::None,
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    })
    .await;
    let doc = egress_discovery::openapi::document();
    let error = validator(doc, "Error");
    for (method, path, body) in [
        ("GET", "/v1/proxies", None),
        ("POST", "/v1/leases", Some("{}")),
        ("DELETE", "/v1/leases/L", None),
        ("POST", "/v1/leases/L/report", Some(r#"{"result": "banned"}"#)),
    ] {
        let (status, answer) = call(&url, method, path, body).await;
        assert_eq!(status, 503, "{method} {path}: {answer}");
        assert_eq!(answer["error"], "store_unavailable");
        assert!(error.is_valid(&answer), "{answer}");
        let documented = doc["paths"][path.replace("/L", "/{id}")][method.to_lowercase()]["responses"]["503"].clone();
        assert!(!documented.is_null(), "{method} {path} does not document its 503");
    }
}

#[tokio::test]
async fn a_client_over_its_budget_gets_the_documented_429_on_every_authenticated_route() {
    // Each request is its own budget's only one: burst 1, a token a second.
    let one = egress_discovery::Budget {
        requests_per_second: 1,
        burst: 1,
        concurrency: 16,
    };
    let doc = egress_discovery::openapi::document();
    let error = validator(doc, "Error");
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if operation["security"] == json!([]) {
                continue; // /healthz: neither authenticated nor admitted
            }
            let (url, _stop) = serve_on_loopback(DiscoveryApi {
                directory: Arc::new(Fixed::new(vec![info("ns/a", true, 12, 1, &[])])),
                store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
                max_ttl: Duration::from_secs(3600),
                auth: egress_discovery::Auth::None,
                refusals: None,
                scopes: egress_discovery::Scopes::default(),
                max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
                admission: egress_discovery::Admission::new(
                    egress_discovery::Budgets::uniform(one),
                    16,
                    egress_discovery::AdmissionMetrics::default(),
                ),
            })
            .await;
            let path = path.replace("{id}", "L").replace("{session}", "s");
            let method = method.to_uppercase();
            let _ = call(&url, &method, &path, Some("{}")).await;
            let client = reqwest::Client::new();
            let refused = client
                .request(method.parse().unwrap(), format!("{url}{path}"))
                .body("{}")
                .send()
                .await
                .unwrap();
            assert_eq!(refused.status(), 429, "{method} {path}");
            let retry_after = refused.headers()["retry-after"].to_str().unwrap().to_owned();
            let header = jsonschema::validator_for(&doc["components"]["headers"]["RetryAfter"]["schema"]).unwrap();
            assert!(header.is_valid(&json!(retry_after)), "Retry-After {retry_after:?}");
            let answer: Value = refused.json().await.unwrap();
            assert_eq!(answer["error"], "rate_limited");
            assert!(error.is_valid(&answer), "{answer}");
            assert_eq!(
                operation["responses"]["429"]["$ref"], "#/components/responses/RateLimited",
                "{method} {path} does not document its 429"
            );
        }
    }
}

/// `value` as JSON.
fn encoded(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap()
}

/// The keys of a JSON object, sorted.
fn keys(object: &Value) -> Vec<String> {
    let mut keys: Vec<String> = object.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

/// The wire types and the document's schemas name the same fields: one with every optional
/// field set encodes every documented property, one with none set exactly the required ones.
#[test]
fn the_wire_types_have_the_documented_fields() {
    use egress_discovery::wire::{
        ErrorBody, Lease, LeaseRequest, LeasedProxy, NoMatchCounts, ProxyList, ProxyView, Renewal, Report, WhoAmI,
    };
    let doc = egress_discovery::openapi::document();
    let schema = |name: &str| &doc["components"]["schemas"][name];
    let required = |name: &str| {
        let mut r: Vec<String> = schema(name)["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect();
        r.sort();
        r
    };
    let bare = ProxyView {
        id: "ns/a".into(),
        ip: "10.0.0.1".into(),
        port: 3128,
        attributes: Default::default(),
        phase: "Ready".into(),
        healthy: true,
        latency_millis: 1,
        active_leases: 0,
        max_leases: 5,
        pool_role: None,
        exit: None,
    };
    let full = ProxyView {
        attributes: std::borrow::Cow::Owned([("geo".to_owned(), "eu".to_owned())].into()),
        pool_role: Some("active".into()),
        exit: Some(egress_discovery::wire::ExitView {
            address: "203.0.113.7".into(),
            verification: "Verified".into(),
            country: Some("DE".into()),
            asn: Some(64500),
            organization: Some("Example Networks".into()),
        }),
        ..bare.clone()
    };
    let me = WhoAmI {
        client: "default".into(),
    };
    assert_eq!(keys(&encoded(&me)), keys(&schema("WhoAmI")["properties"]));
    assert_eq!(keys(&encoded(&me)), required("WhoAmI"));
    assert_eq!(keys(&encoded(&full)), keys(&schema("Proxy")["properties"]));
    let exit = full.exit.clone().unwrap();
    assert_eq!(keys(&encoded(&exit)), keys(&schema("ProxyExit")["properties"]));
    let bare_exit = egress_discovery::wire::ExitView {
        country: None,
        asn: None,
        organization: None,
        ..exit
    };
    assert_eq!(keys(&encoded(&bare_exit)), required("ProxyExit"));
    assert_eq!(keys(&encoded(&bare)), required("Proxy"));
    let leased = |view: ProxyView<'static>, with_credentials: bool| LeasedProxy {
        view,
        username: with_credentials.then(|| "u".into()),
        password: with_credentials.then(|| "p".into()),
        url: with_credentials.then(|| "http://u:p@10.0.0.1:3128".into()),
    };
    assert_eq!(
        keys(&encoded(&leased(full.clone(), true))),
        keys(&schema("LeasedProxy")["properties"])
    );
    assert_eq!(keys(&encoded(&leased(bare.clone(), false))), required("LeasedProxy"));
    let list = ProxyList {
        count: 1,
        proxies: vec![full.clone()],
    };
    assert_eq!(keys(&encoded(&list)), keys(&schema("ProxyList")["properties"]));
    assert_eq!(keys(&encoded(&list)), required("ProxyList"));
    let lease = Lease {
        lease_id: "L".into(),
        proxy: leased(full, true),
        expires_at: "2026-01-01T00:00:00Z".into(),
        ttl_seconds: 300,
    };
    assert_eq!(keys(&encoded(&lease)), keys(&schema("Lease")["properties"]));
    assert_eq!(keys(&encoded(&lease)), required("Lease"));
    // The request bodies: every field optional but the report's result.
    let request = LeaseRequest {
        selector: [("pool".to_owned(), "eu".to_owned())].into(),
        ttl_seconds: Some(60),
        target: Some("example.com".into()),
        session: Some("login-1".into()),
    };
    assert_eq!(keys(&encoded(&request)), keys(&schema("LeaseRequest")["properties"]));
    assert!(keys(&encoded(&LeaseRequest::default())).is_empty());
    let renewal = Renewal { ttl_seconds: Some(60) };
    assert_eq!(keys(&encoded(&renewal)), keys(&schema("Renewal")["properties"]));
    assert!(keys(&encoded(&Renewal::default())).is_empty());
    let report = Report {
        result: "banned".into(),
        target: Some("example.com".into()),
    };
    assert_eq!(keys(&encoded(&report)), keys(&schema("Report")["properties"]));
    let bare_report = Report {
        result: "ok".into(),
        target: None,
    };
    assert_eq!(keys(&encoded(&bare_report)), required("Report"));
    // The error envelope, and no_match's with its counts.
    let error = ErrorBody {
        error: "invalid_ttl".into(),
        message: "m".into(),
        no_match: None,
    };
    assert_eq!(keys(&encoded(&error)), keys(&schema("Error")["properties"]));
    assert_eq!(keys(&encoded(&error)), required("Error"));
    let no_match = ErrorBody {
        error: "no_match".into(),
        no_match: Some(NoMatchCounts::default()),
        ..error
    };
    assert_eq!(keys(&encoded(&no_match)), keys(&schema("NoMatch")["properties"]));
    assert_eq!(keys(&encoded(&no_match)), required("NoMatch"));
}
