//! Taking over a fleet the Go operator left running: the in-memory API server holds what the Go
//! operator wrote (Proxies with its spec-hash annotation, finalizer, status and conditions; its
//! ProviderHealth objects, one of them for an entry no longer configured), and the instances
//! run in three backends, laid down as Go made them: the in-memory reference backend, the
//! libvirt fake with a Go kvm domain (its name, metadata namespace and document), and Squid
//! Pods with the Go kubernetes provider's labels and no owner. The operator starts in this
//! process (so every provider call can be counted and the backends' call logs read), and:
//!
//! - no provider create or delete is made, and no backend is asked to make or remove anything;
//! - every Proxy is adopted (an `Adopted` event, this operator's hash, Go's kept) and is Ready
//!   with the IP and providerID Go recorded;
//! - every Go instance, which carries no installation mark, is marked with the operator's
//!   installation (an `InstallationMarked` event), in the form each backend keeps marks; the
//!   operator runs with the default installation id, derived from the cluster and its namespace,
//!   as someone switching without the flag would;
//! - each Proxy can be leased at once, at its old IP;
//! - the ProviderHealth objects of configured entries are kept and updated, the stale one
//!   removed;
//! - a spec change afterwards replaces that one Proxy, and only it;
//! - its kvm domain, paused by QEMU on a disk error, is kept through two passes; paused after
//!   a crash, it is replaced (review M1 at the reconciler).
//!
//! What the fakes do not cover: the kvm host is the libvirt fake (the Go domain on a real
//! hypervisor is `provider-kvm`'s `compat.rs`), and Pods never run (the test server is no
//! kubelet), so their status is written as a kubelet would.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{PATIENCE, wait_for_proxy};
use egress_api::{ANNOTATION_PREVIOUS_SPEC_HASH, ANNOTATION_SPEC_HASH, Phase, ProviderHealth, Proxy};
use egress_conformance::memory::{INSERT, LOOKUP, MemoryBackend, MemoryProvider, MemoryTarget, REMOVE};
use egress_conformance::{BackendHooks as _, SeedSpec};
use egress_controller::proxy::health::HealthVerdicts;
use egress_controller::proxy::status::Verdict;
use egress_kube_testserver::Verb;
use egress_libvirt::fake::{FakeHost, FakeVolume, GoKvmDomain};
use egress_libvirt::host::{Address, AddressSource, DomainState, Host, Interface, PauseReason};
use egress_provider::config::{ProviderConfig, validators};
use egress_provider::{
    BoxError, Checker, CreateRequest, Instance, OpCtx, Provider, ProviderError, ProviderId, ProviderType, Registry,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::{Value, json};

const NS: &str = "default";
/// The Go operator's finalizer, as this operator names it (docs/migrating-from-go.md, step 3).
const FINALIZER: &str = egress_api::FINALIZER;
/// A spec-hash value of the Go operator's form (no `v1:` prefix).
const GO_HASH: &str = "9b2f6c0d4e8a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c";
/// When the Go operator last wrote a condition, made the kvm domain or checked a provider: a
/// day before this run, whatever the machine's clock says.
static GO_TIME: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let day_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24);
    jiff::Timestamp::from_second(day_ago.as_second()).unwrap().to_string()
});
const TOKEN: &str = "crawler-token-for-the-takeover-test";
/// The Go kvm provider's pool, and the image key its cached base was named after.
const POOL: &str = "default";

/// One backend's Proxy: its name, provider entry, spec fields and the address Go recorded.
struct Member {
    proxy: &'static str,
    entry: &'static str,
    backend: &'static str,
    spec: Value,
    ip: &'static str,
}

fn members() -> [Member; 3] {
    [
        Member {
            proxy: "ref-1",
            entry: "reference",
            backend: "reference",
            spec: json!({"placement": {"zone": "zone-a", "machineType": "small", "image": "debian-13"}}),
            ip: "10.20.0.5",
        },
        Member {
            proxy: "kvm-1",
            entry: "kvm-home",
            backend: "kvm",
            spec: json!({
                "placement": {"zone": "beelink", "machineType": "small", "image": "debian-13"},
                "port": 3128,
                "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"},
            }),
            ip: "192.168.1.50",
        },
        Member {
            proxy: "pods-1",
            entry: "kubernetes",
            backend: "pods",
            spec: json!({}),
            ip: "10.244.1.7",
        },
    ]
}

