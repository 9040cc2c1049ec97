//! The reconciler end to end: a kube `Controller` running `reconcile` against
//! egress-kube-testserver (real HTTP, real watches, the CRD's schema and CEL rules) with the
//! conformance crate's in-memory reference provider and scripted health verdicts.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_api::{ANNOTATION_SKIP_CLEANUP, ANNOTATION_SPEC_HASH, FINALIZER, Phase, Placement, Proxy, ProxySpec};
use egress_conformance::BackendHooks;
use egress_conformance::memory::{CALL_BUDGET, MemoryBackend, MemoryProvider, MemoryTarget};
use egress_controller::proxy::context::Context;
use egress_controller::proxy::controller::{self, ControllerConfig};
use egress_controller::proxy::decide::Timings;
use egress_controller::proxy::health::HealthVerdicts;
use egress_controller::proxy::status::Verdict;
use egress_kube_testserver::TestServer;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "crawl";
const LIVENESS: Duration = Duration::from_secs(30);

/// Scripted verdicts; counts how often each Proxy's verdict was read (once per pass).
struct ScriptedHealth {
    verdicts: Mutex<HashMap<(String, String), Verdict>>,
    /// Verdict reads per Proxy name, one per pass; tests wait on it instead of sleeping.
    passes: tokio::sync::watch::Sender<HashMap<String, usize>>,
}

impl Default for ScriptedHealth {
    fn default() -> Self {
        Self {
            verdicts: Mutex::default(),
            passes: tokio::sync::watch::channel(HashMap::new()).0,
        }
    }
}

impl HealthVerdicts for ScriptedHealth {
    fn verdict(&self, namespace: &str, name: &str) -> Option<Verdict> {
        self.passes
            .send_modify(|m| *m.entry(name.to_string()).or_default() += 1);
        self.verdicts
            .lock()
            .unwrap()
            .get(&(namespace.to_string(), name.to_string()))
            .copied()
    }
}

impl ScriptedHealth {
    fn passes(&self, name: &str) -> usize {
        self.passes.borrow().get(name).copied().unwrap_or(0)
    }

    /// Waits until `name` has had `n` passes.
    async fn wait_passes(&self, name: &str, n: usize) {
        let mut rx = self.passes.subscribe();
        tokio::time::timeout(LIVENESS, rx.wait_for(|m| m.get(name).copied().unwrap_or(0) >= n))
            .await
            .expect("passes keep coming")
            .unwrap();
    }
}

struct Harness {
    server: Arc<TestServer>,
    backend: MemoryBackend,
    health: Arc<ScriptedHealth>,
    /// Health events: a Proxy whose verdict changed.
    events: futures::channel::mpsc::UnboundedSender<ObjectRef<Proxy>>,
    shutdown: CancellationToken,
    api: Api<Proxy>,
}

