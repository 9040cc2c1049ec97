//! A libvirt provider (kvm2, or kvm: the test files choose the generation) as a conformance
//! target: over the in-memory libvirt fake (two hosts sharing
//! one call log and fault table, a DHCP that gives started guests an address, the SSH key file
//! read on every call as a dial would), with the base image served by a local HTTP server.
//!
//! What the fake does not cover: libvirt's own behaviour (checked against the real daemon by
//! `egress-libvirt-ssh`'s `tests/seam.rs`), the SSH transport and its per-call budgets (its own
//! tests), a guest that really boots (the real-mode run).
//!
//! Behind the `testing` feature, for the tests of `egress-provider-kvm` and
//! `egress-provider-kvm2`.

pub use egress_testkit::image_server;
pub mod real;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_conformance::hooks::{BackendObject, HookResult, SeedManaged, SeedTime};
use egress_conformance::target::{
    AsyncOps, CallKinds, ChildSpans, ClassifyCase, CreateReturn, Credentials, DeleteReturn, GcMark, ListPartial,
    Logging, ProvisioningState, Quota, Timeouts,
};
use egress_conformance::{
    BackendHooks, BuildOptions, CallKind, ConformanceTarget, Fault, Fixtures, Interceptor, NativeState, NotConfigured,
    Profile, SeedSpec, Unsupported,
};
use egress_libvirt::config::{KvmConfig, KvmHost, KvmImage, KvmMachineType};
use egress_libvirt::engine::failure::OpFailure;
use egress_libvirt::engine::{Generation, LibvirtProvider};
use egress_libvirt::fake::FakeHost;
use egress_libvirt::host::{Address, AddressSource, DomainState, Host, Interface, LibvirtError};
use egress_libvirt::seed::read_seed_file;
use egress_libvirt::{DomainSpec, Mark, rfc3339};
use egress_provider::{
    BoxError, CreateRequest, ErrorClass, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_UID, Op, Placement, Provider,
    ProviderId, name_from_uid,
};
use egress_testkit::ScratchDir;
use egress_testkit::image_server::ImageServer;
use sha2::{Digest as _, Sha256};

/// The hosts of the fake entry; the first is the default location.
pub const HOSTS: [&str; 2] = ["hv-a", "hv-b"];
/// The pool on every host.
pub const POOL: &str = "default";
/// The image key of the entry.
pub const IMAGE_KEY: &str = "test-image";
/// What each fake pool holds: room for a few overlays.
pub const POOL_BYTES: u64 = 200 << 30;

