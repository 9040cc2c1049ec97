//! An in-memory hypervisor behind [`Host`], for the libvirt providers' conformance suites:
//! domains defined from real documents (name and metadata read from them), states, interface
//! addresses per source, pools and volumes with their bytes, libvirt's error numbers where
//! libvirt gives them, and the suite's fault injection on every call (by RPC name, e.g.
//! `DomainDefineXML`).
//!
//! What it answers is checked against the real daemon by `egress-libvirt-ssh`'s
//! `tests/seam.rs`, which runs one behavioural table against both.
//!
//! The `Host` calls sit side by side here, so the fake reads against the real daemon's behaviour
//! table in one place; what it reads from the documents it is given is in `fake/documents.rs`,
//! and the Go operator's own domain document in `fake/go_kvm.rs`.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use egress_conformance::{Fault, Interceptor};
use egress_provider::OpCtx;

use crate::host::{
    AddressSource, DomainState, Host, Interface, LibvirtError, LvResult, POOL_RUNNING, PoolInfo, UploadSource, code,
};

mod documents;
mod go_kvm;

use documents::{check_element, read_domain, read_volume};
pub use go_kvm::GoKvmDomain;

/// A domain as the fake keeps it.
#[derive(Clone, Debug)]
pub struct FakeDomain {
    /// The document it was defined from.
    pub xml: String,
    /// Its state.
    pub state: DomainState,
    /// Metadata elements by namespace, as written.
    pub metadata: BTreeMap<String, String>,
    /// What each address source answers (absent: an empty list).
    pub addresses: BTreeMap<&'static str, Result<Vec<Interface>, LibvirtError>>,
    /// Checkpoints and snapshots made of it: each kind's metadata stops an undefine without
    /// the flag that removes it, as libvirt refuses (review L5).
    pub checkpoints: u32,
    /// See `checkpoints`.
    pub snapshots: u32,
}

/// `virDomainUndefineFlags`'s flags the fake honours.
const UNDEFINE_SNAPSHOTS_METADATA: u32 = 2;
const UNDEFINE_CHECKPOINTS_METADATA: u32 = 16;

/// A volume as the fake keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeVolume {
    /// Its path.
    pub path: String,
    /// Its declared capacity.
    pub capacity: u64,
    /// Its format.
    pub format: String,
    /// The backing store's path, for an overlay.
    pub backing: Option<String>,
    /// What was uploaded.
    pub bytes: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    domains: BTreeMap<String, FakeDomain>,
    pools: BTreeMap<String, (u64, BTreeMap<String, FakeVolume>)>,
    /// When set, a domain started without addresses gets one from the guest agent in this
    /// /24 (as a guest booting on a DHCP network would).
    dhcp: Option<[u8; 3]>,
    leased: u8,
    /// What the host reports as its hostname, when not its name.
    hostname: Option<String>,
}

/// The fake hypervisor. Clones share it.
#[derive(Clone, Debug)]
pub struct FakeHost {
    name: String,
    state: Arc<Mutex<State>>,
    interceptor: Interceptor,
    /// This host alone is cut off (the others sharing the interceptor are not).
    down: Arc<std::sync::atomic::AtomicBool>,
    /// The pooled link alone is cut off: a dedicated connection, a link of its own, still
    /// works (review M10).
    pooled_down: Arc<std::sync::atomic::AtomicBool>,
    /// Whether this handle is a dedicated connection ([`Host::dedicated`]) rather than the
    /// pooled link.
    is_dedicated: bool,
    /// The private key file every call needs, as the SSH transport reads it on a dial.
    key_file: Arc<Mutex<Option<std::path::PathBuf>>>,
}

impl FakeHost {
    /// A host named `name` with one running pool `pool` of `capacity` bytes.
    pub fn new(name: &str, pool: &str, capacity: u64) -> Self {
        Self::sharing(name, pool, capacity, Interceptor::new())
    }

    /// Like [`FakeHost::new`], recording into and faulted by `interceptor` (shared by several
    /// hosts, so one call log and one set of faults covers a provider's every host).
    pub fn sharing(name: &str, pool: &str, capacity: u64, interceptor: Interceptor) -> Self {
        let mut state = State::default();
        state.pools.insert(pool.to_owned(), (capacity, BTreeMap::new()));
        Self {
            name: name.to_owned(),
            state: Arc::new(Mutex::new(state)),
            interceptor,
            down: Arc::default(),
            pooled_down: Arc::default(),
            is_dedicated: false,
            key_file: Arc::default(),
        }
    }

