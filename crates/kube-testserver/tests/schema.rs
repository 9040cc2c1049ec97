//! Custom resources are checked against their OpenAPI schema and CEL rules, defaulted and pruned.

mod common;

use common::*;
use egress_kube_testserver::TestServer;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

/// A CRD written by hand, the way an operator's CRD looks: bounds, enums, a pattern, lengths, a
/// default, nullable and int-or-string fields, and CEL rules (one a transition rule).
fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "proxies.shop.example.com"},
        "spec": {"group": "shop.example.com", "scope": "Namespaced",
            "names": {"kind": "Proxy", "plural": "proxies", "singular": "proxy", "shortNames": ["px"]},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["provider", "mode"],
                        "x-kubernetes-validations": [
                            {"rule": "self.mode != 'External' || has(self.endpoint)", "message": "External needs an endpoint"},
                            {"rule": "self.provider == oldSelf.provider", "message": "provider is immutable"}
                        ],
                        "properties": {
                            "provider": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-z0-9-]+$"},
                            "mode": {"type": "string", "enum": ["Managed", "External"]},
                            "endpoint": {"type": "string"},
                            "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 3128},
                            "maxLeases": {"type": "integer", "minimum": 0, "default": 5},
                            "weight": {"x-kubernetes-int-or-string": true},
                            "note": {"type": "string", "nullable": true},
                            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                        }},
                    "status": {"type": "object", "properties": {
                        "phase": {"type": "string"},
                        "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["type"],
                            "items": {"type": "object", "required": ["type", "status"], "properties": {
                                "type": {"type": "string"}, "status": {"type": "string"}}}}}}
                }}}}]}
    })
}

async fn setup() -> (TestServer, Api<DynamicObject>) {
    let s = TestServer::builder()
        .crd_json(crd())
        .namespace(NS)
        .start()
        .await
        .unwrap();
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("shop.example.com", "v1", "Proxy"), "proxies");
    let api = Api::namespaced_with(client(&s), NS, &ar);
    (s, api)
}

fn proxy(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "shop.example.com/v1", "kind": "Proxy",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

async fn create(api: &Api<DynamicObject>, name: &str, spec: Value) -> Result<DynamicObject, kube::Error> {
    api.create(&PostParams::default(), &proxy(name, spec)).await
}

fn causes(r: Result<DynamicObject, kube::Error>) -> Vec<(String, String)> {
    match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{}", s.message);
            s.details
                .unwrap()
                .causes
                .iter()
                .map(|c| (c.field.clone(), c.message.clone()))
                .collect()
        }
        other => panic!("expected 422, got {other:?}"),
    }
}

#[tokio::test]
async fn defaults_apply_only_to_absent_fields() {
    let (_s, api) = setup().await;
    let p = create(&api, "a", json!({"provider": "kvm", "mode": "Managed"}))
        .await
        .unwrap();
    assert_eq!(p.data["spec"]["port"], 3128);
    assert_eq!(p.data["spec"]["maxLeases"], 5);
    let zero = create(&api, "b", json!({"provider": "kvm", "mode": "Managed", "maxLeases": 0}))
        .await
        .unwrap();
    assert_eq!(zero.data["spec"]["maxLeases"], 0, "an explicit 0 is kept");
}

#[tokio::test]
async fn unknown_fields_are_pruned_unless_preserved() {
    let (_s, api) = setup().await;
    let p = create(
        &api,
        "a",
        json!({"provider": "kvm", "mode": "Managed", "bogus": 1, "extra": {"anything": [1]}}),
    )
    .await
    .unwrap();
    assert!(p.data["spec"].get("bogus").is_none());
    assert_eq!(p.data["spec"]["extra"], json!({"anything": [1]}));
}

#[tokio::test]
async fn strict_field_validation_refuses_unknown_fields() {
    let (s, _) = setup().await;
    let body = serde_json::to_vec(&proxy("a", json!({"provider": "kvm", "mode": "Managed", "bogus": 1}))).unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!(
            "/apis/shop.example.com/v1/namespaces/{NS}/proxies?fieldValidation=Strict"
        ))
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    match client(&s).request::<DynamicObject>(req).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 400);
            assert!(
                e.message
                    .contains("strict decoding error: unknown field \"spec.bogus\""),
                "{}",
                e.message
            );
        }
        other => panic!("expected 400, got {other:?}"),
    }
}