impl Harness {
    /// Scripts a verdict and tells the controller, as the health engine does.
    fn verdict(&self, name: &str, healthy: bool, latency_millis: u64) {
        self.health.verdicts.lock().unwrap().insert(
            (NS.into(), name.into()),
            Verdict {
                healthy,
                latency: std::time::Duration::from_millis(latency_millis),
                auth_refused: false,
            },
        );
        self.events.unbounded_send(ObjectRef::new(name).within(NS)).unwrap();
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start() -> Harness {
    start_with(common::fast_timings()).await
}

/// Timings where nothing comes back by itself for an hour: only events can drive a pass.
fn event_driven() -> Timings {
    Timings {
        drift_poll: Duration::from_secs(3600),
        ..common::fast_timings()
    }
}

async fn start_with(timings: Timings) -> Harness {
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .namespace(NS)
        .start()
        .await
        .unwrap();
    start_on(Arc::new(server), MemoryBackend::new(), timings, CALL_BUDGET).await
}

/// The reconciler over `server`, with entry `mem` on `backend`, whose calls each give up after
/// `call_budget`.
async fn start_on(server: Arc<TestServer>, backend: MemoryBackend, timings: Timings, call_budget: Duration) -> Harness {
    let client = server.client().unwrap();
    let providers = common::memory_providers_with_budget(&[("mem", &backend)], call_budget);
    let health = Arc::new(ScriptedHealth::default());
    let shutdown = CancellationToken::new();
    let ctx = Arc::new(Context::new(
        client.clone(),
        providers,
        health.clone(),
        timings,
        None,
        shutdown.clone(),
    ));
    let (events, health_events) = futures::channel::mpsc::unbounded();
    let (cache, keep_cache) = egress_controller::proxy_cache::proxy_cache(
        client.clone(),
        &egress_api::served::Namespaces::All,
        shutdown.clone(),
    );
    tokio::spawn(keep_cache);
    let run = controller::run(ctx, ControllerConfig::default(), cache, health_events, shutdown.clone());
    tokio::spawn(run);
    Harness {
        server,
        backend,
        health,
        events,
        shutdown,
        api: Api::namespaced(client, NS),
    }
}

fn proxy(name: &str, zone: &str) -> Proxy {
    Proxy::new(
        name,
        ProxySpec {
            provider: "mem".into(),
            placement: Some(Placement {
                zone: zone.into(),
                machine_type: "small".into(),
                image: "debian-13".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
}

fn phase_is(phase: Phase) -> impl Fn(Option<&Proxy>) -> bool {
    move |p: Option<&Proxy>| p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase) == Some(phase)
}

async fn wait_for(h: &Harness, name: &str, phase: Phase) -> Proxy {
    tokio::time::timeout(LIVENESS, await_condition(h.api.clone(), name, phase_is(phase)))
        .await
        .unwrap_or_else(|_| panic!("{name} did not reach {phase:?}"))
        .unwrap()
        .unwrap()
}

/// Waits for an Event with this reason (Events are published after the status is written).
async fn wait_for_event(h: &Harness, reason: &str) {
    use futures::TryStreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(h.server.client().unwrap(), NS);
    let mut stream = Box::pin(watcher(events, watcher::Config::default()).applied_objects());
    tokio::time::timeout(LIVENESS, async {
        while let Some(e) = stream.try_next().await.unwrap() {
            if e.reason.as_deref() == Some(reason) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {reason} event"));
}

/// Waits until the Proxy runs an instance built from a spec hash other than `old_hash`.
async fn wait_replaced(h: &Harness, name: &str, old_hash: &str) -> Proxy {
    let replaced = |p: Option<&Proxy>| {
        p.is_some_and(|p| {
            p.annotations().get(ANNOTATION_SPEC_HASH).map(String::as_str) != Some(old_hash)
                && p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running)
        })
    };
    tokio::time::timeout(LIVENESS, await_condition(h.api.clone(), name, replaced))
        .await
        .expect("the instance is replaced")
        .unwrap()
        .unwrap()
}

async fn live_instances(h: &Harness) -> usize {
    h.backend
        .inventory()
        .await
        .unwrap()
        .iter()
        .filter(|o| o.kind == "instance")
        .count()
}

#[tokio::test]
async fn a_managed_proxy_becomes_ready_and_deletion_releases_it() {
    let h = start().await;
    h.api
        .create(&PostParams::default(), &proxy("p1", "zone-a"))
        .await
        .unwrap();
    let running = wait_for(&h, "p1", Phase::Running).await;
    let status = running.status.clone().unwrap();
    assert!(!status.ip.is_empty() && !status.provider_id.is_empty(), "{status:?}");
    assert_eq!(running.finalizers(), [FINALIZER]);
    assert!(running.annotations().contains_key(ANNOTATION_SPEC_HASH));
    assert_eq!(running.condition("Provisioned").unwrap().reason, "Running");
    assert_eq!(live_instances(&h).await, 1);

    h.verdict("p1", true, 9);
    let ready = wait_for(&h, "p1", Phase::Ready).await;
    assert_eq!(ready.status.as_ref().unwrap().latency_millis, Some(9));

    // What `kubectl describe` shows.
    wait_for_event(&h, "Created").await;
    wait_for_event(&h, "Ready").await;

    let uid = ready.uid().unwrap();
    h.api.delete("p1", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        LIVENESS,
        await_condition(h.api.clone(), "p1", conditions::is_deleted(&uid)),
    )
    .await
    .expect("the finalizer is released")
    .unwrap();
    assert_eq!(live_instances(&h).await, 0, "the instance went before the finalizer");
}

#[tokio::test]
async fn skip_cleanup_releases_the_proxy_and_leaves_the_instance() {
    let h = start().await;
    h.api
        .create(&PostParams::default(), &proxy("p2", "zone-a"))
        .await
        .unwrap();
    let running = wait_for(&h, "p2", Phase::Running).await;
    let annotate = Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_SKIP_CLEANUP: "true"}}}));
    h.api.patch("p2", &PatchParams::default(), &annotate).await.unwrap();
    let removes_before = h
        .backend
        .call_log()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.kind.0 == "remove")
        .count();
    h.api.delete("p2", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        LIVENESS,
        await_condition(h.api.clone(), "p2", conditions::is_deleted(&running.uid().unwrap())),
    )
    .await
    .expect("the finalizer is released")
    .unwrap();
    let removes_after = h
        .backend
        .call_log()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.kind.0 == "remove")
        .count();
    assert_eq!(removes_after, removes_before, "no provider delete");
    assert_eq!(live_instances(&h).await, 1, "the instance is abandoned, not deleted");
    wait_for_event(&h, "SkipCleanup").await;
}