const PROVIDERS_YAML: &str = "\
providers:
  - name: reference
    type: reference
  - name: kvm-home
    type: kvm
    kvm:
      sshKeyFile: /etc/proxy-operator/kvm/id_ed25519
      knownHostsFile: /etc/proxy-operator/kvm/known_hosts
      images:
        debian-13:
          url: https://cloud.debian.org/images/cloud/trixie/latest/debian-13-generic-amd64.qcow2
      machineTypes:
        small: {vcpus: 1, memoryMiB: 1024}
      hosts:
        - name: beelink
          address: beelink:22
          user: novakj
          bridge: br0
  - name: kubernetes
    type: kubernetes
";

/// Create and delete calls that reached one provider.
#[derive(Debug, Default)]
struct Calls {
    creates: AtomicUsize,
    deletes: AtomicUsize,
    /// Reads, to know the operator has looked at the instances (reconciles).
    gets: AtomicUsize,
    /// Lists, to know the orphan collector has swept (it lists, then deletes).
    lists: AtomicUsize,
    /// Installation marks written on the Go instances.
    marks: AtomicUsize,
}

impl Calls {
    /// (creates, deletes).
    fn seen(&self) -> (usize, usize) {
        (self.creates.load(Ordering::SeqCst), self.deletes.load(Ordering::SeqCst))
    }
}

/// A provider whose create and delete calls are counted; everything else passes through.
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn Provider>,
    calls: Arc<Calls>,
}

#[async_trait]
impl Provider for Counted {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        self.calls.creates.fetch_add(1, Ordering::SeqCst);
        self.inner.create(cx, req).await
    }
    async fn get(&self, cx: &OpCtx, id: &ProviderId) -> Result<Instance, ProviderError> {
        self.calls.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(cx, id).await
    }
    async fn delete(&self, cx: &OpCtx, id: &ProviderId) -> Result<(), ProviderError> {
        self.calls.deletes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(cx, id).await
    }
    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        self.calls.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list_by_tag(cx).await
    }
    async fn mark_installation(&self, cx: &OpCtx, id: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        self.calls.marks.fetch_add(1, Ordering::SeqCst);
        self.inner.mark_installation(cx, id, installation).await
    }
    fn checker(&self) -> Option<Arc<dyn Checker>> {
        self.inner.checker()
    }
}

/// Every probed Proxy is healthy (nothing listens at the instances' addresses).
struct AllHealthy;

impl HealthVerdicts for AllHealthy {
    fn verdict(&self, _namespace: &str, _name: &str) -> Option<Verdict> {
        Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(9),
            auth_refused: false,
        })
    }
}

/// The backends and the counters, shared by the registry's constructors and the test.
struct Backends {
    memory: MemoryBackend,
    host: FakeHost,
    client: kube::Client,
    api_host: String,
    calls: BTreeMap<&'static str, Arc<Calls>>,
}

impl Backends {
    fn registry(self: &Arc<Self>) -> Registry {
        let counted = |entry: &str, inner: Arc<dyn Provider>, calls: &BTreeMap<&str, Arc<Calls>>| {
            let calls = calls.get(entry).expect("a counter per entry").clone();
            Ok::<Arc<dyn Provider>, BoxError>(Arc::new(Counted { inner, calls }))
        };
        let (a, b, c) = (self.clone(), self.clone(), self.clone());
        Registry::new()
            .with(ProviderType::new(
                "reference",
                validators::none,
                move |entry: &ProviderConfig| {
                    let p = MemoryProvider::new(&entry.name, MemoryTarget::config(&a.memory), a.memory.clone(), vec![]);
                    counted(&entry.name, Arc::new(p), &a.calls)
                },
            ))
            .with(ProviderType::with_block::<egress_libvirt::KvmConfig>(
                "kvm",
                move |entry: &ProviderConfig| {
                    let cfg = entry.block()?.ok_or("kvm block is required")?;
                    let hosts: Vec<Box<dyn Host>> = vec![Box::new(b.host.clone())];
                    let p = egress_provider_kvm::new(&entry.name, cfg, hosts)?;
                    counted(&entry.name, Arc::new(p), &b.calls)
                },
            ))
            .with(
                ProviderType::with_block::<egress_provider_kubernetes::KubernetesConfig>(
                    "kubernetes",
                    move |entry: &ProviderConfig| {
                        let p = egress_provider_kubernetes::KubernetesProvider::new(
                            &entry.name,
                            c.client.clone(),
                            c.api_host.clone(),
                            Default::default(),
                        );
                        counted(&entry.name, Arc::new(p), &c.calls)
                    },
                ),
            )
    }
}