#[tokio::test]
async fn types_bounds_enums_patterns_and_lengths_are_enforced() {
    let (_s, api) = setup().await;
    let bad = [
        (
            json!({"provider": "kvm", "mode": "Managed", "port": 0}),
            "spec.port",
            "should be greater than or equal to 1",
        ),
        (
            json!({"provider": "kvm", "mode": "Managed", "port": 70000}),
            "spec.port",
            "should be less than or equal to 65535",
        ),
        (
            json!({"provider": "kvm", "mode": "Managed", "port": "80"}),
            "spec.port",
            "must be of type integer",
        ),
        (
            json!({"provider": "kvm", "mode": "Sometimes"}),
            "spec.mode",
            "Unsupported value: \"Sometimes\"",
        ),
        (
            json!({"provider": "KVM!", "mode": "Managed"}),
            "spec.provider",
            "should match '^[a-z0-9-]+$'",
        ),
        (
            json!({"provider": "", "mode": "Managed"}),
            "spec.provider",
            "should be at least 1 chars long",
        ),
        (
            json!({"provider": "x".repeat(64), "mode": "Managed"}),
            "spec.provider",
            "Too long: may not be more than 63",
        ),
        (json!({"mode": "Managed"}), "spec.provider", "Required value"),
        (
            json!({"provider": "kvm", "mode": "Managed", "weight": [1]}),
            "spec.weight",
            "",
        ),
    ];
    for (i, (spec, field, words)) in bad.into_iter().enumerate() {
        let found = causes(create(&api, &format!("p{i}"), spec.clone()).await);
        assert!(
            found.iter().any(|(f, m)| f == field && m.contains(words)),
            "{spec}: wanted {field} \"{words}\", got {found:?}"
        );
    }
    // Int-or-string and nullable fields take what they allow.
    create(
        &api,
        "ok1",
        json!({"provider": "kvm", "mode": "Managed", "weight": 3, "note": null}),
    )
    .await
    .unwrap();
    create(
        &api,
        "ok2",
        json!({"provider": "kvm", "mode": "Managed", "weight": "30%", "note": "n"}),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn cel_rules_are_evaluated_including_transition_rules() {
    let (_s, api) = setup().await;
    let found = causes(create(&api, "a", json!({"provider": "kvm", "mode": "External"})).await);
    assert!(
        found
            .iter()
            .any(|(f, m)| f == "spec" && m.contains("External needs an endpoint")),
        "{found:?}"
    );
    create(
        &api,
        "b",
        json!({"provider": "kvm", "mode": "External", "endpoint": "10.0.0.1:3128"}),
    )
    .await
    .unwrap();
    let change = Patch::Merge(json!({"spec": {"provider": "gcp"}}));
    let found = causes(api.patch("b", &PatchParams::default(), &change).await);
    assert!(
        found.iter().any(|(_, m)| m.contains("provider is immutable")),
        "{found:?}"
    );
    let fine = Patch::Merge(json!({"spec": {"port": 8080}}));
    assert_eq!(
        api.patch("b", &PatchParams::default(), &fine).await.unwrap().data["spec"]["port"],
        8080
    );
}

#[tokio::test]
async fn an_invalid_update_changes_nothing() {
    let (s, api) = setup().await;
    create(&api, "a", json!({"provider": "kvm", "mode": "Managed"}))
        .await
        .unwrap();
    let rv = s.resource_version();
    let _ = causes(
        api.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": -1}})),
        )
        .await,
    );
    assert_eq!(s.resource_version(), rv);
    assert_eq!(api.get("a").await.unwrap().data["spec"]["port"], 3128);
}

#[tokio::test]
async fn a_crd_with_an_unusable_schema_is_refused_at_start() {
    let mut broken = crd();
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["port"]["minimum"] =
        json!("one");
    let err = TestServer::builder().crd_json(broken).start().await.unwrap_err();
    assert!(err.to_string().contains("proxies.shop.example.com"), "{err}");
    let mut misnamed = crd();
    misnamed["metadata"]["name"] = json!("wrong");
    let err = TestServer::builder().crd_json(misnamed).start().await.unwrap_err();
    assert!(err.to_string().contains("must be spec.names.plural"), "{err}");
}

#[tokio::test]
async fn server_side_apply_merges_map_lists_per_item_and_finalizers_as_a_set() {
    let (_s, api) = setup().await;
    create(&api, "a", json!({"provider": "kvm", "mode": "Managed"}))
        .await
        .unwrap();
    let status = |kind: &str, value: &str| {
        Patch::Apply(
            json!({"apiVersion": "shop.example.com/v1", "kind": "Proxy", "metadata": {"name": "a"},
            "status": {"conditions": [{"type": kind, "status": value}]}}),
        )
    };
    api.patch_status("a", &PatchParams::apply("health"), &status("Healthy", "True"))
        .await
        .unwrap();
    let p = api
        .patch_status("a", &PatchParams::apply("reconciler"), &status("Ready", "False"))
        .await
        .unwrap();
    let types: Vec<&str> = p.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, vec!["Healthy", "Ready"], "each manager owns its own condition");
    match api
        .patch_status("a", &PatchParams::apply("reconciler"), &status("Healthy", "False"))
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 409);
            assert!(
                e.message.contains(".status.conditions[type=\"Healthy\"].status"),
                "{}",
                e.message
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    let finalizer = |f: &str| {
        Patch::Apply(json!({"apiVersion": "shop.example.com/v1", "kind": "Proxy",
            "metadata": {"name": "a", "finalizers": [f]}, "spec": {"provider": "kvm", "mode": "Managed"}}))
    };
    api.patch("a", &PatchParams::apply("one"), &finalizer("x/one"))
        .await
        .unwrap();
    let p = api
        .patch("a", &PatchParams::apply("two"), &finalizer("x/two"))
        .await
        .unwrap();
    assert_eq!(
        p.metadata.finalizers,
        Some(vec!["x/one".to_string(), "x/two".to_string()])
    );
}
