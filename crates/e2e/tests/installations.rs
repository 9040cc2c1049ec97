//! Two operators with default settings sharing one backend never collect each other's
//! instances: each derives its installation id from its cluster (the `kube-system` namespace's
//! UID) and its own namespace, marks its instances with it, and its orphan GC takes only
//! instances carrying it. Shown on two test API servers, and on one server with the operators
//! in two namespaces, the operators running in this process over one in-memory reference
//! backend, their GC sweeping every second with no minimum age. On two servers, without the ids
//! each would delete the other's instance on its first sweep (its Proxy is not in its cluster);
//! on one server GC's cluster-wide list of live Proxies already protects them, and what is
//! checked beyond it is that the two namespaces give two ids, so each collects only its own
//! orphans.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{PATIENCE, wait_for_proxy};
use egress_api::{Phase, Proxy};
use egress_conformance::BackendHooks as _;
use egress_conformance::memory::{DEFAULT_ZONE, MemoryBackend, MemoryProvider, MemoryTarget, REMOVE};
use egress_controller::proxy::health::HealthVerdicts;
use egress_controller::proxy::status::Verdict;
use egress_kube_testserver::TestServer;
use egress_provider::config::{ProviderConfig, validators};
use egress_provider::{CreateRequest, OpCtx, Provider, ProviderType, Registry};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};

const PROVIDERS_YAML: &str = "providers:\n  - name: reference\n    type: reference\n";

struct AllHealthy;

impl HealthVerdicts for AllHealthy {
    fn verdict(&self, _namespace: &str, _name: &str) -> Option<Verdict> {
        Some(Verdict {
            healthy: true,
            latency: Duration::from_millis(5),
            auth_refused: false,
        })
    }
}

fn provider(backend: &MemoryBackend) -> MemoryProvider {
    MemoryProvider::new("reference", MemoryTarget::config(backend), backend.clone(), vec![])
}

/// One operator in this process, on `server`, running in `namespace` (its kubeconfig's), over
/// `backend`, sweeping orphans every second whatever their age.
fn start(
    server: &TestServer,
    namespace: &str,
    backend: &MemoryBackend,
) -> tokio::task::JoinHandle<std::process::ExitCode> {
    // One directory per server and namespace: the operator reads its files after this returns.
    let port = server.url().to_string();
    let port = port
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let dir = egress_testkit::scratch_dir(&format!("installations-{port}-{namespace}"));
    let (providers, kubeconfig) = (dir.join("providers.yaml"), dir.join("kubeconfig"));
    std::fs::write(&providers, PROVIDERS_YAML).unwrap();
    let config = server
        .kubeconfig()
        .replace("namespace: default", &format!("namespace: {namespace}"));
    std::fs::write(&kubeconfig, config).unwrap();
    let args = [
        format!("--providers-config={}", providers.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--discovery-addr=0".into(),
        "--health-probe-bind-address=0".into(),
        "--metrics-bind-address=0".into(),
        "--provider-check-interval=0".into(),
        "--gc-interval=1s".into(),
        "--gc-min-age=0s".into(),
    ];
    let egress_manager::flags::Command::Run(options) = egress_manager::flags::parse(args).unwrap() else {
        panic!("the flags are a run");
    };
    let shared = backend.clone();
    let registry = Registry::new().with(ProviderType::new(
        "reference",
        validators::none,
        move |_: &ProviderConfig| Ok(Arc::new(provider(&shared)) as Arc<dyn Provider>),
    ));
    let extensions = egress_manager::Extensions {
        registry: Box::new(move |_| registry),
        health: egress_manager::Health::Scripted {
            verdicts: Arc::new(AllHealthy),
            events: Box::pin(futures::stream::pending()),
        },
        notice: None,
    };
    tokio::spawn(egress_manager::run(*options, extensions))
}

/// The id an operator in `namespace` of `server`'s cluster derives.
async fn derived_id(server: &TestServer, namespace: &str) -> String {
    let uid = egress_controller::installation::cluster_uid(&server.client().unwrap())
        .await
        .unwrap();
    egress_controller::installation::derive(&uid, namespace)
}

/// A Ready Proxy named `name` in `namespace`: the name of its instance.
async fn ready_proxy(server: &TestServer, namespace: &str, name: &str) -> String {
    let proxies: Api<Proxy> = Api::namespaced(server.client().unwrap(), namespace);
    let spec = serde_json::from_value(
        serde_json::json!({"mode": "Managed", "provider": "reference", "placement": {"zone": DEFAULT_ZONE, "machineType": "small", "image": "debian-13"}}),
    )
    .unwrap();
    proxies
        .create(&PostParams::default(), &Proxy::new(name, spec))
        .await
        .unwrap();
    let p = wait_for_proxy(&proxies, name, "Ready", PATIENCE, |p| {
        p.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Ready))
    })
    .await;
    egress_provider::name_from_uid(&p.uid().unwrap())
}

