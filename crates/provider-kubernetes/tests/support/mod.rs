//! The kubernetes provider as a conformance target, over `egress-kube-testserver`: the server's
//! request hook serves as the backend hooks (every request of the provider's own client is
//! logged, held, slowed or failed by the suite's rules, with the API's status codes and
//! reasons), a simulated kubelet runs new Pods (phase Running, a Pod IP), and seeding and
//! inspection go through a second client the hooks leave alone.
//!
//! Not covered: a real kubelet and container runtime (the Squid image is never pulled or run),
//! admission (Pod Security is not enforced), and kube's transport under real network failure.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_conformance::hooks::{BackendObject, HookResult, SeedManaged, SeedTime};
use egress_conformance::target::{
    AsyncOps, Budgets, CallKinds, ChildSpans, ClassifyCase, CreateReturn, Credentials, DeleteReturn, GcMark,
    ListPartial, Logging, ProvisioningState, Quota, Timeouts,
};
use egress_conformance::{
    BackendHooks, BuildOptions, CallKind, ConformanceTarget, Fault, Fixtures, Interceptor, NativeState, NotConfigured,
    Profile, SeedSpec, Unsupported,
};
use egress_kube_testserver::{HookVerdict, HookedRequest, TestServer, Verb};
use egress_provider::{
    BoxError, CreateRequest, ErrorClass, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_UID, Op, Placement, Provider,
    ProviderId, name_from_uid,
};
use egress_provider_kubernetes::classify::{CallFailure, classify};
use egress_provider_kubernetes::pod::PodSettings;
use egress_provider_kubernetes::provider::{CALL_BUDGET, KubernetesProvider};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

/// The namespace Proxies (and so Pods) live in.
pub const NAMESPACE: &str = "crawl";
/// The provider's client, as the server's hook tells it apart.
const PROVIDER_CLIENT: &str = "provider";
/// A finalizer that keeps a deleted Pod in its deleting state (H12).
const HOLD: &str = "test.egress/hold";

/// The simulated kubelet's thread: told to stop when dropped.
struct KubeletThread {
    stop: Arc<AtomicBool>,
}

impl KubeletThread {
    /// Starts the kubelet on a thread of its own with its own runtime. The suite's capture is
    /// per thread, so the kubelet's requests (and kube's HTTP spans for them) stay out of what
    /// the cases look at: they are not the provider's.
    fn start(server: &TestServer, held: Arc<AtomicBool>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let config = server.config();
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(client) = kube::Client::try_from(config) {
                    kubelet(client, held, stopped).await;
                }
            });
        });
        Self { stop }
    }
}

impl Drop for KubeletThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The test server, its hook's rules and the simulated kubelet.
#[derive(Clone)]
pub struct KubeBackend {
    pub server: Arc<TestServer>,
    pub interceptor: Interceptor,
    held: Arc<AtomicBool>,
    _kubelet: Arc<KubeletThread>,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend").finish_non_exhaustive()
    }
}

/// The API's answer to a suite fault.
fn verdict(fault: &Fault) -> HookVerdict {
    let fail = |code: u16, message: &str| HookVerdict::Fail {
        code,
        reason: None,
        message: message.to_owned(),
    };
    match fault {
        Fault::NotFound => fail(404, "pods \"x\" not found"),
        Fault::AlreadyExists => fail(409, "pods \"x\" already exists"),
        Fault::Quota => fail(403, "exceeded quota: compute-resources"),
        Fault::RateLimit => fail(429, "too many requests"),
        Fault::Unauthenticated => fail(401, "Unauthorized"),
        Fault::PermissionDenied => fail(403, "pods is forbidden: User cannot create resource"),
        Fault::BadRequest => fail(400, "the request is malformed"),
        Fault::Server5xx => fail(500, "Internal error occurred: etcdserver: request timed out"),
        Fault::Timeout => HookVerdict::Fail {
            code: 504,
            reason: Some("Timeout"),
            message: "the request timed out".to_owned(),
        },
        Fault::ConnectionReset => HookVerdict::Reset,
        Fault::Busy => HookVerdict::Fail {
            code: 409,
            reason: Some("Conflict"),
            message: "the object has been modified".to_owned(),
        },
        Fault::Raw(text) => fail(500, text),
    }
}

/// The suite's name for a request of the provider.
fn kind_of(r: &HookedRequest) -> Option<&'static str> {
    if r.resource != "pods" {
        return None;
    }
    Some(match r.verb {
        Verb::Create => "create",
        Verb::Get => "get",
        Verb::Delete => "delete",
        Verb::List => "list",
        Verb::Patch => "patch",
        _ => return None,
    })
}

