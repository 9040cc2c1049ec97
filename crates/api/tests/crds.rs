//! The CRDs as the API server sees them: the manifests in deploy/crds (which `cargo xtask crds
//! --check` keeps equal to the types) installed in egress-kube-testserver, which checks objects
//! against their schema and CEL rules as kube-apiserver does.

use std::path::{Path, PathBuf};

use egress_api::{
    Condition, ConditionStatus, Mode, ProviderHealth, ProviderHealthStatus, Proxy, ProxySpec, ProxyStatus,
};
use egress_kube_testserver::TestServer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The YAML documents of a file, as JSON.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---\n")
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|d| serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

async fn server() -> TestServer {
    let mut builder = TestServer::builder();
    for name in [
        "crawl.example.com_proxies.yaml",
        "crawl.example.com_providerhealths.yaml",
        "crawl.example.com_proxypools.yaml",
    ] {
        for crd in documents(&deploy().join("crds").join(name)) {
            builder = builder.crd_json(crd);
        }
    }
    builder.start().await.expect("the CRDs in deploy/crds install")
}

fn dynamic(s: &TestServer, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(egress_api::GROUP, egress_api::VERSION, kind),
        plural,
    );
    Api::namespaced_with(s.client().unwrap(), "default", &ar)
}

#[test]
fn the_manifests_in_deploy_are_the_types() {
    for (file, crd) in [
        ("crawl.example.com_proxies.yaml", Proxy::crd()),
        ("crawl.example.com_providerhealths.yaml", ProviderHealth::crd()),
        ("crawl.example.com_proxypools.yaml", egress_api::ProxyPool::crd()),
    ] {
        let on_disk = documents(&deploy().join("crds").join(file));
        assert_eq!(
            on_disk,
            vec![serde_json::to_value(&crd).unwrap()],
            "{file} is stale: run `cargo xtask crds`"
        );
    }
}

#[test]
fn identity_is_the_go_operators() {
    let crd = Proxy::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("proxies.crawl.example.com"));
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["px".to_string()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        vec!["Mode", "Provider", "Phase", "IP", "Healthy", "Exit", "Country"]
    );
    let ph = ProviderHealth::crd();
    assert_eq!(ph.spec.scope, "Cluster");
    assert_eq!(ph.spec.names.short_names, Some(vec!["ph".to_string()]));
    let columns: Vec<&str> = ph.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, vec!["Type", "Ready", "Targets", "Last Check", "Age"]);
}

#[tokio::test]
async fn every_sample_is_accepted() {
    let s = server().await;
    let proxies = dynamic(&s, "Proxy", "proxies");
    let pools = dynamic(&s, "ProxyPool", "proxypools");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(s.client().unwrap(), "default");
    let mut count = 0;
    let mut pool_count = 0;
    // The cluster samples, and below them the ones `cargo xtask dev` applies (samples/local).
    let mut dirs = vec![deploy().join("samples")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n != "kustomization.yaml") {
                files.push(path);
            }
        }
    }
    for path in files {
        for doc in documents(&path) {
            match doc["kind"].as_str() {
                Some("Proxy") => {
                    let obj: DynamicObject = serde_json::from_value(doc).unwrap();
                    proxies
                        .create(&PostParams::default(), &obj)
                        .await
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    count += 1;
                }
                Some("ProxyPool") => {
                    let obj: DynamicObject = serde_json::from_value(doc).unwrap();
                    pools
                        .create(&PostParams::default(), &obj)
                        .await
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    pool_count += 1;
                }
                Some("Secret") => {
                    secrets
                        .create(&PostParams::default(), &serde_json::from_value(doc).unwrap())
                        .await
                        .unwrap();
                }
                other => panic!("{}: unexpected kind {other:?}", path.display()),
            }
        }
    }
    assert!(count >= 8, "{count} samples");
    assert_eq!(pool_count, 2, "the cluster pool and the one cargo xtask dev applies");
    // They read back as the typed Proxy.
    let typed: Api<Proxy> = Api::namespaced(s.client().unwrap(), "default");
    let external = typed.get("office").await.unwrap();
    assert_eq!(external.spec.mode, Mode::External);
    assert_eq!(
        external.spec.external_address(),
        Some(("proxy.office.example.net".into(), 8080))
    );
}

#[tokio::test]
async fn defaults_fill_only_what_is_absent() {
    let s = server().await;
    let proxies = dynamic(&s, "Proxy", "proxies");
    let create = |name: &str, spec: Value| {
        let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "crawl.example.com/v1alpha1",
            "kind": "Proxy", "metadata": {"name": name}, "spec": spec}))
        .unwrap();
        let proxies = proxies.clone();
        async move { proxies.create(&PostParams::default(), &obj).await }
    };
    let p = create("a", json!({"provider": "kvm-home"})).await.unwrap();
    assert_eq!(p.data["spec"]["mode"], "Managed");
    assert_eq!(p.data["spec"]["port"], 3128);
    assert_eq!(p.data["spec"]["maxLeases"], 5);
    let zero = create("b", json!({"provider": "kvm-home", "maxLeases": 0}))
        .await
        .unwrap();
    assert_eq!(
        zero.data["spec"]["maxLeases"], 0,
        "an explicit 0 means unleasable and stays"
    );
    let secret = create(
        "c",
        json!({"provider": "kvm-home", "cloudInit": {"secretRef": {"name": "s"}}}),
    )
    .await
    .unwrap();
    assert_eq!(secret.data["spec"]["cloudInit"]["secretRef"]["key"], "userdata");
}