/// A small stand-in image (its bytes only matter to the digest).
pub fn image_bytes() -> Vec<u8> {
    (0..256 * 1024u32).map(|i| (i % 251) as u8).collect()
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A key file the fake accepts.
pub const FAKE_KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nZmFrZQ==\n-----END OPENSSH PRIVATE KEY-----\n";

/// The entry's block: every host of `hosts`, the image at `url` with its digest.
pub fn config(hosts: &[&str], url: &str, sha256: Option<String>, files: &ScratchDir) -> KvmConfig {
    KvmConfig {
        ssh_key_file: files.path().join("id_ed25519").display().to_string(),
        known_hosts_file: files.path().join("known_hosts").display().to_string(),
        domain_type: Some("qemu".to_owned()),
        images: BTreeMap::from([(
            IMAGE_KEY.to_owned(),
            KvmImage {
                url: url.to_owned(),
                sha256: sha256.unwrap_or_default(),
                ..KvmImage::default()
            },
        )]),
        machine_types: BTreeMap::from([(
            "small".to_owned(),
            KvmMachineType {
                vcpus: 1,
                memory_mib: 1024,
            },
        )]),
        hosts: hosts
            .iter()
            .map(|h| KvmHost {
                name: (*h).to_owned(),
                address: format!("{h}:22"),
                user: "virt".to_owned(),
                bridge: "br0".to_owned(),
                ..KvmHost::default()
            })
            .collect(),
        ..KvmConfig::default()
    }
}

/// The fake hypervisors and the image mirror.
#[derive(Clone, Debug)]
pub struct FakeBackend {
    pub generation: Generation,
    pub hosts: Vec<FakeHost>,
    pub interceptor: Interceptor,
    pub server: Arc<ImageServer>,
    pub files: Arc<ScratchDir>,
}

impl FakeBackend {
    /// Two empty hosts, a key file, and the image served, for a `generation` provider.
    pub async fn new(generation: Generation) -> Self {
        let interceptor = Interceptor::new();
        let files = Arc::new(ScratchDir::new("kvm2-fake"));
        std::fs::write(files.path().join("id_ed25519"), FAKE_KEY).unwrap();
        std::fs::write(files.path().join("known_hosts"), "hv-a ssh-ed25519 AAAA\n").unwrap();
        let hosts: Vec<FakeHost> = HOSTS
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let host = FakeHost::sharing(h, POOL, POOL_BYTES, interceptor.clone());
                host.set_dhcp(Some([10, 20, u8::try_from(i).unwrap()]));
                host.require_key_file(Some(files.path().join("id_ed25519")));
                host
            })
            .collect();
        let server = Arc::new(ImageServer::start(image_bytes(), "127.0.0.1:0").await);
        Self {
            generation,
            hosts,
            interceptor,
            server,
            files,
        }
    }

    /// The block a provider over this backend uses.
    pub fn config(&self, insecure: bool) -> KvmConfig {
        let mut cfg = config(
            &HOSTS,
            &self.server.url(),
            Some(sha256_hex(&image_bytes())),
            &self.files,
        );
        cfg.insecure_ignore_host_key = insecure;
        cfg
    }

    /// A provider of entry `entry` over this backend.
    pub fn provider(&self, entry: &str, cfg: KvmConfig) -> Result<LibvirtProvider, BoxError> {
        let hosts = self
            .hosts
            .iter()
            .map(|h| Box::new(h.clone()) as Box<dyn Host>)
            .collect();
        LibvirtProvider::new(self.generation, entry, cfg, hosts)
    }

    /// The provider's metadata namespace.
    fn namespace(&self) -> &'static str {
        self.generation.namespace()
    }

    /// The host named `location` (the first when `None`).
    pub fn host(&self, location: Option<&str>) -> HookResult<&FakeHost> {
        let name = location.unwrap_or(HOSTS[0]);
        self.hosts
            .iter()
            .find(|h| h.name() == name)
            .ok_or(Unsupported("a location this backend does not have"))
    }

    /// The host holding domain `name`.
    fn holder(&self, name: &str) -> HookResult<&FakeHost> {
        self.hosts
            .iter()
            .find(|h| h.domains().contains_key(name))
            .ok_or(Unsupported("an instance this backend does not hold"))
    }
}

fn eth0(ip: IpAddr) -> Vec<Interface> {
    vec![Interface {
        name: "eth0".to_owned(),
        hwaddr: "52:54:00:00:00:01".to_owned(),
        addresses: vec![Address {
            kind: 0,
            text: ip.to_string(),
        }],
    }]
}

fn native(state: &NativeState) -> DomainState {
    match state {
        NativeState::Pending => DomainState::NoState,
        NativeState::Running => DomainState::Running,
        NativeState::Stopped => DomainState::Shutoff,
        NativeState::Terminated => DomainState::Crashed,
        NativeState::Unknown(_) => DomainState::Other(99),
    }
}

/// The metadata element a seed asks for, written by hand so any part can be missing or odd.
fn seeded_mark(spec: &SeedSpec, namespace: &str) -> String {
    let mut out = format!("<instance xmlns=\"{namespace}\">");
    match &spec.managed {
        SeedManaged::Yes => out.push_str("<managed>true</managed>"),
        SeedManaged::No => {}
        SeedManaged::Other(v) => out.push_str(&format!("<managed>{v}</managed>")),
    }
    if let Some(uid) = &spec.uid {
        out.push_str(&format!("<uid>{uid}</uid>"));
    }
    match &spec.created_at {
        SeedTime::Valid(at) => out.push_str(&format!("<createdAt>{}</createdAt>", rfc3339(*at))),
        SeedTime::Missing => {}
        SeedTime::Garbage => out.push_str("<createdAt>garbage</createdAt>"),
    }
    out.push_str("</instance>");
    out
}

/// The marks of a domain as the inventory shows them.
pub fn marks_of(metadata: Option<&String>) -> BTreeMap<String, String> {
    let mut marks = BTreeMap::new();
    if let Some(mark) = metadata.and_then(|m| Mark::parse(m).ok()) {
        if mark.managed {
            marks.insert(LABEL_MANAGED.to_owned(), "true".to_owned());
        }
        if !mark.uid.is_empty() {
            marks.insert(LABEL_UID.to_owned(), mark.uid);
        }
        if let Some(at) = mark.created_at {
            marks.insert("createdAt".to_owned(), rfc3339(at));
        }
        if let Some(i) = mark.installation {
            marks.insert(LABEL_INSTALLATION.to_owned(), i);
        }
    }
    marks
}