impl KubeBackend {
    /// A fresh server with the hook and the kubelet.
    pub async fn new() -> Self {
        let server = Arc::new(
            TestServer::builder()
                .namespace(NAMESPACE)
                .start()
                .await
                .expect("test server"),
        );
        let interceptor = Interceptor::new();
        let hooked = interceptor.clone();
        server.faults().set_hook(Some(Arc::new(move |r: HookedRequest| {
            let interceptor = hooked.clone();
            Box::pin(async move {
                if r.client.as_deref() != Some(PROVIDER_CLIENT) {
                    return HookVerdict::Serve;
                }
                let Some(kind) = kind_of(&r) else {
                    return HookVerdict::Serve;
                };
                let target = r.name.clone().or(r.namespace.clone()).unwrap_or_default();
                match interceptor.enter(CallKind(kind), &target).await {
                    Ok(()) => HookVerdict::Serve,
                    Err(fault) => verdict(&fault),
                }
            })
        })));
        let held = Arc::new(AtomicBool::new(false));
        let kubelet = KubeletThread::start(&server, held.clone());
        Self {
            server,
            interceptor,
            held,
            _kubelet: Arc::new(kubelet),
        }
    }

    /// A client the hooks leave alone.
    fn plain(&self) -> Api<Pod> {
        Api::namespaced(self.server.client().expect("a client"), NAMESPACE)
    }

    async fn patch_status(&self, name: &str, status: serde_json::Value) -> HookResult {
        self.plain()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({ "status": status })),
            )
            .await
            .map(drop)
            .map_err(|_| Unsupported("a pod the server does not hold"))
    }

    /// Sets a Pod's creationTimestamp (the server's test control; no client can write it).
    fn backdate(&self, namespace: &str, name: &str, at: SystemTime) -> HookResult {
        let at = k8s_openapi::jiff::Timestamp::try_from(at)
            .map_err(|_| Unsupported("a creation time the API cannot show"))?
            .round(k8s_openapi::jiff::Unit::Second)
            .map_err(|_| Unsupported("a creation time the API cannot show"))?;
        if self.server.backdate("", "pods", namespace, name, &at.to_string()) {
            Ok(())
        } else {
            Err(Unsupported("a pod the server does not hold"))
        }
    }

    async fn patch(&self, name: &str, patch: serde_json::Value) -> HookResult {
        self.plain()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|_| Unsupported("a pod the server does not hold"))
    }
}

