//! The fake Compute server's own tests: every kind of answer it gives has the shape of its
//! fixture in `fixtures/gcp` (the same fields with the same JSON types; values are data), so
//! the provider's tests and the conformance suite run against answers shaped as the API's.

mod support;

use std::time::Duration;

use serde_json::{Map, Value, json};
use support::fake::{DEFAULT_OPERATION_TIME, FakeCompute, PROJECT, ZONES, fixture};

/// The shape of a JSON value: objects keep their keys, arrays the shape of their first item,
/// scalars become their type's name. `labels` is a map of data, so only its values' type counts.
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let inner = match (k.as_str(), v) {
                        ("labels", Value::Object(labels)) => json!({"*": labels.values().next().map(shape)}),
                        _ => shape(v),
                    };
                    (k.clone(), inner)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.first().map(shape).into_iter().collect()),
        Value::String(_) => json!("string"),
        Value::Number(_) => json!("number"),
        Value::Bool(_) => json!("bool"),
        Value::Null => json!("null"),
    }
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&fixture(name)).expect("a fixture")
}

/// `v` without the top-level keys `keys` (fields the fixture shows and this answer may lack).
fn without(mut v: Value, keys: &[&str]) -> Value {
    if let Some(m) = v.as_object_mut() {
        for k in keys {
            m.remove(*k);
        }
    }
    v
}

struct Api {
    fake: FakeCompute,
    http: reqwest::Client,
    token: String,
}

impl Api {
    async fn new() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let fake = FakeCompute::start().await;
        let http = reqwest::Client::new();
        let answer: Value = http
            .get(format!(
                "http://{}/computeMetadata/v1/instance/service-accounts/default/token",
                fake.metadata_host()
            ))
            .header("Metadata-Flavor", "Google")
            .send()
            .await
            .expect("the metadata server")
            .json()
            .await
            .expect("a token answer");
        let token = answer["access_token"].as_str().expect("a token").to_owned();
        Self { fake, http, token }
    }

    async fn call(&self, method: reqwest::Method, path: String, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}/projects/{PROJECT}/{path}", self.fake.base_url());
        let mut req = self.http.request(method, url).bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.expect("an answer");
        (r.status().as_u16(), r.json().await.expect("JSON"))
    }

    async fn insert(&self, zone: &str, name: &str) -> (u16, Value) {
        let body = json!({
            "name": name,
            "machineType": format!("zones/{zone}/machineTypes/e2-micro"),
            "disks": [{"boot": true, "autoDelete": true, "initializeParams": {
                "sourceImage": support::IMAGE, "diskSizeGb": "10"}}],
            "networkInterfaces": [{"network": "global/networks/default",
                "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}],
            "labels": {"proxy-operator-managed": "true"},
            "metadata": {"items": [{"key": "user-data", "value": "#cloud-config\n"}]},
            "tags": {"items": ["egress-proxy"]},
        });
        self.call(reqwest::Method::POST, format!("zones/{zone}/instances"), Some(body))
            .await
    }
}

/// The operation's `zones/<zone>/operations/<name>` path.
fn operation_path(op: &Value) -> String {
    let link = op["selfLink"].as_str().expect("a selfLink");
    link[link.find("zones/").expect("a zonal operation")..].to_owned()
}

#[tokio::test]
async fn operations_and_instances_have_the_shapes_of_their_fixtures() {
    let api = Api::new().await;
    let (status, op) = api.insert(ZONES[0], "proxy-shape").await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(
        shape(&op),
        shape(&fixture_json("operation.json")),
        "a running operation"
    );
    api.fake.advance(DEFAULT_OPERATION_TIME);
    let (status, done) = api.call(reqwest::Method::GET, operation_path(&op), None).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "DONE");
    // A finished operation: the failed one's fixture without its error.
    let finished = without(
        fixture_json("operation-failed.json"),
        &["error", "httpErrorStatusCode", "httpErrorMessage"],
    );
    assert_eq!(shape(&done), shape(&finished), "a finished operation");
    let (status, instance) = api
        .call(
            reqwest::Method::GET,
            format!("zones/{}/instances/proxy-shape", ZONES[0]),
            None,
        )
        .await;
    assert_eq!(status, 200, "{instance}");
    assert_eq!(instance["status"], "RUNNING");
    assert_eq!(shape(&instance), shape(&fixture_json("instance.json")), "an instance");

    // An insert the API accepted and that then failed.
    api.fake
        .with(|w| w.fail_next_insert("QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.", 403));
    let (_, op) = api.insert(ZONES[0], "proxy-failed").await;
    api.fake.advance(DEFAULT_OPERATION_TIME);
    let (_, failed) = api.call(reqwest::Method::GET, operation_path(&op), None).await;
    let mut expected = fixture_json("operation-failed.json");
    // errorDetails is optional in the API's answer; the fake leaves it out.
    if let Some(e) = expected["error"]["errors"][0].as_object_mut() {
        e.remove("errorDetails");
    }
    assert_eq!(shape(&failed), shape(&expected), "a failed operation");
    assert_eq!(failed["httpErrorMessage"], "FORBIDDEN");
}