/// A volume as the inventory shows it: an overlay or seed belongs to its domain; base images
/// and their markers are shared.
pub fn volume_object(name: &str) -> BackendObject {
    let (kind, owner) = if let Some(owner) = name.strip_suffix("-seed.iso") {
        ("seed", owner.to_owned())
    } else if name.starts_with("base-") {
        ("image", String::new())
    } else if let Some(owner) = name.strip_suffix(".qcow2") {
        ("overlay", owner.to_owned())
    } else {
        ("volume", String::new())
    };
    BackendObject {
        kind: kind.to_owned(),
        owner,
        marks: BTreeMap::new(),
        user_data: None,
    }
}

#[async_trait]
impl BackendHooks for FakeBackend {
    fn interceptor(&self) -> Option<&Interceptor> {
        Some(&self.interceptor)
    }

    async fn seed(&self, spec: SeedSpec) -> HookResult {
        let host = self.host(spec.location.as_deref())?;
        let xml = DomainSpec {
            name: spec.name.clone(),
            memory_mib: 1024,
            vcpus: 1,
            mark: Mark::default(),
            firmware: "uefi".to_owned(),
            domain_type: "qemu".to_owned(),
            cpu_mode: None,
            disk_path: format!("/fake/{POOL}/{}.qcow2", spec.name),
            disk_format: "qcow2".to_owned(),
            seed_path: format!("/fake/{POOL}/{}-seed.iso", spec.name),
            bridge: "br0".to_owned(),
            mac: None,
        }
        .to_xml(self.generation)
        .expect("a seeded domain document");
        // Straight into the fake, past its call log and faults.
        host.define_directly(&xml);
        host.set_metadata(&spec.name, self.namespace(), Some(seeded_mark(&spec, self.namespace())));
        host.set_state(&spec.name, native(&spec.state));
        if let Some(ip) = spec.ip {
            host.set_addresses(&spec.name, AddressSource::Agent, Ok(eth0(ip)));
        }
        Ok(())
    }

    async fn set_native_state(&self, name: &str, state: NativeState) -> HookResult {
        self.holder(name)?.set_state(name, native(&state));
        Ok(())
    }

    async fn set_address(&self, name: &str, ip: Option<IpAddr>) -> HookResult {
        let host = self.holder(name)?;
        host.set_addresses(name, AddressSource::Agent, Ok(ip.map(eth0).unwrap_or_default()));
        host.set_addresses(name, AddressSource::Arp, Ok(Vec::new()));
        Ok(())
    }

    async fn rewrite_marks(&self, name: &str, uid: &str, created_at: SystemTime) -> HookResult {
        let host = self.holder(name)?;
        let old = host.domains()[name].metadata.get(self.namespace()).cloned();
        let mut mark = old.and_then(|m| Mark::parse(&m).ok()).unwrap_or_default();
        mark.managed = true;
        mark.uid = uid.to_owned();
        mark.created_at = Some(created_at);
        host.set_metadata(name, self.namespace(), Some(mark.to_xml(self.namespace()).unwrap()));
        Ok(())
    }

    async fn strip_marks(&self, name: &str) -> HookResult {
        self.holder(name)?.set_metadata(name, self.namespace(), None);
        Ok(())
    }

    async fn inventory(&self) -> HookResult<Vec<BackendObject>> {
        let mut out = Vec::new();
        for host in &self.hosts {
            let volumes = host.volumes(POOL);
            for (name, domain) in host.domains() {
                let user_data = volumes
                    .get(&format!("{name}-seed.iso"))
                    .and_then(|v| read_seed_file(&v.bytes, "user-data"));
                out.push(BackendObject {
                    kind: "instance".to_owned(),
                    owner: name.clone(),
                    marks: marks_of(domain.metadata.get(self.namespace())),
                    user_data,
                });
            }
            out.extend(volumes.keys().map(|v| volume_object(v)));
        }
        Ok(out)
    }

    async fn make_unreadable(&self, name: &str) -> HookResult {
        self.holder(name)?
            .set_metadata(name, self.namespace(), Some("<instance><uid>".to_owned()));
        Ok(())
    }

    async fn make_scope_unreachable(&self, location: &str) -> HookResult {
        self.host(Some(location))?.set_down(true);
        Ok(())
    }

    async fn begin_backend_delete(&self, _name: &str) -> HookResult {
        // Delete waits until everything is gone: there is no deleting state to hold.
        Ok(())
    }

    async fn finish_delete(&self, _name: &str) -> HookResult {
        Ok(())
    }

