//! The RBAC in deploy/rbac grants exactly what the operator's code does: every component runs
//! its paths against egress-kube-testserver through a client named "operator", serving one
//! namespace as the default install does, and the requests it made (by verb and resource) must
//! equal the rules granted; a request made across namespaces must be one a ClusterRole grants
//! (the test API server does not authorize, so this is where a Role's limit is checked).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use egress_api::{CloudInit, Phase, ProviderHealth, Proxy, ProxySpec, SecretRef};
use egress_conformance::memory::MemoryBackend;
use egress_conformance::{BackendHooks, SeedSpec, SeedTime};
use egress_controller::gc::OrphanGc;
use egress_controller::leader::{ElectionTimings, Elector, LEASE_NAME};
use egress_controller::provider_health::{Monitor, ProviderHealthSnapshot, Schedule};
use egress_controller::proxy::context::Context;
use egress_controller::proxy::controller::{self, ControllerConfig};
use egress_controller::proxy::decide::Timings;
use egress_controller::proxy::health::HealthVerdicts;
use egress_controller::proxy::status::Verdict;
use egress_kube_testserver::{HookVerdict, HookedRequest, TestServer};
use egress_provider::OpCtx;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const NS: &str = "crawl";
const LIVENESS: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Verdicts(Mutex<HashMap<String, Verdict>>);
impl HealthVerdicts for Verdicts {
    fn verdict(&self, _: &str, name: &str) -> Option<Verdict> {
        self.0.lock().unwrap().get(name).copied()
    }
}

/// (apiGroup, resource, verb) for every rule of the manifests, and whether some ClusterRole
/// grants it (else only Roles do: in one namespace).
fn granted() -> BTreeMap<(String, String, String), bool> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/rbac");
    let mut out = BTreeMap::new();
    for file in [
        "role.yaml",
        "proxy_secrets_role.yaml",
        "leader_election_role.yaml",
        "discovery_token_role.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let role: Value = serde_saphyr::from_str(&text).unwrap();
        let cluster_wide = role["kind"] == "ClusterRole";
        for rule in role["rules"].as_array().unwrap() {
            for g in rule["apiGroups"].as_array().unwrap() {
                for r in rule["resources"].as_array().unwrap() {
                    for v in rule["verbs"].as_array().unwrap() {
                        let key = (
                            g.as_str().unwrap().into(),
                            r.as_str().unwrap().into(),
                            v.as_str().unwrap().into(),
                        );
                        *out.entry(key).or_default() |= cluster_wide;
                    }
                }
            }
        }
    }
    out
}

/// (verb, resource) of every request the client "operator" made across namespaces (a list or
/// watch of every namespace, or a cluster-scoped resource), recorded as they are served.
fn record_cluster_wide(server: &TestServer) -> Arc<Mutex<BTreeSet<(String, String)>>> {
    let seen: Arc<Mutex<BTreeSet<(String, String)>>> = Arc::default();
    let record = seen.clone();
    server.faults().set_hook(Some(Arc::new(move |r: HookedRequest| {
        if r.client.as_deref() == Some("operator") && r.namespace.is_none() {
            record.lock().unwrap().insert((r.verb.as_str().to_owned(), r.resource));
        }
        Box::pin(async { HookVerdict::Serve })
    })));
    seen
}

fn group_of(resource: &str) -> &'static str {
    match resource.split('/').next().unwrap() {
        "proxies" | "providerhealths" | "proxypools" => "crawl.example.com",
        "leases" => "coordination.k8s.io",
        "events" => "events.k8s.io",
        "secrets" | "namespaces" => "",
        other => panic!("the operator touched an unexpected resource: {other}"),
    }
}

async fn wait_phase(api: &Api<Proxy>, name: &str, phase: Phase) {
    let cond = move |p: Option<&Proxy>| p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase) == Some(phase);
    tokio::time::timeout(LIVENESS, await_condition(api.clone(), name, cond))
        .await
        .expect("phase")
        .unwrap();
}