/// The address the discovery API is served on, from the operator's log.
#[derive(Clone, Default)]
struct DiscoveryAddress(Arc<Mutex<Option<tokio::sync::oneshot::Sender<String>>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for DiscoveryAddress {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            message: String,
            address: String,
        }
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                match field.name() {
                    "message" => self.message = format!("{value:?}"),
                    "address" => self.address = format!("{value:?}"),
                    _ => {}
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message == "Serving the discovery API"
            && let Some(tx) = self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
        {
            let _ = tx.send(fields.address);
        }
    }
}

/// The Go state of one Proxy: created, then its status written as the Go operator left it.
async fn go_proxy(proxies: &Api<Proxy>, m: &Member) -> Proxy {
    let mut spec = json!({"mode": "Managed", "provider": m.entry, "attributes": {"backend": m.backend}});
    for (k, v) in m.spec.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let proxy: Proxy = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {
            "name": m.proxy,
            "namespace": NS,
            "finalizers": [FINALIZER],
            "annotations": {ANNOTATION_SPEC_HASH: GO_HASH},
        },
        "spec": spec,
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &proxy).await.unwrap()
}

fn go_status(m: &Member, provider_id: &str, generation: i64) -> Value {
    json!({"status": {
        "phase": "Ready",
        "ip": m.ip,
        "providerID": provider_id,
        "latencyMillis": 12,
        "conditions": [
            {"type": "Provisioned", "status": "True", "reason": "Running", "message": "instance is running",
             "observedGeneration": generation, "lastTransitionTime": GO_TIME.as_str()},
            {"type": "Healthy", "status": "True", "reason": "ProbeSucceeded", "message": "CONNECT succeeded",
             "observedGeneration": generation, "lastTransitionTime": GO_TIME.as_str()},
        ],
    }})
}

/// Go's kvm domain of Proxy `uid` on the fake host: its volumes, its document, running, with
/// the address ARP gives.
fn lay_down_kvm(host: &FakeHost, name: &str, uid: &str, ip: &str) {
    let path = |v: &str| format!("/var/lib/libvirt/images/{v}");
    let volume = |v: &str, format: &str, backing: Option<String>| FakeVolume {
        path: path(v),
        capacity: 1 << 30,
        format: format.into(),
        backing,
        bytes: Vec::new(),
    };
    host.put_volume(
        POOL,
        "base-debian-13.qcow2",
        volume("base-debian-13.qcow2", "qcow2", None),
    );
    let (overlay, seed) = (format!("{name}.qcow2"), format!("{name}-seed.iso"));
    host.put_volume(
        POOL,
        &overlay,
        volume(&overlay, "qcow2", Some(path("base-debian-13.qcow2"))),
    );
    host.put_volume(POOL, &seed, volume(&seed, "raw", None));
    let xml = GoKvmDomain {
        name,
        uid,
        created_at: &GO_TIME,
        disk: &path(&overlay),
        seed: &path(&seed),
        bridge: "br0",
        domain_type: "kvm",
    }
    .xml();
    host.define_directly(&xml);
    assert!(host.set_state(name, DomainState::Running));
    let interface = Interface {
        name: "vnet0".into(),
        hwaddr: "52:54:00:6b:3c:58".into(),
        addresses: vec![Address {
            kind: 0,
            text: ip.into(),
        }],
    };
    assert!(host.set_addresses(name, AddressSource::Arp, Ok(vec![interface])));
}