/// Runs every Pod that has no phase yet (unless new Pods are held pending), as a kubelet would:
/// phase Running and an address from 10.42.0.0/16. Each write is conditional on the Pod being as
/// listed, so the kubelet never overwrites what a case wrote in between.
async fn kubelet(client: kube::Client, held: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let next = AtomicU32::new(2);
    while !stop.load(Ordering::SeqCst) {
        if !held.load(Ordering::SeqCst)
            && let Ok(list) = pods.list(&ListParams::default()).await
        {
            for pod in list.items {
                let unset = pod.status.as_ref().and_then(|s| s.phase.as_ref()).is_none();
                let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else {
                    continue;
                };
                if unset && pod.metadata.deletion_timestamp.is_none() {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    let ip = format!("10.42.{}.{}", n / 250, n % 250 + 2);
                    // The resourceVersion read by the list makes the patch conditional: a case
                    // that set the phase since then (CT-C05 seeds an unknown one) gets a 409 for
                    // the kubelet, never its own write undone.
                    let status = serde_json::json!({
                        "metadata": {"resourceVersion": pod.metadata.resource_version},
                        "status": {"phase": "Running", "podIP": ip},
                    });
                    let _ = Api::<Pod>::namespaced(client.clone(), &ns)
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn phase_of(state: &NativeState) -> String {
    match state {
        NativeState::Pending => "Pending".to_owned(),
        NativeState::Running => "Running".to_owned(),
        NativeState::Stopped | NativeState::Terminated => "Failed".to_owned(),
        NativeState::Unknown(raw) => raw.clone(),
    }
}

#[async_trait]
impl BackendHooks for KubeBackend {
    fn interceptor(&self) -> Option<&Interceptor> {
        Some(&self.interceptor)
    }

    async fn seed(&self, spec: SeedSpec) -> HookResult {
        // An API object always has a valid creationTimestamp: none and garbage cannot be seeded.
        let SeedTime::Valid(created) = spec.created_at else {
            return Err(Unsupported(
                "H01 seed without a valid creation time (the API always has one)",
            ));
        };
        let mut labels = BTreeMap::new();
        match &spec.managed {
            SeedManaged::Yes => {
                labels.insert(LABEL_MANAGED.to_owned(), "true".to_owned());
            }
            SeedManaged::No => {}
            SeedManaged::Other(v) => {
                labels.insert(LABEL_MANAGED.to_owned(), v.clone());
            }
        }
        if let Some(uid) = &spec.uid {
            labels.insert(LABEL_UID.to_owned(), uid.clone());
        }
        let namespace = spec.location.clone().unwrap_or_else(|| NAMESPACE.to_owned());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": spec.name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "squid", "image": "ubuntu/squid:6.6-24.04_edge"}]},
        }))
        .expect("a pod");
        let api: Api<Pod> = Api::namespaced(self.server.client().expect("a client"), &namespace);
        api.create(&PostParams::default(), &pod)
            .await
            .map_err(|_| Unsupported("H01 seed in a namespace the server does not have"))?;
        let mut status = serde_json::json!({"phase": phase_of(&spec.state)});
        if let Some(ip) = spec.ip {
            status["podIP"] = serde_json::json!(ip.to_string());
        }
        api.patch_status(
            &spec.name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "status": status })),
        )
        .await
        .map_err(|_| Unsupported("H01 seed"))?;
        self.backdate(&namespace, &spec.name, created)
    }

    async fn rewrite_marks(&self, name: &str, uid: &str, created_at: SystemTime) -> HookResult {
        self.patch(name, serde_json::json!({"metadata": {"labels": {LABEL_UID: uid}}}))
            .await?;
        self.backdate(NAMESPACE, name, created_at)
    }

    async fn set_native_state(&self, name: &str, state: NativeState) -> HookResult {
        self.patch_status(name, serde_json::json!({"phase": phase_of(&state)}))
            .await
    }

    async fn hold_new_instances_pending(&self, hold: bool) -> HookResult {
        self.held.store(hold, Ordering::SeqCst);
        Ok(())
    }

    async fn set_address(&self, name: &str, ip: Option<IpAddr>) -> HookResult {
        self.patch_status(name, serde_json::json!({"podIP": ip.map(|ip| ip.to_string())}))
            .await
    }

    async fn strip_marks(&self, name: &str) -> HookResult {
        self.patch(
            name,
            serde_json::json!({"metadata": {"labels": {LABEL_MANAGED: null, LABEL_UID: null}}}),
        )
        .await
    }

    async fn inventory(&self) -> HookResult<Vec<BackendObject>> {
        let pods: Api<Pod> = Api::all(self.server.client().expect("a client"));
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|_| Unsupported("H05 inventory"))?;
        Ok(list
            .items
            .into_iter()
            .map(|pod| {
                let labels = pod.metadata.labels.unwrap_or_default();
                let marks = [LABEL_MANAGED, LABEL_UID, LABEL_INSTALLATION]
                    .into_iter()
                    .filter_map(|k| labels.get(k).map(|v| (k.to_owned(), v.clone())))
                    .collect();
                BackendObject {
                    kind: "instance".to_owned(),
                    owner: pod.metadata.name.unwrap_or_default(),
                    marks,
                    user_data: None,
                }
            })
            .collect())
    }

    async fn begin_backend_delete(&self, name: &str) -> HookResult {
        // A finalizer holds the Pod in its deleting state (a deletionTimestamp) until released.
        self.patch(name, serde_json::json!({"metadata": {"finalizers": [HOLD]}}))
            .await?;
        self.plain()
            .delete(name, &kube::api::DeleteParams::default())
            .await
            .map(drop)
            .map_err(|_| Unsupported("H12 begin_backend_delete"))
    }

    async fn finish_delete(&self, name: &str) -> HookResult {
        match self.plain().get_opt(name).await {
            Ok(Some(_)) => {
                self.patch(name, serde_json::json!({"metadata": {"finalizers": []}}))
                    .await
            }
            Ok(None) => Ok(()),
            Err(_) => Err(Unsupported("H12 finish_delete")),
        }
    }
}

/// The kubernetes provider over the test server.
#[derive(Clone, Copy, Debug)]
pub struct KubeTarget;

/// A request for Proxy `uid` in namespace `location`.
pub fn request_in(uid: &str, location: &str) -> CreateRequest {
    CreateRequest {
        name: name_from_uid(uid),
        uid: uid.to_owned(),
        namespace: location.to_owned(),
        proxy_name: format!("proxy-{}", &name_from_uid(uid)[6..]),
        placement: Placement::default(),
        cloud_init: b"#cloud-config\n".to_vec(),
        port: 3128,
        installation: None,
        credentials: None,
        spread_group: None,
    }
}

#[async_trait]
impl ConformanceTarget for KubeTarget {
    type Backend = KubeBackend;

    async fn backend(&self) -> Result<KubeBackend, NotConfigured> {
        Ok(KubeBackend::new().await)
    }