#[tokio::test]
async fn a_permanent_error_latches_until_the_spec_changes() {
    let h = start().await;
    h.api
        .create(&PostParams::default(), &proxy("p3", "zone-z"))
        .await
        .unwrap();
    let failed = wait_for(&h, "p3", Phase::Failed).await;
    let provisioned = failed.condition("Provisioned").unwrap();
    assert_eq!(provisioned.reason, "PermanentError");
    assert!(provisioned.message.contains("zone"), "{}", provisioned.message);
    assert_eq!(provisioned.observed_generation, failed.metadata.generation);
    let inserts = h
        .backend
        .call_log()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.kind.0 == "insert")
        .count();
    assert_eq!(inserts, 0, "a refused placement never reaches the backend");
    let fix = Patch::Merge(json!({"spec": {"placement": {"zone": "zone-a"}}}));
    h.api.patch("p3", &PatchParams::default(), &fix).await.unwrap();
    wait_for(&h, "p3", Phase::Running).await;
}

#[tokio::test]
async fn steady_state_writes_nothing() {
    let h = start().await;
    h.api
        .create(&PostParams::default(), &proxy("p4", "zone-a"))
        .await
        .unwrap();
    h.verdict("p4", true, 4);
    wait_for(&h, "p4", Phase::Ready).await;
    // Let the first drift passes settle, then count: several more passes must write nothing.
    let settle = h.health.passes("p4") + 2;
    h.health.wait_passes("p4", settle).await;
    h.server.requests().reset();
    let from = h.health.passes("p4");
    h.health.wait_passes("p4", from + 5).await;
    assert_eq!(h.server.requests().writes("proxies"), 0);
    assert_eq!(h.server.requests().writes("proxies/status"), 0);
}

#[tokio::test]
async fn a_spec_change_replaces_the_instance_only_after_the_old_one_is_gone() {
    let h = start().await;
    h.api
        .create(&PostParams::default(), &proxy("p5", "zone-a"))
        .await
        .unwrap();
    let before = wait_for(&h, "p5", Phase::Running).await;
    let old_hash = before.annotations()[ANNOTATION_SPEC_HASH].clone();
    let calls_before = h.backend.call_log().await.unwrap().len();
    common::change_port(&h.api, "p5").await;
    let after = wait_replaced(&h, "p5", &old_hash).await;
    assert_eq!(
        after.status.as_ref().unwrap().provider_id,
        before.status.as_ref().unwrap().provider_id,
        "the same name"
    );
    let calls: Vec<String> = h.backend.call_log().await.unwrap()[calls_before..]
        .iter()
        .map(|c| c.kind.0.to_string())
        .collect();
    let removed = calls
        .iter()
        .position(|k| k == "remove")
        .expect("the old instance was removed");
    let inserted = calls
        .iter()
        .position(|k| k == "insert")
        .expect("a new instance was created");
    assert!(removed < inserted, "remove before insert: {calls:?}");
    assert_eq!(live_instances(&h).await, 1);
}