    /// Gives each domain started from now on an address from `prefix`.0/24 through the guest
    /// agent, unless its addresses were set already (`None`: started domains have none).
    pub fn set_dhcp(&self, prefix: Option<[u8; 3]>) {
        self.lock().dhcp = prefix;
    }

    /// Makes the host report `hostname` (its name by default), as a host whose name is long
    /// or not ASCII does.
    pub fn set_hostname(&self, hostname: &str) {
        self.lock().hostname = Some(hostname.to_owned());
    }

    /// Makes every call read `path` first, as a dial does over SSH: a missing or unreadable
    /// file fails the call as [`DialFailure::KeyUnreadable`](crate::host::DialFailure), one
    /// that holds no private key as `KeyInvalid` (its content never in the message).
    pub fn require_key_file(&self, path: Option<std::path::PathBuf>) {
        *self.key_file.lock().unwrap_or_else(|p| p.into_inner()) = path;
    }

    fn check_key_file(&self) -> LvResult<()> {
        use crate::host::DialFailure;
        let Some(path) = self.key_file.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            return Ok(());
        };
        let shown = path.display();
        let text = std::fs::read(&path).map_err(|e| {
            LibvirtError::dial(
                DialFailure::KeyUnreadable,
                format!(
                    "dialing host {} (credentials): reading ssh key file {shown}: {e}",
                    self.name
                ),
            )
        })?;
        let text = String::from_utf8_lossy(&text);
        if text.trim_start().starts_with("-----BEGIN") && text.contains("PRIVATE KEY-----") {
            Ok(())
        } else {
            Err(LibvirtError::dial(
                DialFailure::KeyInvalid,
                format!(
                    "dialing host {} (credentials): parsing ssh key file {shown}: no private key in it",
                    self.name
                ),
            ))
        }
    }

    /// Cuts this host off (every call fails as a dropped connection), or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    /// Cuts off (or restores) this host's pooled link only: calls on it fail as a reset
    /// connection does, while dedicated connections, each a link of its own, go on.
    pub fn set_pooled_link_down(&self, down: bool) {
        self.pooled_down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    /// The call log, faults, gates, delays and outage of this host.
    pub fn interceptor(&self) -> &Interceptor {
        &self.interceptor
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every domain, by name.
    pub fn domains(&self) -> BTreeMap<String, FakeDomain> {
        self.lock().domains.clone()
    }

    /// Every volume of `pool`, by name.
    pub fn volumes(&self, pool: &str) -> BTreeMap<String, FakeVolume> {
        self.lock().pools.get(pool).map(|(_, v)| v.clone()).unwrap_or_default()
    }

    /// Changes a domain's state out of band (false when there is no such domain).
    pub fn set_state(&self, domain: &str, state: DomainState) -> bool {
        self.lock().domains.get_mut(domain).map(|d| d.state = state).is_some()
    }

    /// Sets what `source` answers for `domain`.
    pub fn set_addresses(
        &self,
        domain: &str,
        source: AddressSource,
        answer: Result<Vec<Interface>, LibvirtError>,
    ) -> bool {
        self.lock()
            .domains
            .get_mut(domain)
            .map(|d| {
                d.addresses.insert(source.name(), answer);
            })
            .is_some()
    }

    /// Replaces (or, with `None`, removes) a domain's metadata element in `namespace`.
    pub fn set_metadata(&self, domain: &str, namespace: &str, element: Option<String>) -> bool {
        self.lock()
            .domains
            .get_mut(domain)
            .map(|d| match element {
                Some(e) => {
                    d.metadata.insert(namespace.to_owned(), e);
                }
                None => {
                    d.metadata.remove(namespace);
                }
            })
            .is_some()
    }

    /// Puts a volume straight into `pool`.
    pub fn put_volume(&self, pool: &str, name: &str, volume: FakeVolume) {
        if let Some((_, volumes)) = self.lock().pools.get_mut(pool) {
            volumes.insert(name.to_owned(), volume);
        }
    }

    /// Removes a volume from `pool` out of band (no call recorded).
    pub fn remove_volume(&self, pool: &str, name: &str) -> bool {
        self.lock()
            .pools
            .get_mut(pool)
            .is_some_and(|(_, volumes)| volumes.remove(name).is_some())
    }

    /// Defines a domain out of band (no call recorded, no fault applied), shut off.
    ///
    /// # Panics
    /// When `xml` is not a domain document the fake can read.
    pub fn define_directly(&self, xml: &str) {
        let (name, metadata) = read_domain(xml).expect("a domain document");
        self.lock().domains.insert(
            name,
            FakeDomain {
                xml: xml.to_owned(),
                state: DomainState::Shutoff,
                metadata,
                addresses: BTreeMap::new(),
                checkpoints: 0,
                snapshots: 0,
            },
        );
    }

    /// Records a checkpoint of `domain` out of band, as `virsh checkpoint-create-as` does
    /// (false when there is no such domain).
    pub fn add_checkpoint(&self, domain: &str) -> bool {
        self.lock()
            .domains
            .get_mut(domain)
            .map(|d| d.checkpoints += 1)
            .is_some()
    }

    /// Records a snapshot of `domain` out of band (false when there is no such domain).
    pub fn add_snapshot(&self, domain: &str) -> bool {
        self.lock().domains.get_mut(domain).map(|d| d.snapshots += 1).is_some()
    }

    /// Removes a domain out of band.
    pub fn remove_domain(&self, domain: &str) -> bool {
        self.lock().domains.remove(domain).is_some()
    }

    /// Every call passes here: the caller's context first (as the real host, a call of a
    /// caller that gave up fails without reaching the daemon), then the interceptor.
    async fn enter(&self, cx: &OpCtx, rpc: &'static str, target: &str, not_found: i32) -> LvResult<()> {
        let interceptor = self.interceptor.enter(egress_conformance::CallKind(rpc), target);
        let outcome = cx.run(interceptor).await;
        self.check_key_file()?;
        let pooled_cut = !self.is_dedicated && self.pooled_down.load(std::sync::atomic::Ordering::SeqCst);
        if pooled_cut || self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LibvirtError::transport(format!(
                "connection to {} is closed: ssh: connection reset",
                self.name
            )));
        }
        match outcome {
            Ok(result) => result.map_err(|fault| fault_error(&fault, not_found)),
            Err(why) => Err(LibvirtError::timeout(format!(
                "libvirt call {rpc} on {} abandoned: {why}",
                self.name
            ))),
        }
    }
}