/// The Pod the Go kubernetes provider made for Proxy `uid`: its two labels, Squid, no owner;
/// running at `ip` as the kubelet reports it.
async fn lay_down_pod(pods: &Api<Pod>, name: &str, uid: &str, ip: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {egress_provider::LABEL_MANAGED: "true", egress_provider::LABEL_UID: uid},
        },
        "spec": {"containers": [{
            "name": "squid",
            "image": "ubuntu/squid:6.6-24.04_edge",
            "env": [{"name": "SQUID_CONF", "value": "http_port 3128\nhttp_access allow all\nmax_filedescriptors 4096\n"}],
            "ports": [{"containerPort": 3128}],
        }]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": ip}})),
    )
    .await
    .unwrap()
}

/// A ProviderHealth object as the Go monitor left it.
async fn go_provider_health(api: &Api<ProviderHealth>, name: &str, type_: &str) -> ProviderHealth {
    let object: ProviderHealth = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProviderHealth",
        "metadata": {"name": name, "labels": {egress_api::LABEL_MANAGED_BY: egress_api::MANAGED_BY}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "type": type_,
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllTargetsReady",
                            "message": "1/1 targets ready", "lastTransitionTime": GO_TIME.as_str()}],
            "targets": [{"name": "go-target", "ready": true, "reason": "Reachable", "latencyMillis": 4, "lastTransitionTime": GO_TIME.as_str()}],
            "targetsReady": "1/1",
            "lastCheckTime": GO_TIME.as_str(),
        }})),
    )
    .await
    .unwrap()
}