#[tokio::test]
async fn a_health_event_updates_the_proxy_without_waiting_for_the_drift_poll() {
    let h = start_with(event_driven()).await;
    h.api
        .create(&PostParams::default(), &proxy("p6", "zone-a"))
        .await
        .unwrap();
    wait_for(&h, "p6", Phase::Running).await;
    // Let p6's own follow-up passes (its status writes trigger one) finish: bring a second Proxy
    // all the way up meanwhile. With the drift poll an hour away, only an event can bring p6's
    // next pass.
    h.api
        .create(&PostParams::default(), &proxy("p6b", "zone-a"))
        .await
        .unwrap();
    wait_for(&h, "p6b", Phase::Running).await;
    let before = h.health.passes("p6");
    h.verdict("p6", true, 3);
    wait_for(&h, "p6", Phase::Ready).await;
    assert!(h.health.passes("p6") > before, "the event brought a pass");
    h.verdict("p6", false, 3);
    wait_for(&h, "p6", Phase::Unhealthy).await;
}

#[tokio::test]
async fn a_changed_cloud_init_secret_replaces_the_instance() {
    use k8s_openapi::api::core::v1::Secret;
    let h = start_with(event_driven()).await;
    let secrets: Api<Secret> = Api::namespaced(h.server.client().unwrap(), NS);
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "ud",
        "labels": {"crawl.example.com/cloud-init": "true"}}, "stringData": {"userdata": "#cloud-config\n# v1\n"}}))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let mut p = proxy("p7", "zone-a");
    p.spec.cloud_init = Some(egress_api::CloudInit {
        inline: None,
        secret_ref: Some(egress_api::SecretRef {
            name: "ud".into(),
            key: "userdata".into(),
        }),
    });
    h.api.create(&PostParams::default(), &p).await.unwrap();
    let before = wait_for(&h, "p7", Phase::Running).await;
    let old_hash = before.annotations()[ANNOTATION_SPEC_HASH].clone();
    let delivered = || async {
        h.backend
            .inventory()
            .await
            .unwrap()
            .into_iter()
            .find(|o| o.kind == "instance")
            .and_then(|o| o.user_data)
    };
    assert_eq!(delivered().await.as_deref(), Some(b"#cloud-config\n# v1\n".as_slice()));
    // Only the Secret watch can notice this: the drift poll is an hour away.
    let change = Patch::Merge(json!({"stringData": {"userdata": "#cloud-config\n# v2\n"}}));
    secrets.patch("ud", &PatchParams::default(), &change).await.unwrap();
    let replaced = wait_replaced(&h, "p7", &old_hash).await;
    assert_eq!(delivered().await.as_deref(), Some(b"#cloud-config\n# v2\n".as_slice()));
    // Bytes that are not text (gzip user-data): delivered unchanged.
    let gzip: &[u8] = &[0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe, 0x80, 0x00, 0x0d, 0x0a];
    let binary = Patch::Merge(json!({"data": {"userdata": data_encoding::BASE64.encode(gzip)}}));
    secrets.patch("ud", &PatchParams::default(), &binary).await.unwrap();
    wait_replaced(&h, "p7", &replaced.annotations()[ANNOTATION_SPEC_HASH]).await;
    assert_eq!(delivered().await.as_deref(), Some(gzip));
}