    fn build(&self, backend: &KubeBackend, options: &BuildOptions) -> Result<Arc<dyn Provider>, BoxError> {
        let client = backend.server.client_named(PROVIDER_CLIENT)?;
        Ok(Arc::new(KubernetesProvider::new(
            &options.entry_name,
            client,
            backend.server.url(),
            PodSettings::default(),
        )))
    }

    fn profile(&self) -> Profile {
        Profile {
            create_return: CreateReturn::Submit,
            delete_return: DeleteReturn::ReturnsEarly,
            gc_mark: GcMark::NativeLabels,
            list_partial: ListPartial::FailWhole,
            // A 403 is an RBAC denial or an exhausted quota alike: Permanent (§4.10).
            quota: Quota::Absent(ErrorClass::Permanent),
            async_ops: AsyncOps::None,
            provisioning_state: ProvisioningState::Native,
            timeouts: Timeouts::PerCall,
            logging: Logging::OutcomeOnly,
            // kube's own HTTP client spans (target kube_client), under the caller's span. They
            // are not gated by the client itself: the operator exports kube_client spans only
            // inside a span of its own (tests/otlp.rs).
            child_spans: ChildSpans::SdkInstrumentation,
            credentials: Credentials::WorkloadIdentity,
            ip_discovered: false,
            delivers_cloud_init: false,
            adoption_guard: true,
            key_value_marks: true,
            create_not_found_class: ErrorClass::Transient,
            readiness_budget: Duration::from_secs(10),
            delete_budget: Duration::from_secs(10),
        }
    }

    fn valid_request(&self, uid: &str) -> CreateRequest {
        request_in(uid, NAMESPACE)
    }

    fn request_in(&self, uid: &str, location: &str) -> CreateRequest {
        request_in(uid, location)
    }

    fn id_for(&self, name: &str) -> ProviderId {
        ProviderId::new(format!("{NAMESPACE}/{name}"))
    }

    fn fixtures(&self) -> Fixtures {
        let api = |reason: &'static str, code: u16, op: Op| classify(CallFailure::Api { reason, code }, op);
        let mut classify_cases = ClassifyCase::rows([
            ("404 in get", api("NotFound", 404, Op::Get), ErrorClass::NotFound),
            ("404 in create", api("NotFound", 404, Op::Create), ErrorClass::Transient),
            (
                "403 (RBAC or quota)",
                api("Forbidden", 403, Op::Create),
                ErrorClass::Permanent,
            ),
            ("422", api("Invalid", 422, Op::Create), ErrorClass::Permanent),
            ("401", api("Unauthorized", 401, Op::Get), ErrorClass::Permanent),
            ("429", api("TooManyRequests", 429, Op::Create), ErrorClass::Transient),
            ("500", api("InternalError", 500, Op::Get), ErrorClass::Transient),
            ("504", api("Timeout", 504, Op::Get), ErrorClass::Transient),
            (
                "no answer",
                classify(CallFailure::Transport, Op::Get),
                ErrorClass::Transient,
            ),
        ]);
        classify_cases.push(ClassifyCase::not_a_backend_error(
            "a bare error, not from the API",
            &std::fmt::Error,
        ));
        let kinds = |names: &[&'static str]| names.iter().map(|n| CallKind(n)).collect::<Vec<_>>();
        Fixtures {
            malformed_ids: ["", "proxy-x", "crawl/", "/proxy-x", "crawl/a/b"]
                .into_iter()
                .map(ProviderId::from)
                .collect(),
            id_in_unconfigured_location: None,
            invalid_placements: Vec::new(),
            classify_cases,
            check_targets: vec!["apiserver".to_owned()],
            check_faults: vec![
                (
                    Fault::PermissionDenied,
                    "apiserver".into(),
                    egress_provider::REASON_FORBIDDEN,
                ),
                (
                    Fault::Unauthenticated,
                    "apiserver".into(),
                    egress_provider::REASON_UNAUTHORIZED,
                ),
                (Fault::Server5xx, "apiserver".into(), egress_provider::REASON_API_ERROR),
                (
                    Fault::ConnectionReset,
                    "apiserver".into(),
                    egress_provider::REASON_UNREACHABLE,
                ),
            ],
            locations: vec![NAMESPACE.to_owned()],
            secondary_kinds: Vec::new(),
            shared_kinds: Vec::new(),
            calls: CallKinds {
                create_steps: kinds(&["create"]),
                create_instance: CallKind("create"),
                get: kinds(&["get"]),
                get_discovery: Vec::new(),
                delete_frees_name: CallKind("delete"),
                delete: kinds(&["delete"]),
                list: CallKind("list"),
                probe: Some(CallKind("list")),
            },
            budgets: Some(Budgets { get: CALL_BUDGET }),
            insecure_switch: None,
        }
    }
}