/// A fault of the suite as libvirt would report it.
fn fault_error(fault: &Fault, not_found: i32) -> LibvirtError {
    match fault {
        Fault::NotFound => LibvirtError::daemon(not_found, "not found"),
        Fault::AlreadyExists => LibvirtError::daemon(code::STORAGE_VOL_EXIST, "already exists"),
        Fault::Quota => LibvirtError::daemon(code::SYSTEM_ERROR, "cannot allocate: No space left on device"),
        Fault::RateLimit | Fault::Busy => LibvirtError::daemon(
            code::OPERATION_INVALID,
            "Requested operation is not valid: another job is running",
        ),
        Fault::Unauthenticated | Fault::PermissionDenied => LibvirtError::daemon(code::ACCESS_DENIED, "access denied"),
        Fault::BadRequest => LibvirtError::daemon(code::INVALID_ARG, "invalid argument"),
        Fault::Server5xx => LibvirtError::daemon(code::INTERNAL_ERROR, "internal error"),
        Fault::Timeout => LibvirtError::timeout("libvirt call exceeded its budget"),
        Fault::ConnectionReset => LibvirtError::transport("connection is closed: ssh: connection reset"),
        Fault::Raw(text) => LibvirtError::daemon(code::INTERNAL_ERROR, text.clone()),
    }
}

fn no_domain(name: &str) -> LibvirtError {
    LibvirtError::daemon(
        code::NO_DOMAIN,
        format!("Domain not found: no domain with matching name '{name}'"),
    )
}

fn no_pool(name: &str) -> LibvirtError {
    LibvirtError::daemon(
        code::NO_STORAGE_POOL,
        format!("Storage pool not found: no storage pool with matching name '{name}'"),
    )
}

fn no_volume(name: &str) -> LibvirtError {
    LibvirtError::daemon(
        code::NO_STORAGE_VOL,
        format!("Storage volume not found: no storage vol with matching name '{name}'"),
    )
}

#[async_trait]
impl Host for FakeHost {
    fn name(&self) -> &str {
        &self.name
    }