/// An instance of `installation` whose Proxy is gone: its orphan GC's to collect.
async fn orphan(backend: &MemoryBackend, installation: &str, uid: &str) -> String {
    let name = egress_provider::name_from_uid(uid);
    let request = CreateRequest {
        name: name.clone(),
        uid: uid.to_owned(),
        namespace: "default".into(),
        proxy_name: uid.to_owned(),
        placement: egress_provider::Placement {
            zone: DEFAULT_ZONE.into(),
            machine_type: "small".into(),
            image: "debian-13".into(),
            ..Default::default()
        },
        cloud_init: Vec::new(),
        port: 3128,
        installation: Some(installation.to_owned()),
        credentials: None,
        spread_group: None,
    };
    provider(backend).create(&OpCtx::background(), &request).await.unwrap();
    name
}

async fn names(backend: &MemoryBackend) -> Vec<String> {
    backend
        .inventory()
        .await
        .unwrap()
        .into_iter()
        .filter(|o| o.kind == "instance")
        .map(|o| o.owner)
        .collect()
}

/// Two operators: each serves a Ready Proxy; then each gets an orphan of its own, and once both
/// orphans are collected (each GC has swept with the other's instance in the backend), both
/// Proxies' instances are there and were never removed.
async fn never_collect_each_other(first: (&TestServer, &str), second: (&TestServer, &str)) {
    let backend = MemoryBackend::new();
    let operators = [start(first.0, first.1, &backend), start(second.0, second.1, &backend)];
    let instances = [
        ready_proxy(first.0, first.1, "first").await,
        ready_proxy(second.0, second.1, "second").await,
    ];
    let ids = [derived_id(first.0, first.1).await, derived_id(second.0, second.1).await];
    assert_ne!(ids[0], ids[1]);
    let orphans = [
        orphan(&backend, &ids[0], "orphan-of-first").await,
        orphan(&backend, &ids[1], "orphan-of-second").await,
    ];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while names(&backend).await.iter().any(|n| orphans.contains(n)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the orphans were never collected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = names(&backend).await;
    for instance in &instances {
        assert!(left.contains(instance), "{instance} is gone: {left:?}");
    }
    let removed: Vec<String> = backend
        .call_log()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.kind == REMOVE)
        .map(|c| c.target)
        .collect();
    assert!(
        !removed.iter().any(|t| instances.iter().any(|i| t.contains(i.as_str()))),
        "an operator removed the other's instance: {removed:?}"
    );
    for operator in operators {
        operator.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_on_two_clusters_never_collect_each_others_instances() {
    let (one, two) = (common::test_server().await, common::test_server().await);
    never_collect_each_other((&one, "default"), (&two, "default")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_in_two_namespaces_of_one_cluster_never_collect_each_others_instances() {
    let server = common::test_server().await;
    let namespaces: Api<Namespace> = Api::all(server.client().unwrap());
    for name in ["team-a", "team-b"] {
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some(name.into());
        namespaces.create(&PostParams::default(), &namespace).await.unwrap();
    }
    never_collect_each_other((&server, "team-a"), (&server, "team-b")).await;
}