    async fn credential_path(&self) -> HookResult<PathBuf> {
        Ok(self.files.path().join("id_ed25519"))
    }

    async fn valid_credential(&self, sentinel: &str) -> HookResult<String> {
        Ok(format!(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n{sentinel}\n-----END OPENSSH PRIVATE KEY-----\n"
        ))
    }
}

/// A libvirt provider over the fake.
#[derive(Clone, Copy, Debug)]
pub struct FakeTarget(pub Generation);

/// The profile of a libvirt provider, whatever the backend.
pub fn profile(generation: Generation) -> Profile {
    Profile {
        create_return: CreateReturn::Blocking,
        delete_return: DeleteReturn::Waits,
        gc_mark: GcMark::WrittenMetadata,
        list_partial: ListPartial::FailWhole,
        // libvirt reports no quota through a call's error (a full disk is an I/O error, which
        // the table retries); the pool-space precheck's QuotaExceeded is covered in
        // tests/provider.rs.
        quota: Quota::Absent(ErrorClass::Transient),
        async_ops: AsyncOps::None,
        provisioning_state: ProvisioningState::CreateBlocks,
        timeouts: Timeouts::PerCall,
        logging: Logging::Tiered,
        // kvm has no child spans (as the Go provider had none).
        child_spans: match generation {
            Generation::Kvm => ChildSpans::None,
            Generation::Kvm2 => ChildSpans::SpanDecorator,
        },
        // kvm keeps the key once it loaded (a rotated Secret needs a restart); kvm2 reads it
        // on every connection.
        credentials: Credentials::MountedFiles {
            rereads: generation == Generation::Kvm2,
        },
        ip_discovered: true,
        delivers_cloud_init: true,
        adoption_guard: true,
        key_value_marks: true,
        create_not_found_class: ErrorClass::Transient,
        readiness_budget: Duration::from_secs(10),
        delete_budget: Duration::from_secs(10),
    }
}

/// A request for Proxy `uid` on host `location`.
pub fn request_in(uid: &str, location: &str) -> CreateRequest {
    CreateRequest {
        name: name_from_uid(uid),
        uid: uid.to_owned(),
        namespace: "crawl".to_owned(),
        proxy_name: format!("proxy-for-{uid}"),
        placement: Placement {
            region: String::new(),
            zone: location.to_owned(),
            machine_type: "small".to_owned(),
            image: IMAGE_KEY.to_owned(),
        },
        cloud_init: b"#cloud-config\nruncmd: [echo kvm2]\n".to_vec(),
        port: 3128,
        installation: None,
        credentials: None,
    }
}