    async fn version(&self, cx: &OpCtx) -> LvResult<(u32, String)> {
        self.enter(cx, "ConnectGetLibVersion", "", 0).await?;
        let hostname = self.lock().hostname.clone().unwrap_or_else(|| self.name.clone());
        Ok((9_000_000, hostname))
    }

    async fn domain_names(&self, cx: &OpCtx) -> LvResult<Vec<String>> {
        self.enter(cx, "ConnectListAllDomains", "", 0).await?;
        Ok(self.lock().domains.keys().cloned().collect())
    }

    async fn domain_metadata(&self, cx: &OpCtx, domain: &str, namespace: &str) -> LvResult<Option<String>> {
        self.enter(cx, "DomainGetMetadata", domain, code::NO_DOMAIN).await?;
        let st = self.lock();
        let d = st.domains.get(domain).ok_or_else(|| no_domain(domain))?;
        Ok(d.metadata.get(namespace).cloned())
    }

    async fn set_domain_metadata(&self, cx: &OpCtx, domain: &str, namespace: &str, element: &str) -> LvResult<()> {
        self.enter(cx, "DomainSetMetadata", domain, code::NO_DOMAIN).await?;
        check_element(element)?;
        let mut st = self.lock();
        let d = st.domains.get_mut(domain).ok_or_else(|| no_domain(domain))?;
        // NB: one set of metadata per domain: the live and persistent definitions are not told
        // apart, so a write that reached only one of them cannot be caught here (the seam table
        // checks it against the real daemon).
        d.metadata.insert(namespace.to_owned(), element.trim().to_owned());
        Ok(())
    }

    async fn domain_state(&self, cx: &OpCtx, domain: &str) -> LvResult<DomainState> {
        self.enter(cx, "DomainGetState", domain, code::NO_DOMAIN).await?;
        self.lock()
            .domains
            .get(domain)
            .map(|d| d.state)
            .ok_or_else(|| no_domain(domain))
    }

    async fn define_domain(&self, cx: &OpCtx, xml: &str) -> LvResult<()> {
        let (name, metadata) = read_domain(xml)?;
        self.enter(cx, "DomainDefineXML", &name, 0).await?;
        let mut st = self.lock();
        let entry = st.domains.entry(name).or_insert_with(|| FakeDomain {
            xml: String::new(),
            state: DomainState::Shutoff,
            metadata: BTreeMap::new(),
            addresses: BTreeMap::new(),
            checkpoints: 0,
            snapshots: 0,
        });
        entry.xml = xml.to_owned();
        entry.metadata = metadata;
        Ok(())
    }

    async fn start_domain(&self, cx: &OpCtx, domain: &str) -> LvResult<()> {
        self.enter(cx, "DomainCreate", domain, code::NO_DOMAIN).await?;
        let mut st = self.lock();
        let d = st.domains.get_mut(domain).ok_or_else(|| no_domain(domain))?;
        if d.state.is_active() {
            return Err(LibvirtError::daemon(
                code::OPERATION_INVALID,
                "Requested operation is not valid: domain is already running",
            ));
        }
        d.state = DomainState::Running;
        if let Some([a, b, c]) = st.dhcp {
            st.leased = st.leased.wrapping_add(1).max(2);
            let ip = format!("{a}.{b}.{c}.{}", st.leased);
            if let Some(d) = st.domains.get_mut(domain) {
                // The NIC's MAC as the document sets it (libvirt makes one up otherwise).
                let hwaddr = d
                    .xml
                    .split("<mac address=\"")
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or("52:54:00:00:00:01")
                    .to_owned();
                d.addresses.entry(AddressSource::Agent.name()).or_insert_with(|| {
                    Ok(vec![Interface {
                        name: "eth0".to_owned(),
                        hwaddr,
                        addresses: vec![crate::host::Address { kind: 0, text: ip }],
                    }])
                });
            }
        }
        Ok(())
    }

    async fn destroy_domain(&self, cx: &OpCtx, domain: &str) -> LvResult<()> {
        self.enter(cx, "DomainDestroy", domain, code::NO_DOMAIN).await?;
        let mut st = self.lock();
        let d = st.domains.get_mut(domain).ok_or_else(|| no_domain(domain))?;
        if !d.state.is_active() && !matches!(d.state, DomainState::Paused(_)) {
            return Err(LibvirtError::daemon(
                code::OPERATION_INVALID,
                "Requested operation is not valid: domain is not running",
            ));
        }
        d.state = DomainState::Shutoff;
        Ok(())
    }