#[tokio::test]
async fn malformed_proxies_are_refused_with_the_reason() {
    let s = server().await;
    let proxies = dynamic(&s, "Proxy", "proxies");
    let cases = [
        (json!({"mode": "External"}), "an External proxy needs spec.endpoint"),
        (json!({"mode": "Managed"}), "a Managed proxy needs spec.provider"),
        (
            json!({"provider": "kvm", "endpoint": {"host": "h"}}),
            "spec.endpoint is for External proxies only",
        ),
        (json!({"provider": "KVM-Home"}), "spec.provider in body should match"),
        (json!({"provider": "k".repeat(64)}), "Too long: may not be more than 63"),
        (
            json!({"provider": "kvm", "port": 0}),
            "spec.port in body should be greater than or equal to 1",
        ),
        (
            json!({"provider": "kvm", "port": 65536}),
            "spec.port in body should be less than or equal to 65535",
        ),
        (
            json!({"provider": "kvm", "maxLeases": -1}),
            "spec.maxLeases in body should be greater than or equal to 0",
        ),
        (
            json!({"provider": "kvm", "mode": "Sometimes"}),
            "Unsupported value: \"Sometimes\"",
        ),
        (
            json!({"provider": "kvm", "cloudInit": {"inline": "x", "secretRef": {"name": "s"}}}),
            "exactly one of cloudInit.inline and cloudInit.secretRef",
        ),
        (
            json!({"provider": "kvm", "cloudInit": {}}),
            "exactly one of cloudInit.inline and cloudInit.secretRef",
        ),
        (
            json!({"provider": "kvm", "healthCheck": {"url": "ftp://x"}}),
            "spec.healthCheck.url in body should match",
        ),
        (
            json!({"provider": "kvm", "healthCheck": {"intervalSeconds": 0}}),
            "spec.healthCheck.intervalSeconds in body should be greater than or equal to 1",
        ),
        (
            json!({"mode": "External", "endpoint": {"host": "h", "port": 0}}),
            "spec.endpoint.port in body should be greater than or equal to 1",
        ),
        (
            json!({"provider": "kvm", "attributes": {"geo": 1}}),
            "spec.attributes.geo in body must be of type string",
        ),
        (
            json!({"provider": "kvm", "attributes": {"geo": "eu", "session": "x"}}),
            "the attribute names session, ttl and exit.* are reserved",
        ),
        (
            json!({"provider": "kvm", "attributes": {"ttl": "60"}}),
            "the attribute names session, ttl and exit.* are reserved",
        ),
        (
            json!({"provider": "kvm", "attributes": {"exit.country": "de"}}),
            "the attribute names session, ttl and exit.* are reserved",
        ),
    ];
    for (i, (spec, words)) in cases.into_iter().enumerate() {
        let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "crawl.example.com/v1alpha1",
            "kind": "Proxy", "metadata": {"name": format!("bad-{i}")}, "spec": spec}))
        .unwrap();
        match proxies.create(&PostParams::default(), &obj).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{spec}: {}", e.message);
                assert!(
                    e.message.contains(words),
                    "{spec}: wanted \"{words}\" in \"{}\"",
                    e.message
                );
            }
            other => panic!("{spec} should be refused, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn max_unhealthy_takes_a_count_or_a_percentage_and_startup_grace_a_duration() {
    let s = server().await;
    let pools = dynamic(&s, "ProxyPool", "proxypools");
    let pool = |name: &str, extra: Value| -> DynamicObject {
        let mut spec = json!({"template": {"spec": {"provider": "p"}}});
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap()
    };
    let accepted = [
        json!({"maxUnhealthy": 2}),
        json!({"maxUnhealthy": 0}),
        json!({"maxUnhealthy": "40%"}),
        json!({"maxUnhealthy": "100%"}),
        json!({"startupGrace": "90s"}),
    ];
    for (i, extra) in accepted.into_iter().enumerate() {
        let made = pools
            .create(&PostParams::default(), &pool(&format!("ok-{i}"), extra.clone()))
            .await;
        assert!(made.is_ok(), "{extra}: {made:?}");
    }
    let refused = [
        (
            json!({"maxUnhealthy": -1}),
            "spec.maxUnhealthy in body should be greater than or equal to 0",
        ),
        (json!({"maxUnhealthy": "40"}), "spec.maxUnhealthy in body should match"),
        (
            json!({"maxUnhealthy": "101%"}),
            "spec.maxUnhealthy in body should match",
        ),
        (
            json!({"startupGrace": "5 minutes"}),
            "spec.startupGrace in body should match",
        ),
    ];
    for (i, (extra, words)) in refused.into_iter().enumerate() {
        match pools
            .create(&PostParams::default(), &pool(&format!("bad-{i}"), extra.clone()))
            .await
        {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{extra}: {}", e.message);
                assert!(
                    e.message.contains(words),
                    "{extra}: wanted \"{words}\" in \"{}\"",
                    e.message
                );
            }
            other => panic!("{extra} should be refused, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_provider_cannot_change() {
    let s = server().await;
    let api: Api<Proxy> = Api::namespaced(s.client().unwrap(), "default");
    let proxy = Proxy::new(
        "a",
        ProxySpec {
            provider: "kvm-home".into(),
            ..Default::default()
        },
    );
    api.create(&PostParams::default(), &proxy).await.unwrap();
    let change = Patch::Merge(json!({"spec": {"provider": "gcp-eu"}}));
    match api.patch("a", &PatchParams::default(), &change).await {
        Err(kube::Error::Api(e)) => assert!(e.message.contains("spec.provider is immutable"), "{}", e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let fine = Patch::Merge(json!({"spec": {"attributes": {"geo": "eu"}}}));
    api.patch("a", &PatchParams::default(), &fine).await.unwrap();
}

#[tokio::test]
async fn status_round_trips_and_kubectl_columns_read_it() {
    let s = server().await;
    let api: Api<Proxy> = Api::namespaced(s.client().unwrap(), "default");
    let proxy = Proxy::new(
        "a",
        ProxySpec {
            provider: "kvm-home".into(),
            ..Default::default()
        },
    );
    api.create(&PostParams::default(), &proxy).await.unwrap();
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
    let condition = |type_: &str, status| Condition {
        type_: type_.into(),
        status,
        observed_generation: Some(1),
        last_transition_time: now.clone(),
        reason: "ProbeSucceeded".into(),
        message: String::new(),
    };
    let status = ProxyStatus {
        phase: Some(egress_api::Phase::Ready),
        ip: "10.0.0.7".into(),
        provider_id: "kvm2://hv1/abc".into(),
        conditions: vec![
            condition("Provisioned", ConditionStatus::True),
            condition("Healthy", ConditionStatus::True),
        ],
        latency_millis: Some(42),
        exit: Some(Box::new(egress_api::ExitStatus {
            address: "203.0.113.7".into(),
            observed_at: "2027-01-15T08:00:00Z".into(),
            country: Some("DE".into()),
            asn: Some(64500),
            organization: Some("Example Networks".into()),
        })),
    };
    let patched = api
        .patch_status("a", &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .unwrap();
    assert_eq!(patched.status, Some(status));
    assert_eq!(patched.condition("Healthy").unwrap().status, ConditionStatus::True);
    // The table `kubectl get px` prints.
    let req = http::Request::builder()
        .uri("/apis/crawl.example.com/v1alpha1/namespaces/default/proxies")
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: Value = s.client().unwrap().request(req).await.unwrap();
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["Name", "Mode", "Provider", "Phase", "IP", "Healthy", "Exit", "Country"]
    );
    assert_eq!(
        table["rows"][0]["cells"],
        json!([
            "a",
            "Managed",
            "kvm-home",
            "Ready",
            "10.0.0.7",
            "True",
            "203.0.113.7",
            "DE"
        ])
    );
    // Exit and Country only with -o wide.
    let priorities: Vec<i64> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["priority"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(priorities, vec![0, 0, 0, 0, 0, 0, 1, 1]);
}

#[tokio::test]
async fn provider_health_is_cluster_scoped_status_only() {
    let s = server().await;
    let api: Api<ProviderHealth> = Api::all(s.client().unwrap());
    let mut ph = ProviderHealth::new("kvm-home", Default::default());
    ph.metadata.labels = Some(
        [(
            egress_api::LABEL_MANAGED_BY.to_string(),
            egress_api::MANAGED_BY.to_string(),
        )]
        .into(),
    );
    api.create(&PostParams::default(), &ph).await.unwrap();
    let status = ProviderHealthStatus {
        type_: "kvm2".into(),
        targets_ready: "0/0".into(),
        ..Default::default()
    };
    let got = api
        .patch_status(
            "kvm-home",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    assert_eq!(got.status.unwrap().targets_ready, "0/0");
    let long = "x".repeat(1025);
    let bad = json!({"status": {"targets": [{"name": "hv1", "ready": false, "message": long,
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    match api
        .patch_status("kvm-home", &PatchParams::default(), &Patch::Merge(bad))
        .await
    {
        Err(kube::Error::Api(e)) => assert!(
            e.message.contains("Too long: may not be more than 1024"),
            "{}",
            e.message
        ),
        other => panic!("a 1025-character message must be refused, got {other:?}"),
    }
}