/// The fixtures of `generation` for hosts `hosts` (the first is the default location).
pub fn fixtures(generation: Generation, hosts: &[&str]) -> Fixtures {
    let with = |f: &dyn Fn(&mut Placement)| {
        let mut p = request_in("fixture", hosts[0]).placement;
        f(&mut p);
        p
    };
    let daemon = |n: i32| LibvirtError::daemon(n, "x");
    let classify = |e: &LibvirtError, op: Op| generation.classify(e, op);
    // Where the two tables part: 84 (operation unsupported) is Permanent for kvm only.
    let unsupported = match generation {
        Generation::Kvm => ErrorClass::Permanent,
        Generation::Kvm2 => ErrorClass::Transient,
    };
    let mut classify_cases = ClassifyCase::rows([
        ("42 in get", classify(&daemon(42), Op::Get), ErrorClass::NotFound),
        ("42 in create", classify(&daemon(42), Op::Create), ErrorClass::Transient),
        ("50 in delete", classify(&daemon(50), Op::Delete), ErrorClass::NotFound),
        ("49", classify(&daemon(49), Op::Get), ErrorClass::Permanent),
        ("27", classify(&daemon(27), Op::Create), ErrorClass::Permanent),
        ("88", classify(&daemon(88), Op::Get), ErrorClass::Permanent),
        ("67 in create", classify(&daemon(67), Op::Create), ErrorClass::Permanent),
        ("84", classify(&daemon(84), Op::Get), unsupported),
        ("55", classify(&daemon(55), Op::Get), ErrorClass::Transient),
        ("1", classify(&daemon(1), Op::Get), ErrorClass::Transient),
        (
            "a dropped connection",
            classify(&LibvirtError::transport("connection reset"), Op::Get),
            ErrorClass::Transient,
        ),
        (
            "the pool-space precheck short of room",
            OpFailure::quota("storage pool default has 1 bytes available, 2 needed").class(Op::Create),
            ErrorClass::QuotaExceeded,
        ),
    ]);
    classify_cases.push(ClassifyCase::not_a_backend_error(
        "a bare error, not from libvirt",
        &std::fmt::Error,
    ));
    let first = hosts[0];
    Fixtures {
        malformed_ids: [
            "",
            "proxy-x",
            "beelink/proxy-x",
            "hosts/beelink/proxy-x",
            "hosts//domains/x",
            "hosts/beelink/domains/",
            "hosts/beelink/domains/x/y",
            "nodes/beelink/domains/x",
        ]
        .into_iter()
        .map(ProviderId::from)
        .collect(),
        id_in_unconfigured_location: Some((
            ProviderId::new("hosts/elsewhere/domains/proxy-aaaaaaaaaaaaaaaa"),
            "elsewhere".to_owned(),
        )),
        invalid_placements: vec![
            (with(&|p| p.zone = "elsewhere".into()), "zone", "elsewhere".into()),
            (with(&|p| p.machine_type = "huge".into()), "machineType", "huge".into()),
            (with(&|p| p.image = "windows".into()), "image", "windows".into()),
        ],
        classify_cases,
        check_targets: hosts.iter().map(|h| (*h).to_owned()).collect(),
        check_faults: {
            use egress_libvirt::engine::check::REASON_LIBVIRT_ERROR;
            let (denied, failed) = match generation {
                Generation::Kvm => (REASON_LIBVIRT_ERROR, REASON_LIBVIRT_ERROR),
                Generation::Kvm2 => (egress_provider::REASON_FORBIDDEN, egress_provider::REASON_API_ERROR),
            };
            vec![
                (Fault::PermissionDenied, first.into(), denied),
                (Fault::Timeout, first.into(), egress_provider::REASON_TIMEOUT),
                (Fault::Server5xx, first.into(), failed),
                (
                    Fault::ConnectionReset,
                    first.into(),
                    egress_provider::REASON_UNREACHABLE,
                ),
            ]
        },
        locations: hosts.iter().map(|h| (*h).to_owned()).collect(),
        secondary_kinds: vec!["overlay".to_owned(), "seed".to_owned()],
        shared_kinds: vec!["image".to_owned()],
        calls: CallKinds {
            create_steps: [
                "DomainGetMetadata",
                "StorageVolGetPath",
                "StoragePoolRefresh",
                "StoragePoolGetInfo",
                "StorageVolCreateXML",
                "StorageVolDelete",
                "StorageVolUpload",
                "DomainDefineXML",
                "DomainGetState",
                "DomainCreate",
            ]
            .into_iter()
            .map(CallKind)
            .collect(),
            create_instance: CallKind("DomainDefineXML"),
            get: ["DomainGetMetadata", "DomainGetState", "DomainInterfaceAddresses"]
                .into_iter()
                .map(CallKind)
                .collect(),
            get_discovery: vec![CallKind("DomainInterfaceAddresses")],
            delete_frees_name: CallKind("DomainUndefineFlags"),
            delete: [
                "DomainGetMetadata",
                "DomainDestroy",
                "DomainUndefineFlags",
                "StorageVolDelete",
            ]
            .into_iter()
            .map(CallKind)
            .collect(),
            list: CallKind("ConnectListAllDomains"),
            probe: Some(CallKind("ConnectGetLibVersion")),
        },
        // The per-call budgets are the SSH transport's (tests in egress-libvirt-ssh); the fake
        // has none.
        budgets: None,
        insecure_switch: Some("insecureIgnoreHostKey"),
    }
}

#[async_trait]
impl ConformanceTarget for FakeTarget {
    type Backend = FakeBackend;

    async fn backend(&self) -> Result<FakeBackend, NotConfigured> {
        Ok(FakeBackend::new(self.0).await)
    }

    fn build(&self, backend: &FakeBackend, options: &BuildOptions) -> Result<Arc<dyn Provider>, BoxError> {
        Ok(Arc::new(
            backend.provider(&options.entry_name, backend.config(options.insecure))?,
        ))
    }

    fn profile(&self) -> Profile {
        profile(self.0)
    }

    fn valid_request(&self, uid: &str) -> CreateRequest {
        request_in(uid, HOSTS[0])
    }

    fn request_in(&self, uid: &str, location: &str) -> CreateRequest {
        request_in(uid, location)
    }

    fn id_for(&self, name: &str) -> ProviderId {
        ProviderId::new(egress_libvirt::engine::id::format(HOSTS[0], name))
    }

    fn fixtures(&self) -> Fixtures {
        fixtures(self.0, &HOSTS)
    }
}