    async fn undefine_domain(&self, cx: &OpCtx, domain: &str, flags: u32) -> LvResult<()> {
        self.enter(cx, "DomainUndefineFlags", domain, code::NO_DOMAIN).await?;
        let mut st = self.lock();
        let d = st.domains.get(domain).ok_or_else(|| no_domain(domain))?;
        // libvirt's words and code for metadata the flags do not cover.
        for (count, flag, what) in [
            (d.checkpoints, UNDEFINE_CHECKPOINTS_METADATA, "checkpoints"),
            (d.snapshots, UNDEFINE_SNAPSHOTS_METADATA, "snapshots"),
        ] {
            if count > 0 && flags & flag == 0 {
                return Err(LibvirtError::daemon(
                    code::OPERATION_INVALID,
                    format!("Requested operation is not valid: cannot delete inactive domain with {count} {what}"),
                ));
            }
        }
        st.domains.remove(domain);
        Ok(())
    }

    async fn interface_addresses(&self, cx: &OpCtx, domain: &str, source: AddressSource) -> LvResult<Vec<Interface>> {
        self.enter(cx, "DomainInterfaceAddresses", domain, code::NO_DOMAIN)
            .await?;
        let st = self.lock();
        let d = st.domains.get(domain).ok_or_else(|| no_domain(domain))?;
        if !d.state.is_active() {
            return Err(LibvirtError::daemon(
                code::OPERATION_INVALID,
                "Requested operation is not valid: domain is not running",
            ));
        }
        d.addresses.get(source.name()).cloned().unwrap_or(Ok(Vec::new()))
    }

    async fn pool_info(&self, cx: &OpCtx, pool: &str) -> LvResult<PoolInfo> {
        self.enter(cx, "StoragePoolGetInfo", pool, code::NO_STORAGE_POOL)
            .await?;
        let st = self.lock();
        let (capacity, volumes) = st.pools.get(pool).ok_or_else(|| no_pool(pool))?;
        let allocation: u64 = volumes.values().map(|v| v.bytes.len() as u64).sum();
        Ok(PoolInfo {
            state: POOL_RUNNING,
            capacity: *capacity,
            allocation,
            available: capacity.saturating_sub(allocation),
        })
    }

    async fn refresh_pool(&self, cx: &OpCtx, pool: &str) -> LvResult<()> {
        self.enter(cx, "StoragePoolRefresh", pool, code::NO_STORAGE_POOL)
            .await?;
        self.lock().pools.get(pool).map(drop).ok_or_else(|| no_pool(pool))
    }