#[tokio::test]
async fn the_manager_role_grants_exactly_what_the_code_uses() {
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .custom_resource::<ProviderHealth>()
        .custom_resource::<egress_api::ProxyPool>()
        .namespace(NS)
        .namespace("system")
        .start()
        .await
        .unwrap();
    let me = server.client().unwrap();
    let operator = server.client_named("operator").unwrap();
    let cluster_wide = record_cluster_wide(&server);
    // It serves NS alone, as the default install serves its own namespace.
    let served = egress_api::served::Namespaces::one(NS);
    let backend = MemoryBackend::new();
    let providers = common::memory_providers(&[("mem", &backend)]);
    let shutdown = CancellationToken::new();

    // Leader election: acquire, then renew at least once.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(operator.clone(), "system");
    let timings = ElectionTimings {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(100),
    };
    let (_leader, mut leading) = Elector::new(leases, LEASE_NAME, "operator", timings)
        .unwrap()
        .run(shutdown.clone());
    tokio::time::timeout(LIVENESS, leading.wait_for(|l| *l))
        .await
        .unwrap()
        .unwrap();

    // The reconciler, through a Proxy's whole life, with a cloud-init Secret and health events.
    let verdicts = Arc::new(Verdicts::default());
    let fast = Timings {
        drift_poll: Duration::from_millis(200),
        ..common::fast_timings()
    };
    let ctx = Arc::new(Context::new(
        operator.clone(),
        providers.clone(),
        verdicts.clone(),
        fast,
        None,
        shutdown.clone(),
    ));
    let (events, health_events) = futures::channel::mpsc::unbounded();
    let (cache, keep_cache) = egress_controller::proxy_cache::proxy_cache(operator.clone(), &served, shutdown.clone());
    tokio::spawn(keep_cache);
    let (credentials, keep_credentials) =
        egress_controller::proxy::credentials::credential_cache(operator.clone(), &served, shutdown.clone());
    tokio::spawn(keep_credentials);
    let config = ControllerConfig {
        namespaces: served.clone(),
        ..Default::default()
    };
    let run = controller::run(ctx, config, cache.clone(), health_events, shutdown.clone());
    tokio::spawn(run);
    let store: Arc<dyn egress_lease::LeaseStore> = Arc::new(egress_lease::MemoryStore::new(
        Arc::new(egress_lease::SystemClock),
        Duration::from_secs(60),
    ));
    let pools_ctx = Arc::new(egress_controller::pool::pass::PoolContext::new(
        operator.clone(),
        cache,
        store,
        egress_controller::pool::metrics::PoolMetrics::new(),
        None,
    ));
    tokio::spawn(egress_controller::pool::controller::run(
        pools_ctx,
        served,
        shutdown.clone(),
    ));
    let secrets: Api<Secret> = Api::namespaced(me.clone(), NS);
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "ud",
        "labels": {"crawl.example.com/cloud-init": "true"}}, "stringData": {"userdata": "#cloud-config\n"}}))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let proxies: Api<Proxy> = Api::namespaced(me.clone(), NS);
    let spec = ProxySpec {
        cloud_init: Some(CloudInit {
            inline: None,
            secret_ref: Some(SecretRef {
                name: "ud".into(),
                key: "userdata".into(),
            }),
        }),
        // Generated credentials: their Secret is created, bound, and rotated by the replacement below.
        credentials: Some(egress_api::Credentials {
            type_: egress_api::CredentialsType::Generated,
            secret_ref: None,
        }),
        ..common::mem_spec()
    };
    proxies
        .create(&PostParams::default(), &Proxy::new("p", spec))
        .await
        .unwrap();
    wait_phase(&proxies, "p", Phase::Running).await;
    let first = proxies.get("p").await.unwrap();
    let credentials_secret = egress_controller::proxy::credentials::secret_name(&first.uid().unwrap());
    let cached = |p: &Proxy| credentials.for_proxy(p);
    let deadline = tokio::time::Instant::now() + LIVENESS;
    while cached(&first).is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the credentials never reached the cache"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = cached(&first).unwrap();
    let say = |healthy: bool| {
        verdicts.0.lock().unwrap().insert(
            "p".into(),
            Verdict {
                healthy,
                latency: std::time::Duration::from_millis(1),
                auth_refused: false,
            },
        );
        events.unbounded_send(ObjectRef::new("p").within(NS)).unwrap();
    };
    // Ready, Unhealthy, Ready again: the repeated Ready event is patched into a series.
    say(true);
    wait_phase(&proxies, "p", Phase::Ready).await;
    say(false);
    wait_phase(&proxies, "p", Phase::Unhealthy).await;
    say(true);
    wait_phase(&proxies, "p", Phase::Ready).await;
    common::change_port(&proxies, "p").await;
    // The replacement rotates the credentials (a patch of their Secret).
    let deadline = tokio::time::Instant::now() + LIVENESS;
    loop {
        let secret = secrets.get(&credentials_secret).await.unwrap();
        let now = proxies.get("p").await.unwrap();
        // The cache gives credentials only for the instance the status records.
        let rotated = cached(&now).is_some_and(|c| c != before);
        let bound = secret
            .annotations()
            .contains_key(egress_api::ANNOTATION_CREDENTIALS_INSTANCE);
        let replaced = now.status.is_some_and(|s| !s.provider_id.is_empty()) && now.spec.port == 8080;
        if rotated && bound && replaced {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the credentials were not rotated"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let uid = proxies.get("p").await.unwrap().uid().unwrap();
    proxies.delete("p", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        LIVENESS,
        await_condition(proxies.clone(), "p", conditions::is_deleted(&uid)),
    )
    .await
    .unwrap()
    .unwrap();

    // The pool controller: a member made, then, as the pool is deleted, drained and deleted.
    let pools: Api<egress_api::ProxyPool> = Api::namespaced(me.clone(), NS);
    let pool: egress_api::ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "fleet"},
        "spec": {"replicas": 1, "template": {"spec": serde_json::to_value(common::mem_spec()).unwrap()}}}))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let counted =
        |p: Option<&egress_api::ProxyPool>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.replicas == 1);
    tokio::time::timeout(LIVENESS, await_condition(pools.clone(), "fleet", counted))
        .await
        .expect("the pool counts its member")
        .unwrap();
    let pool_uid = pools.get("fleet").await.unwrap().uid().unwrap();
    pools.delete("fleet", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        LIVENESS,
        await_condition(pools.clone(), "fleet", conditions::is_deleted(&pool_uid)),
    )
    .await
    .expect("the pool goes once its member has")
    .unwrap();

    // Orphan GC, with an orphan to delete.
    let old = SystemTime::now() - Duration::from_secs(3600);
    backend
        .seed(SeedSpec {
            created_at: SeedTime::Valid(old),
            ..SeedSpec::marked("orphan", "gone")
        })
        .await
        .unwrap();
    let gc = OrphanGc {
        client: operator.clone(),
        providers: providers.clone(),
        interval: Duration::from_secs(600),
        min_age: Duration::from_secs(600),
        installation: None,
    };
    assert_eq!(gc.sweep(&OpCtx::background()).await.deleted, 1);

    // The provider-health monitor, with a stale object to clean up.
    let phs: Api<ProviderHealth> = Api::all(me.clone());
    let mut stale = ProviderHealth::new("gone", Default::default());
    stale.metadata.labels = Some(
        [(
            egress_api::LABEL_MANAGED_BY.to_string(),
            egress_api::MANAGED_BY.to_string(),
        )]
        .into(),
    );
    phs.create(&PostParams::default(), &stale).await.unwrap();
    let schedule = Schedule {
        interval: Duration::from_secs(60),
        timeout: Duration::from_secs(10),
    };
    let monitor = Monitor {
        client: operator.clone(),
        providers,
        schedule: Some(schedule),
        snapshot: ProviderHealthSnapshot::default(),
    };
    assert_eq!(monitor.cleanup().await.unwrap(), 1);
    monitor.round(&schedule, &shutdown).await;
    monitor.round(&schedule, &shutdown).await;

    // The installation id, derived at start from the cluster's kube-system namespace.
    let uid = egress_controller::installation::cluster_uid(&operator).await.unwrap();
    assert!(!uid.is_empty());

    // The discovery token's Secret in the manager's namespace: made once, then read.
    let own: Api<Secret> = Api::namespaced(operator.clone(), "system");
    let made = egress_controller::token_secret::ensure(&own, "first-token".into())
        .await
        .unwrap();
    assert!(matches!(made, egress_controller::token_secret::TokenOrigin::Created(_)));
    let again = egress_controller::token_secret::ensure(&own, "second-token".into())
        .await
        .unwrap();
    assert_eq!(again.token(), "first-token");

    // Wait for a lease renewal (an update, which moves the resourceVersion) to have happened.
    let my_leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(me.clone(), "system");
    let acquired = my_leases.get(LEASE_NAME).await.unwrap().resource_version();
    let renewed = move |l: Option<&k8s_openapi::api::coordination::v1::Lease>| {
        l.is_some_and(|l| l.resource_version() != acquired)
    };
    tokio::time::timeout(LIVENESS, await_condition(my_leases, LEASE_NAME, renewed))
        .await
        .unwrap()
        .unwrap();
    shutdown.cancel();

    let used: BTreeSet<(String, String, String)> = server
        .requests()
        .by_client("operator")
        .keys()
        .map(|(verb, resource)| {
            (
                group_of(resource).to_string(),
                resource.clone(),
                verb.as_str().to_string(),
            )
        })
        .collect();
    let grants = granted();
    let granted: BTreeSet<_> = grants.keys().cloned().collect();
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        missing.is_empty(),
        "the code uses verbs the RBAC does not grant: {missing:?}"
    );
    assert!(
        unused.is_empty(),
        "the RBAC grants verbs the code never uses: {unused:?}"
    );
    let across: Vec<_> = cluster_wide
        .lock()
        .unwrap()
        .iter()
        .map(|(verb, resource)| (group_of(resource).to_owned(), resource.clone(), verb.clone()))
        .filter(|grant| grants.get(grant) != Some(&true))
        .collect();
    assert!(
        across.is_empty(),
        "the code asks across namespaces for what only Roles grant: {across:?}"
    );
    assert!(!cluster_wide.lock().unwrap().is_empty(), "the recording saw requests");
}