/// Item 54: an instance that answers polls without an address for a while (a guest-agent
/// restart) keeps its address on the Proxy, which stays Running, within the grace period.
#[tokio::test]
async fn a_running_instance_that_briefly_loses_its_address_keeps_it() {
    let h = start().await;
    h.api
        .create(&PostParams::default(), &proxy("p11", "zone-a"))
        .await
        .unwrap();
    let running = wait_for(&h, "p11", Phase::Running).await;
    let ip = running.status.as_ref().unwrap().ip.clone();
    let name = egress_provider::name_from_uid(&running.uid().unwrap());
    h.backend.set_address(&name, None).await.unwrap();
    // Three passes that each find the instance without an address.
    let seen = h.health.passes("p11");
    h.health.wait_passes("p11", seen + 3).await;
    let kept = h.api.get("p11").await.unwrap();
    let status = kept.status.as_ref().unwrap();
    assert_eq!((status.ip.as_str(), status.phase), (ip.as_str(), Some(Phase::Running)));
    assert_eq!(kept.condition("Provisioned").unwrap().reason, "Running");
}

/// A provider call that never returns (a host gone silent, a lock never released) ends at the
/// pass's deadline: the pass gives up, Transient, and the next pass creates. Without the
/// deadline the held create would keep its worker, and the Proxy, forever.
#[tokio::test]
async fn a_call_that_outlives_the_pass_deadline_is_abandoned_and_the_next_pass_creates() {
    use egress_conformance::CallKind;
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .namespace(NS)
        .start()
        .await
        .unwrap();
    // A provider that never gives up on a call by itself: only the pass's deadline ends it.
    let timings = Timings {
        pass_deadline: Duration::from_millis(300),
        ..common::fast_timings()
    };
    let h = start_on(
        Arc::new(server),
        MemoryBackend::new(),
        timings,
        Duration::from_secs(3600),
    )
    .await;
    // The first insert is held and never let go.
    let held = h.backend.freeze(CallKind("insert")).await.unwrap();
    h.api
        .create(&PostParams::default(), &proxy("p10", "zone-a"))
        .await
        .unwrap();
    tokio::time::timeout(LIVENESS, held.entered())
        .await
        .expect("the first create reached the backend");
    let running = wait_for(&h, "p10", Phase::Running).await;
    assert!(!running.status.unwrap().provider_id.is_empty());
    let inserts = h
        .backend
        .call_log()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.kind.0 == "insert")
        .count();
    assert!(
        inserts >= 2,
        "the held insert was abandoned and another made: {inserts}"
    );
    assert_eq!(live_instances(&h).await, 1);
}

#[tokio::test]
async fn a_quota_error_waits_and_then_creates() {
    use egress_conformance::{CallKind, Fault, Times};
    let h = start().await;
    h.backend
        .fail(CallKind("insert"), Fault::Quota, Times::Once)
        .await
        .unwrap();
    h.api
        .create(&PostParams::default(), &proxy("p8", "zone-a"))
        .await
        .unwrap();
    let waiting = tokio::time::timeout(
        LIVENESS,
        await_condition(h.api.clone(), "p8", |p: Option<&Proxy>| {
            p.and_then(|p| p.condition("Provisioned"))
                .is_some_and(|c| c.reason == "QuotaExceeded")
        }),
    )
    .await
    .expect("the quota wait shows")
    .unwrap()
    .unwrap();
    assert_eq!(
        waiting.status.as_ref().unwrap().phase,
        Some(Phase::Pending),
        "a quota wait is never Failed"
    );
    wait_for(&h, "p8", Phase::Running).await;
}

#[tokio::test]
async fn a_restart_in_the_middle_of_a_create_makes_no_duplicate() {
    use egress_provider::{OpCtx, Provider};
    let h = start_with(event_driven()).await;
    // The previous operator process created the instance and died before recording its id: the
    // Proxy has no status, and the backend has the instance under the Proxy's name.
    h.shutdown.cancel();
    let created = h
        .api
        .create(&PostParams::default(), &proxy("p9", "zone-a"))
        .await
        .unwrap();
    let uid = created.uid().unwrap();
    let previous = MemoryProvider::new("mem", MemoryTarget::config(&h.backend), h.backend.clone(), vec![]);
    let request = common::mem_request(&uid, NS, "p9");
    previous.create(&OpCtx::background(), &request).await.unwrap();
    let inserts = || async {
        h.backend
            .call_log()
            .await
            .unwrap()
            .iter()
            .filter(|c| c.kind.0 == "insert")
            .count()
    };
    let inserted_before = inserts().await;
    // A new operator process starts on the same cluster and backend.
    let h2 = start_on(h.server.clone(), h.backend.clone(), event_driven(), CALL_BUDGET).await;
    wait_for(&h2, "p9", Phase::Running).await;
    assert_eq!(
        inserts().await,
        inserted_before,
        "the new process's create adopted the instance: no second insert"
    );
    assert_eq!(live_instances(&h2).await, 1);
}