#[tokio::test]
async fn an_aggregated_list_has_the_shape_of_its_fixture_with_both_kinds_of_warning() {
    let api = Api::new().await;
    assert_eq!(api.insert(ZONES[0], "proxy-listed").await.0, 200);
    api.fake.advance(DEFAULT_OPERATION_TIME);
    api.fake.with(|w| w.set_zone_unreachable(ZONES[1]));
    let (status, list) = api
        .call(
            reqwest::Method::GET,
            "aggregated/instances?returnPartialSuccess=true".into(),
            None,
        )
        .await;
    assert_eq!(status, 200, "{list}");
    let expected = fixture_json("aggregated-list.json");
    let top = |v: &Value| without(v.clone(), &["items"]);
    assert_eq!(shape(&top(&list)), shape(&top(&expected)), "the page");
    let items = list["items"].as_object().expect("items");
    let warning_shape = shape(&expected["items"]["zones/us-central1-a"]);
    let mut codes = Vec::new();
    for (scope, entry) in items {
        match entry.get("instances") {
            Some(instances) => {
                for i in instances.as_array().expect("an array") {
                    assert_eq!(shape(i), shape(&fixture_json("instance.json")), "{scope}");
                }
            }
            None => {
                assert_eq!(shape(entry), warning_shape, "{scope}");
                codes.push(entry["warning"]["code"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    assert_eq!(codes, ["UNREACHABLE"], "the other zone has an instance");
    assert_eq!(list["unreachables"], json!([format!("zones/{}", ZONES[1])]));
    assert_eq!(
        items[&format!("zones/{}", ZONES[1])]["warning"]["code"],
        "UNREACHABLE",
        "named in items too"
    );
    let fixture_codes: Vec<&str> = expected["items"]
        .as_object()
        .map(Map::values)
        .into_iter()
        .flatten()
        .filter_map(|e| e["warning"]["code"].as_str())
        .collect();
    assert_eq!(fixture_codes, ["UNREACHABLE", "NO_RESULTS_ON_PAGE"]);
}

#[tokio::test]
async fn each_error_answer_has_the_shape_and_reason_of_its_fixture() {
    let api = Api::new().await;
    // Operations take a minute on the fake's clock, so the second delete meets the first.
    api.fake.set_operation_time(Duration::from_secs(60));
    let zone = ZONES[0];
    let error = |file: &str| fixture_json(&format!("errors/{file}.json"));
    let check = |(status, body): (u16, Value), file: &str| {
        let expected = error(file);
        assert_eq!(u64::from(status), expected["error"]["code"], "{file}: {body}");
        assert_eq!(shape(&body), shape(&expected), "{file}: {body}");
        assert_eq!(
            body["error"]["errors"][0]["reason"], expected["error"]["errors"][0]["reason"],
            "{file}"
        );
    };
    let get = |path: String| api.call(reqwest::Method::GET, path, None);
    check(get(format!("zones/{zone}/instances/proxy-none")).await, "404-notFound");
    check(
        get("zones/mars-north1-a/instances/proxy-none".into()).await,
        "400-invalid",
    );
    assert_eq!(api.insert(zone, "proxy-twice").await.0, 200);
    check(api.insert(zone, "proxy-twice").await, "409-alreadyExists");
    let delete = || {
        api.call(
            reqwest::Method::DELETE,
            format!("zones/{zone}/instances/proxy-twice"),
            None,
        )
    };
    assert_eq!(delete().await.0, 200);
    check(delete().await, "400-resourceNotReady");
    api.fake.advance(Duration::from_secs(60));
    check(delete().await, "404-notFound");
    let anonymous = api
        .http
        .get(format!(
            "{}/projects/{PROJECT}/aggregated/instances",
            api.fake.base_url()
        ))
        .send()
        .await
        .expect("an answer");
    let status = anonymous.status().as_u16();
    check((status, anonymous.json().await.expect("JSON")), "401-authError");
}

#[tokio::test]
async fn token_and_metadata_requests_are_in_the_call_log_without_their_bodies() {
    let api = Api::new().await;
    let seen = api.fake.with(|w| w.seen());
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].path.starts_with("/computeMetadata/") && seen[0].body.is_none());
    let kinds: Vec<&str> = api.fake.interceptor().call_log().iter().map(|c| c.kind.0).collect();
    assert_eq!(kinds, ["metadata"]);
}

#[tokio::test]
async fn set_labels_needs_the_current_fingerprint_and_changes_the_labels_once_its_operation_is_done() {
    let api = Api::new().await;
    // Operations take a minute on the fake's clock, so the labels are seen before and after.
    api.fake.set_operation_time(Duration::from_secs(60));
    let zone = ZONES[0];
    assert_eq!(api.insert(zone, "proxy-labelled").await.0, 200);
    api.fake.advance(Duration::from_secs(60));
    let instance = format!("zones/{zone}/instances/proxy-labelled");
    let (_, before) = api.call(reqwest::Method::GET, instance.clone(), None).await;
    let fingerprint = before["labelFingerprint"].as_str().expect("a fingerprint").to_owned();
    let set = |labels: Value, fingerprint: &str| {
        api.call(
            reqwest::Method::POST,
            format!("{instance}/setLabels"),
            Some(json!({"labels": labels, "labelFingerprint": fingerprint})),
        )
    };
    let labels = json!({"proxy-operator-managed": "true", "proxy-operator-installation": "blue"});

    let (status, stale) = set(labels.clone(), "AAAAAAAAAAA=").await;
    let expected = fixture_json("errors/412-conditionNotMet.json");
    assert_eq!((status, shape(&stale)), (412, shape(&expected)), "{stale}");
    assert_eq!(stale["error"]["errors"][0]["reason"], "conditionNotMet");

    let (status, op) = set(labels.clone(), &fingerprint).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(
        shape(&op),
        shape(&fixture_json("operation.json")),
        "a running operation"
    );
    assert_eq!(op["operationType"], "setLabels");
    let (_, during) = api.call(reqwest::Method::GET, instance.clone(), None).await;
    assert_eq!(
        during["labels"], before["labels"],
        "labels changed before the operation was done"
    );

    api.fake.advance(Duration::from_secs(60));
    let (_, done) = api.call(reqwest::Method::GET, operation_path(&op), None).await;
    assert_eq!(done["status"], "DONE");
    let (_, after) = api.call(reqwest::Method::GET, instance.clone(), None).await;
    assert_eq!(after["labels"], labels, "setLabels replaces every label");
    assert_ne!(after["labelFingerprint"], before["labelFingerprint"]);
    // The fingerprint read before is stale now.
    assert_eq!(set(labels, &fingerprint).await.0, 412);
}