    async fn volume_path(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<String> {
        self.enter(cx, "StorageVolGetPath", volume, code::NO_STORAGE_VOL)
            .await?;
        let st = self.lock();
        let (_, volumes) = st.pools.get(pool).ok_or_else(|| no_pool(pool))?;
        volumes
            .get(volume)
            .map(|v| v.path.clone())
            .ok_or_else(|| no_volume(volume))
    }

    async fn create_volume(&self, cx: &OpCtx, pool: &str, xml: &str) -> LvResult<()> {
        let (name, capacity, format, backing) = read_volume(xml)?;
        self.enter(cx, "StorageVolCreateXML", &name, code::NO_STORAGE_POOL)
            .await?;
        let mut st = self.lock();
        let (_, volumes) = st.pools.get_mut(pool).ok_or_else(|| no_pool(pool))?;
        if volumes.contains_key(&name) {
            return Err(LibvirtError::daemon(
                code::STORAGE_VOL_EXIST,
                format!("storage volume '{name}' exists already"),
            ));
        }
        let path = format!("/fake/{pool}/{name}");
        volumes.insert(
            name,
            FakeVolume {
                path,
                capacity,
                format,
                backing,
                bytes: Vec::new(),
            },
        );
        Ok(())
    }

    async fn volume_capacity(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<u64> {
        self.enter(cx, "StorageVolGetInfo", volume, code::NO_STORAGE_VOL)
            .await?;
        let st = self.lock();
        let (_, volumes) = st.pools.get(pool).ok_or_else(|| no_pool(pool))?;
        volumes.get(volume).map(|v| v.capacity).ok_or_else(|| no_volume(volume))
    }

    async fn volume_names(&self, cx: &OpCtx, pool: &str) -> LvResult<Vec<String>> {
        self.enter(cx, "StoragePoolListAllVolumes", pool, code::NO_STORAGE_POOL)
            .await?;
        let st = self.lock();
        let (_, volumes) = st.pools.get(pool).ok_or_else(|| no_pool(pool))?;
        Ok(volumes.keys().cloned().collect())
    }

    async fn delete_volume(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<()> {
        self.enter(cx, "StorageVolDelete", volume, code::NO_STORAGE_VOL).await?;
        let mut st = self.lock();
        let (_, volumes) = st.pools.get_mut(pool).ok_or_else(|| no_pool(pool))?;
        volumes.remove(volume).map(drop).ok_or_else(|| no_volume(volume))
    }

    async fn upload(&self, cx: &OpCtx, pool: &str, volume: &str, length: u64, source: UploadSource) -> LvResult<u64> {
        self.enter(cx, "StorageVolUpload", volume, code::NO_STORAGE_VOL).await?;
        {
            let st = self.lock();
            let (_, volumes) = st.pools.get(pool).ok_or_else(|| no_pool(pool))?;
            volumes.get(volume).ok_or_else(|| no_volume(volume))?;
        }
        // On a blocking thread, as the real host reads it: a source may block (an HTTP body
        // arriving over a channel).
        let (bytes, source_error) = tokio::task::spawn_blocking(move || {
            let mut source = source;
            let mut bytes = Vec::new();
            let mut chunk = [0u8; 64 << 10];
            let mut source_error = None;
            // As libvirt: a length of 0 takes the stream to its end.
            while length == 0 || (bytes.len() as u64) < length {
                match source.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        source_error = Some(e.to_string());
                        break;
                    }
                }
            }
            (bytes, source_error)
        })
        .await
        .map_err(|e| LibvirtError::transport(format!("uploading {volume}: {e}")))?;
        let read = bytes.len() as u64;
        if let Some((_, volumes)) = self.lock().pools.get_mut(pool)
            && let Some(v) = volumes.get_mut(volume)
        {
            v.bytes = bytes;
        }
        match source_error {
            Some(e) => Err(LibvirtError::transport(format!(
                "reading the upload source for {volume}: {e}"
            ))),
            None => Ok(read),
        }
    }

    async fn download(&self, cx: &OpCtx, pool: &str, volume: &str, max: usize) -> LvResult<Vec<u8>> {
        self.enter(cx, "StorageVolDownload", volume, code::NO_STORAGE_VOL)
            .await?;
        let st = self.lock();
        let (_, volumes) = st.pools.get(pool).ok_or_else(|| no_pool(pool))?;
        let v = volumes.get(volume).ok_or_else(|| no_volume(volume))?;
        Ok(v.bytes[..v.bytes.len().min(max)].to_vec())
    }

    async fn close(self: Box<Self>) {
        // Recorded, so a test can see when a dedicated connection was let go of.
        let _ = self.interceptor.enter(egress_conformance::CallKind("Close"), "").await;
    }

    async fn dedicated(&self, cx: &OpCtx) -> LvResult<Box<dyn Host>> {
        // A link of its own: the pooled link's fate is not its fate. (The host's state, the
        // interceptor and a whole-host outage are shared, as on a real host.)
        let own = Self {
            is_dedicated: true,
            ..self.clone()
        };
        own.enter(cx, "Dial", "", 0).await?;
        Ok(Box::new(own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn documents_it_cannot_read_are_refused_as_libvirt_would() {
        let fake = FakeHost::new("hv", "default", 1 << 30);
        let cx = OpCtx::background();
        for xml in [
            "",
            "not xml <",
            "<domain type='qemu'><memory>1</memory></domain>",
            "<domain><name>x</domain>",
        ] {
            let e = fake.define_domain(&cx, xml).await.unwrap_err();
            assert!(e.is(code::INVALID_ARG), "{xml:?}: {e}");
        }
        for xml in [
            "",
            "<volume><capacity unit='bytes'>1</capacity></volume>",
            "<volume><name>v</name><capacity unit='bytes'>lots</capacity></volume>",
        ] {
            let e = fake.create_volume(&cx, "default", xml).await.unwrap_err();
            assert!(e.is(code::INVALID_ARG), "{xml:?}: {e}");
        }
        assert!(fake.domains().is_empty() && fake.volumes("default").is_empty());
    }
}