/// Takes a lease of the Proxy whose `backend` attribute is `backend`. The API may answer before
/// its cache has listed the Proxies (409 with nothing considered); that is waited out.
async fn lease(http: &reqwest::Client, discovery: &str, backend: &str) -> Value {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let r = http
            .post(format!("http://{discovery}/v1/leases"))
            .bearer_auth(TOKEN)
            .json(&json!({"selector": {"backend": backend}, "ttlSeconds": 60}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let answer: Value = r.json().await.unwrap();
        if status == 201 {
            return answer;
        }
        assert!(
            status == 409 && answer["considered"] == 0 && std::time::Instant::now() < deadline,
            "{backend}: {status} {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The installation mark each backend holds for the Go instance of `m`'s Proxy `uid`.
async fn mark_of(backends: &Backends, pods: &Api<Pod>, m: &Member, uid: &str) -> Option<String> {
    let name = egress_provider::name_from_uid(uid);
    match m.backend {
        "reference" => {
            let inventory = backends.memory.inventory().await.unwrap();
            inventory
                .into_iter()
                .find(|o| o.kind == "instance" && o.owner == name)
                .and_then(|o| o.marks.get(egress_provider::LABEL_INSTALLATION).cloned())
        }
        "kvm" => {
            let element = backends.host.domains()[&name]
                .metadata
                .get(egress_libvirt::KVM_NAMESPACE)
                .cloned()?;
            egress_libvirt::Mark::parse(&element).ok()?.installation
        }
        _ => pods
            .get(&name)
            .await
            .unwrap()
            .labels()
            .get(egress_provider::LABEL_INSTALLATION)
            .cloned(),
    }
}

/// Waits until every Go instance carries the installation's mark and each Proxy has its
/// `InstallationMarked` event, once the entry's provider was asked to mark.
async fn wait_for_marks(
    backends: &Backends,
    proxies: &Api<Proxy>,
    pods: &Api<Pod>,
    events: &Api<Event>,
    installation: &str,
) {
    let deadline = std::time::Instant::now() + PATIENCE;
    for m in &members() {
        let uid = proxies.get(m.proxy).await.unwrap().uid().unwrap();
        loop {
            let said = events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("InstallationMarked"))
                .any(|e| e.regarding.and_then(|r| r.name).as_deref() == Some(m.proxy));
            let mark = mark_of(backends, pods, m, &uid).await;
            if said && mark.as_deref() == Some(installation) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{}: mark {mark:?}, event {said}",
                m.proxy
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(backends.calls[m.entry].marks.load(Ordering::SeqCst) > 0, "{}", m.entry);
    }
}

/// RPCs of the libvirt fake that make, change or remove a domain or a volume.
const LIBVIRT_WRITES: &[&str] = &[
    "DomainDefineXML",
    "DomainCreate",
    "DomainDestroy",
    "DomainUndefineFlags",
    "StorageVolCreateXML",
    "StorageVolDelete",
    "StorageVolUpload",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_the_go_operator_left_is_adopted_whole_and_a_later_change_replaces_one() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The operator's logger cannot be installed over this one (it tolerates that): this one
    // hands the test the discovery API's address, and shows the operator's lines.
    let (address_tx, address_rx) = tokio::sync::oneshot::channel();
    {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let capture = DiscoveryAddress(Arc::new(Mutex::new(Some(address_tx))));
        let subscriber = tracing_subscriber::registry()
            .with(capture.with_filter(tracing_subscriber::filter::LevelFilter::INFO))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_ansi(false)
                    .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
            );
        tracing::subscriber::set_global_default(subscriber).expect("the first subscriber of this test binary");
    }

    let server = common::test_server().await;
    let client = server.client().unwrap();
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let health: Api<ProviderHealth> = Api::all(client.clone());
    let backends = Arc::new(Backends {
        memory: MemoryBackend::new(),
        host: FakeHost::new("beelink", POOL, 1 << 40),
        client: client.clone(),
        api_host: server.url(),
        calls: members()
            .iter()
            .map(|m| (m.entry, Arc::new(Calls::default())))
            .collect(),
    });

    // What the Go operator left: each Proxy, its running instance, its status.
    let mut recorded = BTreeMap::new();
    let mut go_pod_uid = String::new();
    for m in &members() {
        let created = go_proxy(&proxies, m).await;
        let uid = created.uid().unwrap();
        let name = egress_provider::name_from_uid(&uid);
        let provider_id = match m.backend {
            "reference" => {
                let mut seed = SeedSpec::marked(name.as_str(), uid.as_str());
                seed.ip = Some(m.ip.parse().unwrap());
                backends.memory.seed(seed).await.unwrap();
                format!("zones/zone-a/instances/{name}")
            }
            "kvm" => {
                lay_down_kvm(&backends.host, &name, &uid, m.ip);
                format!("hosts/beelink/domains/{name}")
            }
            _ => {
                go_pod_uid = lay_down_pod(&pods, &name, &uid, m.ip).await.uid().unwrap();
                format!("{NS}/{name}")
            }
        };
        let generation = created.metadata.generation.unwrap();
        proxies
            .patch_status(
                m.proxy,
                &PatchParams::default(),
                &Patch::Merge(go_status(m, &provider_id, generation)),
            )
            .await
            .unwrap();
        recorded.insert(m.proxy, (provider_id, m.ip));
    }
    let mut kept_health = BTreeMap::new();
    for (entry, type_) in [
        ("reference", "reference"),
        ("kvm-home", "kvm"),
        ("kubernetes", "kubernetes"),
    ] {
        kept_health.insert(entry, go_provider_health(&health, entry, type_).await.uid().unwrap());
    }
    let retired_uid = go_provider_health(&health, "gcp-retired", "gcp").await.uid().unwrap();
    let kvm_volumes = backends.host.volumes(POOL);
    let pod_writes = || {
        (
            server.requests().count(Verb::Create, "pods"),
            server.requests().count(Verb::Delete, "pods"),
        )
    };
    // The test's own create of the Go Pod.
    let pod_writes_before = pod_writes();

    // The operator starts.
    let dir = egress_testkit::scratch_dir("operator-takeover");
    let (providers, kubeconfig, token) = (dir.join("providers.yaml"), dir.join("kubeconfig"), dir.join("token"));
    std::fs::write(&providers, PROVIDERS_YAML).unwrap();
    server.write_kubeconfig(&kubeconfig).unwrap();
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let args = [
        format!("--providers-config={}", providers.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--discovery-token-file={}", token.display()),
        "--discovery-addr=127.0.0.1:0".into(),
        "--discovery-tls=off".into(),
        "--health-probe-bind-address=0".into(),
        "--metrics-bind-address=0".into(),
        "--provider-check-interval=10s".into(),
        // The orphan collector sweeps during the test, and would take the Go instances at any
        // age: only their marks (read as Go wrote them, then this installation's) keep them.
        "--gc-interval=1s".into(),
        "--gc-min-age=0s".into(),
    ];
    let egress_manager::flags::Command::Run(options) = egress_manager::flags::parse(args).unwrap() else {
        panic!("the flags are a run");
    };
    let registry = backends.registry();
    let extensions = egress_manager::Extensions {
        registry: Box::new(move |_| registry),
        health: egress_manager::Health::Scripted {
            verdicts: Arc::new(AllHealthy),
            events: Box::pin(futures::stream::pending()),
        },
        notice: None,
    };
    let operator = tokio::spawn(egress_manager::run(*options, extensions));
    let discovery = tokio::time::timeout(PATIENCE, address_rx)
        .await
        .expect("the discovery API is served")
        .unwrap();

    // Leases at once, at the addresses Go recorded.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for m in &members() {
        let answer = lease(&http, &discovery, m.backend).await;
        assert_eq!(
            (answer["proxy"]["id"].as_str(), answer["proxy"]["ip"].as_str()),
            (Some(format!("{NS}/{}", m.proxy).as_str()), Some(m.ip)),
            "{answer}"
        );
    }

    // Every Proxy adopted, Ready with its old instance and IP.
    let mut adopted_hash = BTreeMap::new();
    for m in &members() {
        // Go recorded a latency of 12 ms and this operator's verdicts say 9: a status written
        // by a pass of this operator, after it read the instance.
        let p = wait_for_proxy(&proxies, m.proxy, "adopted and Ready", PATIENCE, |p| {
            p.annotations()
                .get(ANNOTATION_SPEC_HASH)
                .is_some_and(|h| h.starts_with("v1:"))
                && p.status
                    .as_ref()
                    .is_some_and(|s| s.phase == Some(Phase::Ready) && s.latency_millis == Some(9))
        })
        .await;
        assert!(
            backends.calls[m.entry].gets.load(Ordering::SeqCst) > 0,
            "{}: its instance was never read",
            m.entry
        );
        let status = p.status.clone().unwrap();
        let (provider_id, ip) = &recorded[m.proxy];
        assert_eq!(
            (status.provider_id.as_str(), status.ip.as_str()),
            (provider_id.as_str(), *ip),
            "{}",
            m.proxy
        );
        assert_eq!(p.annotations()[ANNOTATION_PREVIOUS_SPEC_HASH], GO_HASH);
        assert_eq!(p.finalizers(), [FINALIZER]);
        adopted_hash.insert(m.proxy, p.annotations()[ANNOTATION_SPEC_HASH].clone());
    }
    // Events are recorded after the pass's writes, so they may trail the status a little.
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let adopted: Vec<String> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Adopted"))
            .filter_map(|e| e.regarding.and_then(|r| r.name))
            .collect();
        if members().iter().all(|m| adopted.iter().any(|n| n == m.proxy)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Adopted events for {adopted:?} only"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Every Go instance marked with the installation, where its backend keeps marks, and said.
    // No `--installation-id`: the id the operator derives, in `NS` (its kubeconfig's namespace).
    let uid = egress_controller::installation::cluster_uid(&client).await.unwrap();
    let installation = egress_controller::installation::derive(&uid, NS);
    wait_for_marks(&backends, &proxies, &pods, &events, &installation).await;

    // The monitor has run a round: Go's objects of configured entries kept and updated, the
    // retired entry's removed.
    for (entry, uid) in &kept_health {
        let api = health.clone();
        let checked = await_condition(api, entry, |h: Option<&ProviderHealth>| {
            h.and_then(|h| h.status.as_ref())
                .is_some_and(|s| s.last_check_time.as_ref().is_some_and(|t| t.0.to_string() != *GO_TIME))
        });
        let object = tokio::time::timeout(PATIENCE, checked)
            .await
            .unwrap_or_else(|_| panic!("{entry}: no check round within {PATIENCE:?}"))
            .unwrap()
            .unwrap();
        assert_eq!(object.uid().as_deref(), Some(uid.as_str()), "{entry} was recreated");
    }
    let retired = await_condition(
        health.clone(),
        "gcp-retired",
        kube::runtime::conditions::is_deleted(&retired_uid),
    );
    tokio::time::timeout(PATIENCE, retired).await.unwrap().unwrap();

    // The orphan collector has swept every entry at least once since it started (a second list
    // of an entry begins after the first sweep's deletes of it).
    let deadline = std::time::Instant::now() + PATIENCE;
    while backends.calls.values().any(|c| c.lists.load(Ordering::SeqCst) < 2) {
        assert!(
            std::time::Instant::now() < deadline,
            "no orphan sweep within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Nothing was made or removed anywhere, though every backend was read.
    for (entry, calls) in &backends.calls {
        assert_eq!(calls.seen(), (0, 0), "{entry}: provider (create, delete) calls");
    }
    let memory_calls = backends.memory.call_log().await.unwrap();
    assert!(
        !memory_calls.iter().any(|c| c.kind == INSERT || c.kind == REMOVE),
        "{memory_calls:?}"
    );
    assert!(memory_calls.iter().any(|c| c.kind == LOOKUP), "{memory_calls:?}");
    let libvirt_calls = backends.host.interceptor().call_log();
    let libvirt_writes: Vec<_> = libvirt_calls
        .iter()
        .filter(|c| LIBVIRT_WRITES.contains(&c.kind.0))
        .collect();
    assert!(libvirt_writes.is_empty(), "{libvirt_writes:?}");
    assert!(
        libvirt_calls.iter().any(|c| c.kind.0 == "DomainGetState"),
        "{libvirt_calls:?}"
    );
    assert_eq!(backends.host.volumes(POOL), kvm_volumes);
    assert_eq!(pod_writes(), pod_writes_before, "Pod (create, delete) requests");
    let pod_name = egress_provider::name_from_uid(&proxies.get("pods-1").await.unwrap().uid().unwrap());
    assert_eq!(pods.get(&pod_name).await.unwrap().uid(), Some(go_pod_uid));

    // A spec change afterwards replaces that Proxy, and only it.
    proxies
        .patch(
            "ref-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    let before = adopted_hash["ref-1"].clone();
    let replaced = wait_for_proxy(&proxies, "ref-1", "replaced and Ready", PATIENCE, move |p| {
        p.annotations().get(ANNOTATION_SPEC_HASH).is_some_and(|h| *h != before)
            && p.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Ready))
    })
    .await;
    assert_ne!(replaced.status.unwrap().ip, "10.20.0.5", "the old instance's address");
    assert_eq!(backends.calls["reference"].seen(), (1, 1));
    for entry in ["kvm-home", "kubernetes"] {
        assert_eq!(backends.calls[entry].seen(), (0, 0), "{entry}");
    }
    for m in members().iter().filter(|m| m.proxy != "ref-1") {
        let p = proxies.get(m.proxy).await.unwrap();
        assert_eq!(
            p.annotations()[ANNOTATION_SPEC_HASH],
            adopted_hash[m.proxy],
            "{}",
            m.proxy
        );
        assert_eq!(p.status.unwrap().ip, m.ip, "{}", m.proxy);
    }

    // Review M1, at the reconciler: the kvm domain QEMU paused on a disk error (a full pool)
    // is kept through two passes; paused after a crash, it is replaced.
    let kvm = members().into_iter().find(|m| m.backend == "kvm").unwrap();
    let domain = egress_provider::name_from_uid(&proxies.get(kvm.proxy).await.unwrap().uid().unwrap());
    let kvm_calls = backends.calls[kvm.entry].clone();
    assert!(
        backends
            .host
            .set_state(&domain, DomainState::Paused(PauseReason::IO_ERROR))
    );
    for poke in ["1", "2"] {
        let gets = kvm_calls.gets.load(Ordering::SeqCst);
        // Any change to the object starts a pass; one pass at a time runs per Proxy, so the
        // second read comes after the first pass has decided.
        proxies
            .patch(
                kvm.proxy,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"test/poke": poke}}})),
            )
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + PATIENCE;
        while kvm_calls.gets.load(Ordering::SeqCst) == gets {
            assert!(std::time::Instant::now() < deadline, "no pass read the paused domain");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(kvm_calls.seen(), (0, 0), "a domain paused on a disk error was touched");
    assert!(backends.host.domains().contains_key(&domain));
    assert!(
        backends
            .host
            .set_state(&domain, DomainState::Paused(PauseReason::CRASHED))
    );
    proxies
        .patch(
            kvm.proxy,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test/poke": "3"}}})),
        )
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    while kvm_calls.deletes.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a crashed domain was not replaced"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    operator.abort();
}
