//! The fake hypervisors behind a libvirt provider, with every backend hook the suite asks of
//! them, and the conformance target over them.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use egress_conformance::hooks::{BackendObject, HookResult, SeedManaged, SeedTime};
use egress_conformance::{
    BackendHooks, BuildOptions, ConformanceTarget, Fixtures, Interceptor, NativeState, NotConfigured, Profile,
    SeedSpec, Unsupported,
};
use egress_provider::{BoxError, CreateRequest, Provider, ProviderId};
use egress_testkit::ScratchDir;
use egress_testkit::image_server::ImageServer;

use super::{
    FAKE_KEY, HOSTS, POOL, POOL_BYTES, config, fixtures, image_bytes, marks_of, profile, request_in, sha256_hex,
    volume_object,
};
use crate::config::KvmConfig;
use crate::engine::LibvirtProvider;
use crate::engine::url_guard::{Lookup, SystemLookup};
use crate::fake::FakeHost;
use crate::generation::Generation;
use crate::host::{Address, AddressSource, DomainState, Host, Interface};
use crate::seed::read_seed_file;
use crate::{DomainSpec, Mark, rfc3339};
use egress_netguard::Guard;

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
        let key = files.path().join("id_ed25519");
        std::fs::write(&key, FAKE_KEY).unwrap();
        // A private key is refused when others may read it.
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
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

    /// A provider of entry `entry` over this backend, whose URL images may come from loopback
    /// (where the tests' mirrors are) but no other internal address.
    pub fn provider(&self, entry: &str, cfg: KvmConfig) -> Result<LibvirtProvider, BoxError> {
        let loopback = Guard::new(&[], &["127.0.0.0/8".to_owned()])?;
        self.provider_resolving(entry, cfg, loopback, Arc::new(SystemLookup))
    }

    /// A provider of entry `entry` over this backend whose downloads resolve names through
    /// `lookup`, `guard` judging what is internal.
    pub fn provider_resolving(
        &self,
        entry: &str,
        cfg: KvmConfig,
        guard: Guard,
        lookup: Arc<dyn Lookup>,
    ) -> Result<LibvirtProvider, BoxError> {
        let hosts = self
            .hosts
            .iter()
            .map(|h| Box::new(h.clone()) as Box<dyn Host>)
            .collect();
        LibvirtProvider::new(self.generation, entry, cfg, hosts)?.with_url_resolution(guard, lookup)
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
        ProviderId::new(crate::engine::id::format(HOSTS[0], name))
    }

    fn fixtures(&self) -> Fixtures {
        fixtures(self.0, &HOSTS)
    }
}