/// The Provisioned condition's reason, once `name` has one.
fn provisioned_reason(p: Option<&Proxy>) -> Option<String> {
    p?.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Provisioned")
        .map(|c| c.reason.clone())
}

/// Nothing but the credential cache drives these passes (no health event, an hour's drift
/// poll, and an External Proxy is never requeued by itself): a change of the Secret's
/// `crawl.example.com/proxies` annotation alone refuses the Proxy and accepts it again.
#[tokio::test]
async fn an_external_proxy_follows_its_credentials_secrets_annotation_alone() {
    use k8s_openapi::api::core::v1::Secret;
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .namespace(NS)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let backend = MemoryBackend::new();
    let (credentials, keep_credentials) = egress_controller::proxy::credentials::credential_cache(
        client.clone(),
        &egress_api::served::Namespaces::All,
        shutdown.clone(),
    );
    tokio::spawn(keep_credentials);
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            common::memory_providers_with_budget(&[("mem", &backend)], CALL_BUDGET),
            Arc::new(ScriptedHealth::default()),
            event_driven(),
            None,
            shutdown.clone(),
        )
        .with_credentials(credentials),
    );
    // Kept open and silent: no health event ever comes.
    let (_silent, health_events) = futures::channel::mpsc::unbounded::<ObjectRef<Proxy>>();
    let (cache, keep_cache) = egress_controller::proxy_cache::proxy_cache(
        client.clone(),
        &egress_api::served::Namespaces::All,
        shutdown.clone(),
    );
    tokio::spawn(keep_cache);
    tokio::spawn(controller::run(
        ctx,
        ControllerConfig::default(),
        cache,
        health_events,
        shutdown.clone(),
    ));

    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let naming = |proxies: &str| {
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "vendor",
                "labels": {egress_api::LABEL_PROXY_CREDENTIALS: "true"},
                "annotations": {egress_api::ANNOTATION_CREDENTIALS_PROXIES: proxies},
            },
            "stringData": {"username": "u", "password": "SENTINEL-pw"},
        })
    };
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(naming("team-b")).unwrap(),
        )
        .await
        .unwrap();
    let external: Proxy = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "ext", "namespace": NS},
        "spec": {
            "mode": "External",
            "endpoint": {"host": "vendor.example", "port": 8080},
            "credentials": {"type": "Secret", "secretRef": {"name": "vendor"}},
        },
    }))
    .unwrap();
    let api: Api<Proxy> = Api::namespaced(client, NS);
    api.create(&PostParams::default(), &external).await.unwrap();
    let wait = |what: &'static str, cond: fn(Option<String>) -> bool| {
        let api = api.clone();
        async move {
            tokio::time::timeout(
                LIVENESS,
                await_condition(api, "ext", move |p: Option<&Proxy>| cond(provisioned_reason(p))),
            )
            .await
            .unwrap_or_else(|_| panic!("ext not {what}"))
            .unwrap();
        }
    };
    let refused = |r: Option<String>| r.as_deref() == Some(egress_api::reasons::CREDENTIALS_ERROR);
    wait("refused", refused).await;
    let patch = |proxies: &str| Patch::Merge(naming(proxies));
    secrets
        .patch("vendor", &PatchParams::default(), &patch("team-b, ext"))
        .await
        .unwrap();
    wait("accepted", |r| r.is_none()).await;
    secrets
        .patch("vendor", &PatchParams::default(), &patch("team-b"))
        .await
        .unwrap();
    wait("refused again", refused).await;
}
