//! A libvirt provider (kvm or kvm2) over the [`Host`] seam: create, get, delete, list, mark (in
//! `provider/mark.rs`) and the health check of spec/kvm.md §7 and §10, with the review's fixes
//! (each named where it lands).
//!
//! Long file: the five operations and the health check of one provider share their helpers
//! (placement, marks, error mapping) and the fixes that span them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use crate::config::KvmConfig;
use crate::host::{DomainState, Host, POOL_RUNNING, UNDEFINE_FLAGS, code};
use crate::seed::{SeedError, seed_iso_with, vendor_data};
use crate::{DomainSpec, Mark, VolumeSpec};
use async_trait::async_trait;
use egress_provider::{
    BoxError, Checker, CreateRequest, Instance, OpCtx, Provider, ProviderError, ProviderId, TargetStatus, is_identifier,
};
use futures::StreamExt as _;

use crate::generation::Generation;
use super::failure::{self, Context as _, OpFailure};
use super::image::{self, Cached};
use super::locks::KeyedLocks;
use super::placement::{self, Resolved};
use super::traced::{Traced, error_name};
use super::{check, id, observe, ops};
use crate::names;

mod mark;

/// Bytes kept free for the seed in the pool-space check.
const SEED_RESERVE: u64 = 16 << 20;
/// How long a started domain may take to report running.
const RUNNING_CAP: Duration = Duration::from_secs(15);
/// How often the state is read while waiting for running.
const RUNNING_POLL: Duration = Duration::from_millis(500);
/// Hosts checked at once (review L19).
const CHECK_CONCURRENCY: usize = 8;
/// The longest hostname a check reports (review L18: a DNS name's limit).
const HOSTNAME_MAX: usize = 253;
/// Cleaning up after a failed create: bounded, and not cut short by the caller.
const CLEANUP_BUDGET: Duration = Duration::from_secs(30);

/// A libvirt provider (kvm or kvm2) of one config entry.
#[derive(Clone, Debug)]
pub struct LibvirtProvider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    generation: Generation,
    entry: String,
    cfg: KvmConfig,
    /// Every configured host, by name, its calls observed.
    hosts: BTreeMap<String, Arc<dyn Host>>,
    /// Downloads of catalogue images (the operator's own URLs).
    http: reqwest::Client,
    /// Downloads of the URLs Proxies give: redirects stay on `imageUrlHosts` when it is set.
    url_http: reqwest::Client,
    /// Create and delete of one name take turns.
    names: KeyedLocks,
    /// One download per image and host at a time.
    images: KeyedLocks,
    /// This instance's id in the fill leases of the image cache (`super::fence`).
    writer: String,
    /// kvm: per host, whether a health probe is still out.
    probing: BTreeMap<String, Arc<AtomicBool>>,
}

impl LibvirtProvider {
    /// The `generation` provider of entry `entry` with the validated block `cfg`, reaching each
    /// configured host through the [`Host`] of the same name in `hosts`. Dials nothing.
    ///
    /// # Errors
    /// kvm2: an entry name that cannot be part of a volume name. A configured host without a
    /// [`Host`]; the HTTP client failing to build.
    pub fn new(
        generation: Generation,
        entry: &str,
        cfg: KvmConfig,
        hosts: Vec<Box<dyn Host>>,
    ) -> Result<Self, BoxError> {
        if generation == Generation::Kvm2 && !is_identifier(entry) {
            return Err(format!(
                "provider name {entry:?}: kvm2 names its cached base images after the entry, so the name must be \
                 letters, digits, dots, dashes or underscores"
            )
            .into());
        }
        warn_about_files(&cfg);
        let mut by_name: BTreeMap<String, Arc<dyn Host>> = BTreeMap::new();
        for host in hosts {
            by_name.insert(host.name().to_owned(), Arc::new(Traced::new(host, generation)));
        }
        if let Some(missing) = cfg.hosts.iter().find(|h| !by_name.contains_key(&h.name)) {
            return Err(format!("host {:?} has no connection", missing.name).into());
        }
        let probing = cfg.hosts.iter().map(|h| (h.name.clone(), Arc::default())).collect();
        let url_http = image::http_client(cfg.image_url_hosts.clone())?;
        Ok(Self {
            shared: Arc::new(Shared {
                generation,
                probing,
                entry: entry.to_owned(),
                cfg,
                hosts: by_name,
                http: image::http_client(None)?,
                url_http,
                names: KeyedLocks::new(),
                images: KeyedLocks::new(),
                writer: super::fence::new_writer_id(),
            }),
        })
    }

    fn generation(&self) -> Generation {
        self.shared.generation
    }

    fn block(&self) -> &'static str {
        self.shared.generation.block()
    }

    fn host(&self, name: &str) -> Option<&Arc<dyn Host>> {
        self.shared.hosts.get(name)
    }

    fn fail(&self, op: egress_provider::Op, id: &str, failure: OpFailure) -> ProviderError {
        self.fail_scrubbed(op, id, failure, b"")
    }

    /// As `fail`, with any echo of `cloud_init` taken out of the log line and the error.
    fn fail_scrubbed(&self, op: egress_provider::Op, id: &str, failure: OpFailure, cloud_init: &[u8]) -> ProviderError {
        let shown = failure.shown(cloud_init);
        match failure.libvirt() {
            Some(e) if !e.transport => {
                tracing::debug!(op = op.as_str(), id, error = %shown, libvirtCode = e.code, libvirtError = %error_name(e.code), "{} backend call failed", self.generation().label());
            }
            _ => {
                tracing::debug!(op = op.as_str(), id, error = %shown, "{} backend call failed", self.generation().label())
            }
        }
        failure.into_provider_error(self.generation(), op, &self.shared.entry, id, cloud_init)
    }
}

/// The startup warnings: SSH files not readable yet (the Secret may be mounted later; calls
/// fail until it is), host keys not checked, images fetched without integrity (review M17:
/// warned, not refused, so existing configs keep loading).
fn warn_about_files(cfg: &KvmConfig) {
    let unreadable = |path: &str| std::fs::metadata(path).err().map(|e| e.to_string());
    if let Some(reason) = unreadable(&cfg.ssh_key_file) {
        tracing::warn!(path = %cfg.ssh_key_file, reason, "WARNING: ssh key file is not readable; every call fails until it is");
    }
    if cfg.insecure_ignore_host_key {
        tracing::warn!("WARNING: insecureIgnoreHostKey is set; host keys are not verified");
    } else if let Some(reason) = unreadable(&cfg.known_hosts_file) {
        tracing::warn!(path = %cfg.known_hosts_file, reason, "WARNING: known_hosts file is not readable; every call fails until it is");
    }
    for (key, image) in &cfg.images {
        if image.sha256.is_empty() && image.url.to_ascii_lowercase().starts_with("http://") {
            tracing::warn!(image = %key, "WARNING: image is fetched over plain http without a sha256; its content is not verified");
        }
    }
}

/// The mark of an existing domain, checked for adoption by Proxy `uid`.
fn adoption(generation: Generation, name: &str, element: Option<String>, uid: &str) -> Result<Mark, OpFailure> {
    let mark = owned_mark(generation, name, element)?;
    if !mark.uid.is_empty() && !mark.uid.eq_ignore_ascii_case(uid) {
        return Err(OpFailure::permanent(format!(
            "domain {name} belongs to proxy uid {}, not {uid}",
            mark.uid
        )));
    }
    Ok(mark)
}

/// The provider's mark on domain `name`, which must carry one (review M2: a domain this
/// provider did not make is neither adopted, nor reported, nor deleted).
fn owned_mark(generation: Generation, name: &str, element: Option<String>) -> Result<Mark, OpFailure> {
    let not_ours = || {
        OpFailure::permanent(format!(
            "domain {name} exists but is not managed by this provider: it carries no {} mark",
            generation.block()
        ))
    };
    let element = element.ok_or_else(not_ours)?;
    let mark = Mark::parse(&element).map_err(|e| OpFailure::permanent(format!("domain {name}: {e}")))?;
    if mark.managed { Ok(mark) } else { Err(not_ours()) }
}

/// A context for cleanups: the caller cannot cut it short; bounded by [`CLEANUP_BUDGET`].
fn cleanup_cx() -> OpCtx {
    OpCtx::background().with_timeout(CLEANUP_BUDGET)
}

impl LibvirtProvider {
    async fn create_on(
        &self,
        cx: &OpCtx,
        host: &dyn Host,
        r: &Resolved<'_>,
        req: &CreateRequest,
    ) -> Result<(), OpFailure> {
        let name = req.name.as_str();
        let pool = r.host.effective_pool();
        let generation = self.generation();
        match host.domain_metadata(cx, name, generation.namespace()).await {
            Ok(element) => {
                let mark = adoption(generation, name, element, &req.uid)?;
                tracing::debug!(host = host.name(), name, uid = %mark.uid, "{} domain already defined", generation.label());
                if !self.volumes_gone(cx, host, pool, name).await? {
                    return ensure_running(cx, host, name).await;
                }
                // Review L4: a stopped domain of ours whose overlay or seed is gone can never
                // start; it is defined again, from the volumes up.
                tracing::debug!(
                    host = host.name(),
                    name,
                    "the domain's volumes are gone; defining it again"
                );
                match host.undefine_domain(cx, name, UNDEFINE_FLAGS).await {
                    Err(e) if !e.is(code::NO_DOMAIN) => {
                        return Err(OpFailure::call(
                            format!("undefining domain {name} without its volumes"),
                            e,
                        ));
                    }
                    _ => {}
                }
            }
            Err(e) if e.is(code::NO_DOMAIN) => {}
            Err(e) => return Err(OpFailure::call(format!("looking up domain {name}"), e)),
        }

        // A URL image's format, read only now: adopting a domain needs no image.
        let mut resolved = r.clone();
        let http = if resolved.image.from_url {
            &self.shared.url_http
        } else {
            &self.shared.http
        };
        if resolved.image.from_url {
            resolved.image.format =
                image::url_format(cx, host, http, generation, &self.shared.entry, pool, &resolved.image).await?;
        }
        let r = &resolved;
        let mut img = Cached::new(
            generation,
            &self.shared.entry,
            &r.host.name,
            pool,
            &r.image,
            &self.shared.writer,
        );
        img.room_after = disk_bytes(&self.shared.cfg, self.generation())?.saturating_add(SEED_RESERVE);
        // The first look at the pool (the marker lookup) is where a missing pool is a config
        // error; once seen, a pool missing is one that vanished during the create: a race.
        let image_bytes = image::size_if_uncached(cx, host, http, &img).await?;
        let rest = async {
            self.check_pool_space(cx, host, &img, image_bytes).await?;
            let path = image::ensure(cx, host, http, &self.shared.images, &img).await?;
            let size = host
                .volume_capacity(cx, pool, &img.base)
                .await
                .doing(|| format!("reading the size of base volume {}", img.base))?;
            // Review M5: an overlay smaller than its image would cut the guest's disk short.
            let disk = disk_bytes(&self.shared.cfg, self.generation())?;
            if size > disk {
                return Err(OpFailure::permanent(format!(
                    "image {} has a virtual size of {size} bytes, more than the {disk} bytes of {}.diskSizeGb \
                     ({} GiB): raise diskSizeGb",
                    img.base,
                    generation.block(),
                    self.shared.cfg.effective_disk_size_gb()
                )));
            }
            self.define_or_clean(cx, host, r, req, &Base { path, size }).await?;
            ensure_running(cx, host, name).await
        };
        rest.await.map_err(|f| match f.libvirt() {
            Some(e) if e.is(code::NO_STORAGE_POOL) => {
                OpFailure::transient(format!("{f} (the pool vanished during the create)"))
            }
            _ => f,
        })
    }

    /// Overlay, seed and domain; the volumes made are removed again when the domain could not
    /// be defined (review M3).
    async fn define_or_clean(
        &self,
        cx: &OpCtx,
        host: &dyn Host,
        r: &Resolved<'_>,
        req: &CreateRequest,
        base: &Base,
    ) -> Result<(), OpFailure> {
        let (name, pool) = (req.name.as_str(), r.host.effective_pool());
        let defined = self.define(cx, host, r, req, base).await;
        // A call whose connection failed may have been carried out all the same: the domain
        // may exist, using these volumes. Only a definite failure cleans up.
        if let Err(e) = defined
            && !e.libvirt().is_some_and(|l| l.transport)
        {
            let cleanup = cleanup_cx();
            for volume in [names::overlay(name), names::seed(name)] {
                if let Err(d) = host.delete_volume(&cleanup, pool, &volume).await
                    && !d.is(code::NO_STORAGE_VOL)
                {
                    tracing::debug!(host = host.name(), name, volume, error = %d, "volume of an undefined domain left behind; the next delete removes it");
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// Whether stopped domain `name` lost its overlay or seed (a running one has them open and
    /// is left alone).
    async fn volumes_gone(&self, cx: &OpCtx, host: &dyn Host, pool: &str, name: &str) -> Result<bool, OpFailure> {
        let state = host
            .domain_state(cx, name)
            .await
            .doing(|| format!("reading the state of domain {name}"))?;
        if state.is_active() || matches!(state, DomainState::Paused(_) | DomainState::PmSuspended) {
            return Ok(false);
        }
        for volume in [names::overlay(name), names::seed(name)] {
            match host.volume_path(cx, pool, &volume).await {
                Ok(_) => {}
                Err(e) if e.is(code::NO_STORAGE_VOL) => return Ok(true),
                Err(e) => return Err(OpFailure::call(format!("looking up volume {volume}"), e)),
            }
        }
        Ok(false)
    }

    /// The pool-space precheck: the image (`image_bytes`, 0 when cached), the overlay and the
    /// seed must fit in what the pool has free, read after a refresh (review M4).
    async fn check_pool_space(
        &self,
        cx: &OpCtx,
        host: &dyn Host,
        img: &Cached<'_>,
        image_bytes: u64,
    ) -> Result<(), OpFailure> {
        let disk = disk_bytes(&self.shared.cfg, self.generation())?;
        let needed = image_bytes
            .checked_add(disk)
            .and_then(|n| n.checked_add(SEED_RESERVE))
            .ok_or_else(|| OpFailure::permanent("the pool space needed overflows".to_owned()))?;
        match host.refresh_pool(cx, img.pool).await {
            Ok(()) => {}
            // libvirt refuses a refresh while an upload into the pool runs ("pool has
            // asynchronous jobs running"): its last numbers are the best there are then.
            Err(e) if !e.transport && !e.is(code::NO_STORAGE_POOL) => {
                tracing::debug!(host = host.name(), pool = img.pool, error = %e, "pool refresh refused; using libvirt's last numbers");
            }
            Err(e) => return Err(OpFailure::call(format!("refreshing storage pool {}", img.pool), e)),
        }
        let info = host
            .pool_info(cx, img.pool)
            .await
            .doing(|| format!("reading storage pool {}", img.pool))?;
        if info.state != POOL_RUNNING {
            return Err(OpFailure::permanent(format!(
                "storage pool {} is not running (state {})",
                img.pool,
                check::pool_state_name(info.state)
            )));
        }
        // Review M4: libvirt's free space includes the filesystem's root reserve, which QEMU
        // cannot write to; a twentieth of the pool is kept free on top.
        let usable = info
            .available
            .saturating_sub(super::image::pool_headroom(info.capacity));
        if usable < needed {
            return Err(OpFailure::quota(format!(
                "storage pool {} has {} bytes available ({usable} once 5% of the pool is kept free), {needed} needed",
                img.pool, info.available
            )));
        }
        Ok(())
    }

    /// The overlay of the domain: made, or an existing one reused (creation is atomic in
    /// libvirt, so one that exists is complete), unless it is smaller than the image (a
    /// leftover of another size, review M5): then it is made again.
    async fn ensure_overlay(
        &self,
        cx: &OpCtx,
        host: &dyn Host,
        pool: &str,
        overlay: &str,
        r: &Resolved<'_>,
        base: &Base,
    ) -> Result<(), OpFailure> {
        let xml = VolumeSpec {
            name: overlay.to_owned(),
            capacity_bytes: i64::try_from(disk_bytes(&self.shared.cfg, self.generation())?).unwrap_or(i64::MAX),
            format: "qcow2".to_owned(),
            backing: Some((base.path.clone(), r.image.format.clone())),
        }
        .to_xml(self.generation())
        .map_err(|e| OpFailure::permanent(e.to_string()))?;
        let creating = || format!("creating overlay volume {overlay}");
        match host.create_volume(cx, pool, &xml).await {
            Ok(()) => {
                tracing::debug!(host = host.name(), volume = overlay, base = %base.path, "overlay volume created");
                return Ok(());
            }
            Err(e) if e.is(code::STORAGE_VOL_EXIST) => {}
            Err(e) => return Err(OpFailure::call(creating(), e)),
        }
        let size = host
            .volume_capacity(cx, pool, overlay)
            .await
            .doing(|| format!("reading the size of overlay volume {overlay}"))?;
        if size >= base.size {
            tracing::debug!(host = host.name(), volume = overlay, "overlay volume already exists");
            return Ok(());
        }
        tracing::debug!(
            host = host.name(),
            volume = overlay,
            bytes = size,
            "overlay volume smaller than its image; making it again"
        );
        host.delete_volume(cx, pool, overlay)
            .await
            .doing(|| format!("removing short overlay volume {overlay}"))?;
        host.create_volume(cx, pool, &xml).await.doing(creating)
    }

    /// Overlay, seed and domain definition.
    async fn define(
        &self,
        cx: &OpCtx,
        host: &dyn Host,
        r: &Resolved<'_>,
        req: &CreateRequest,
        base: &Base,
    ) -> Result<(), OpFailure> {
        let cfg = &self.shared.cfg;
        let name = req.name.as_str();
        let pool = r.host.effective_pool();

        let overlay = names::overlay(name);
        self.ensure_overlay(cx, host, pool, &overlay, r, base).await?;

        // The seed is always rebuilt: an earlier attempt may have died half way through it.
        let seed = names::seed(name);
        match host.delete_volume(cx, pool, &seed).await {
            Err(e) if !e.is(code::NO_STORAGE_VOL) => {
                return Err(OpFailure::call(format!("removing old seed volume {seed}"), e));
            }
            _ => {}
        }
        let vendor = vendor_data(cfg.vendor_data.as_bytes(), cfg.effective_install_guest_agent());
        let htpasswd = req.credentials.as_ref().map(|c| c.htpasswd.as_str());
        let iso = seed_iso_with(name, &req.cloud_init, &vendor, htpasswd).map_err(seed_failure)?;
        let xml = VolumeSpec {
            name: seed.clone(),
            capacity_bytes: i64::try_from(iso.len()).unwrap_or(i64::MAX),
            format: "raw".to_owned(),
            backing: None,
        }
        .to_xml(self.generation())
        .map_err(|e| OpFailure::permanent(e.to_string()))?;
        host.create_volume(cx, pool, &xml)
            .await
            .doing(|| format!("creating seed volume {seed}"))?;
        let bytes = iso.len();
        host.upload(cx, pool, &seed, bytes as u64, Box::new(std::io::Cursor::new(iso)))
            .await
            .doing(|| format!("uploading seed volume {seed}"))?;
        tracing::debug!(host = host.name(), name, volume = %seed, bytes, "seed volume uploaded");

        let disk_path = host
            .volume_path(cx, pool, &overlay)
            .await
            .doing(|| format!("reading the path of overlay volume {overlay}"))?;
        let seed_path = host
            .volume_path(cx, pool, &seed)
            .await
            .doing(|| format!("reading the path of seed volume {seed}"))?;
        let mut mark = Mark::new(req.uid.clone(), SystemTime::now());
        mark.installation.clone_from(&req.installation);
        let xml = DomainSpec {
            name: name.to_owned(),
            memory_mib: r.memory_mib,
            vcpus: r.vcpus,
            mark,
            firmware: r.image.firmware.clone(),
            domain_type: cfg.effective_domain_type().to_owned(),
            cpu_mode: cfg.effective_cpu_mode().map(str::to_owned),
            disk_path,
            disk_format: "qcow2".to_owned(),
            seed_path,
            bridge: r.host.bridge.clone(),
            mac: Some(names::mac(name)),
        }
        .to_xml(self.generation())
        .map_err(|e| OpFailure::permanent(e.to_string()))?;
        host.define_domain(cx, &xml)
            .await
            .doing(|| format!("defining domain {name}"))?;
        tracing::debug!(host = host.name(), name, uid = %req.uid, firmware = %r.image.firmware, "domain defined");
        tracing::trace!(host = host.name(), name, xml = %xml, "domain document");
        Ok(())
    }
}

/// What a seed that could not be built means: only a missing name is the request's fault
/// (review M8: a writer failure is retried).
fn seed_failure(e: SeedError) -> OpFailure {
    match e {
        SeedError::EmptyName => OpFailure::permanent(e.to_string()),
        SeedError::Write { .. } => OpFailure::transient(e.to_string()),
    }
}

/// The cached base image of a create.
struct Base {
    /// Its path on the host.
    path: String,
    /// Its virtual size.
    size: u64,
}

/// The overlay's size in bytes.
fn disk_bytes(cfg: &KvmConfig, generation: Generation) -> Result<u64, OpFailure> {
    u64::try_from(cfg.effective_disk_size_gb())
        .ok()
        .and_then(|gib| gib.checked_mul(1 << 30))
        .ok_or_else(|| OpFailure::permanent(format!("{}.diskSizeGb is out of range", generation.block())))
}

/// Starts domain `name` unless it runs, and waits (15 s at most) until libvirt reports it
/// running. A paused or suspended domain is an administrator's doing and is left alone.
async fn ensure_running(cx: &OpCtx, host: &dyn Host, name: &str) -> Result<(), OpFailure> {
    let state = host
        .domain_state(cx, name)
        .await
        .doing(|| format!("reading the state of domain {name}"))?;
    if state.is_active() {
        return Ok(());
    }
    if matches!(state, DomainState::Paused(_) | DomainState::PmSuspended) {
        return Err(OpFailure::permanent(format!(
            "domain {name} is {} and cannot be started by the operator; resume or destroy it on the host",
            state.name()
        )));
    }
    match host.start_domain(cx, name).await {
        Ok(()) => tracing::debug!(host = host.name(), name, "domain started"),
        Err(e) if e.is(code::OPERATION_INVALID) => {
            tracing::debug!(host = host.name(), name, "domain start reported it already running");
        }
        Err(e) => return Err(OpFailure::call(format!("starting domain {name}"), e)),
    }
    let started = Instant::now();
    loop {
        let state = host
            .domain_state(cx, name)
            .await
            .doing(|| format!("reading the state of domain {name}"))?;
        match state {
            s if s.is_active() => return Ok(()),
            DomainState::NoState => {}
            other => {
                return Err(OpFailure::transient(format!(
                    "domain {name} went {} right after start",
                    other.name()
                )));
            }
        }
        if started.elapsed() >= RUNNING_CAP {
            return Err(OpFailure::transient(format!(
                "domain {name} did not reach running within 15s (state {})",
                state.name()
            )));
        }
        if let Err(why) = cx.run(tokio::time::sleep(RUNNING_POLL)).await {
            return Err(OpFailure::transient(format!("waiting for domain {name} to run: {why}")));
        }
    }
}

#[async_trait]
impl Provider for LibvirtProvider {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let op = egress_provider::Op::Create;
        let resolved = placement::resolve(self.generation(), &self.shared.cfg, &req.placement)
            .map_err(|m| self.fail(op, "", OpFailure::permanent(m)))?;
        let id = id::format(&resolved.host.name, &req.name);
        let img = Cached::new(
            self.generation(),
            &self.shared.entry,
            &resolved.host.name,
            resolved.host.effective_pool(),
            &resolved.image,
            &self.shared.writer,
        );
        tracing::trace!(
            host = %resolved.host.name,
            name = %req.name,
            pool = %img.pool,
            bridge = %resolved.host.bridge,
            machineType = %req.placement.machine_type,
            vcpus = resolved.vcpus,
            memoryMiB = resolved.memory_mib,
            diskSizeGb = self.shared.cfg.effective_disk_size_gb(),
            image = %img.base,
            firmware = %resolved.image.firmware,
            cloudInitBytes = req.cloud_init.len(),
            "{} create resolved",
            self.generation().label()
        );
        let Some(host) = self.host(&resolved.host.name).cloned() else {
            return Err(self.fail(
                op,
                &id,
                OpFailure::permanent(format!("host {:?} has no connection", resolved.host.name)),
            ));
        };
        let _turn = self.shared.names.acquire(cx, &req.name).await.map_err(|why| {
            self.fail(
                op,
                &id,
                OpFailure::transient(format!("waiting for the lock on {}: {why}", req.name)),
            )
        })?;
        failure::guarding(&req.cloud_init, self.create_on(cx, host.as_ref(), &resolved, req))
            .await
            .map_err(|f| self.fail_scrubbed(op, &id, f, &req.cloud_init))?;
        tracing::debug!(host = %resolved.host.name, name = %req.name, id = %id, "{} domain ensured running", self.generation().label());
        Ok(ProviderId::new(id))
    }

    async fn get(&self, cx: &OpCtx, pid: &ProviderId) -> Result<Instance, ProviderError> {
        let op = egress_provider::Op::Get;
        let id = pid.as_str();
        let (host_name, name) = id::parse(id).map_err(|m| self.fail(op, id, OpFailure::permanent(m)))?;
        let host = self.host(host_name).ok_or_else(|| {
            self.fail(
                op,
                id,
                OpFailure::permanent(format!("host {host_name:?} is not in {}.hosts", self.block())),
            )
        })?;
        let read = async {
            let generation = self.generation();
            let element = match host.domain_metadata(cx, name, generation.namespace()).await {
                Err(e) if e.is(code::NO_DOMAIN) => {
                    tracing::debug!(host = host_name, name, "{} domain not found", generation.label());
                    return Err(OpFailure::call(format!("looking up domain {name}"), e));
                }
                other => other.doing(|| format!("reading the mark of domain {name}"))?,
            };
            let mark = owned_mark(generation, name, element)?;
            let state = host
                .domain_state(cx, name)
                .await
                .doing(|| format!("reading the state of domain {name}"))?;
            let ip = if state.is_active() {
                observe::discover(cx, host.as_ref(), generation, name).await?
            } else {
                None
            };
            Ok((mark, state, ip))
        };
        let (mark, state, ip) = read.await.map_err(|f| self.fail(op, id, f))?;
        let instance = Instance::new(pid.clone(), observe::map_state(state, ip.is_some()))
            .with_ip(ip)
            .with_uid(mark.uid.clone())
            .with_created_at(mark.created_at.map(not_in_future))
            .with_installation(mark.installation);
        tracing::debug!(host = host_name, name, state = ?instance.state, ip = ?instance.ip, uid = %instance.uid, "{} domain fetched", self.generation().label());
        Ok(instance)
    }

    async fn delete(&self, cx: &OpCtx, pid: &ProviderId) -> Result<(), ProviderError> {
        let op = egress_provider::Op::Delete;
        let id = pid.as_str();
        let (host_name, name) = id::parse(id).map_err(|m| self.fail(op, id, OpFailure::permanent(m)))?;
        let Some(host) = self.host(host_name) else {
            tracing::debug!(id, "host is not configured; delete has nothing to clean up");
            return Ok(());
        };
        let pool = self
            .shared
            .cfg
            .hosts
            .iter()
            .find(|h| h.name == host_name)
            .map_or("default", |h| h.effective_pool());
        let _turn = self.shared.names.acquire(cx, name).await.map_err(|why| {
            self.fail(
                op,
                id,
                OpFailure::transient(format!("waiting for the lock on {name}: {why}")),
            )
        })?;
        let work = async {
            match host.domain_metadata(cx, name, self.generation().namespace()).await {
                // Gone: its volumes may still be there (a create that died before its define).
                Err(e) if e.is(code::NO_DOMAIN) => tracing::debug!(host = host_name, name, "domain already gone"),
                Err(e) => return Err(OpFailure::call(format!("reading the mark of domain {name}"), e)),
                Ok(element) => {
                    // Review M2: a domain this provider did not make is left as it is, and so
                    // are the volumes of its name.
                    if let Err(why) = owned_mark(self.generation(), name, element) {
                        tracing::info!(host = host_name, name, reason = %why, "delete leaves a domain it does not manage");
                        return Ok(());
                    }
                }
            }
            ops::remove(cx, host.as_ref(), pool, name)
                .await
                .doing(|| format!("removing domain {name}"))
        };
        work.await.map_err(|f| self.fail(op, id, f))?;
        tracing::debug!(host = host_name, name, "{} domain deleted", self.generation().label());
        Ok(())
    }

    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        let op = egress_provider::Op::List;
        let mut all = Vec::new();
        for h in &self.shared.cfg.hosts {
            let Some(host) = self.host(&h.name) else { continue };
            let found = ops::list_marked(cx, host.as_ref(), self.generation().namespace())
                .await
                .doing(|| format!("listing domains on host {}", h.name))
                .map_err(|f| self.fail(op, "", f))?;
            for instance in found {
                let instance = match self.generation() {
                    // The first generation lists whole instances (state and address too).
                    Generation::Kvm => match self.inspect(cx, host.as_ref(), instance).await {
                        Ok(Some(whole)) => whole,
                        Ok(None) => continue,
                        Err(f) => return Err(self.fail(op, "", f)),
                    },
                    Generation::Kvm2 => instance,
                };
                tracing::trace!(id = %instance.id.as_str(), uid = %instance.uid, createdAt = ?instance.created_at, "{} listed instance", self.generation().label());
                all.push(Instance {
                    created_at: instance.created_at.map(not_in_future),
                    ..instance
                });
            }
        }
        tracing::debug!(
            hosts = self.shared.cfg.hosts.len(),
            managed = all.len(),
            "{} domains listed",
            self.generation().label()
        );
        Ok(all)
    }

    async fn mark_installation(&self, cx: &OpCtx, pid: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        self.mark(cx, pid, installation).await
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(self.clone()))
    }
}

impl LibvirtProvider {
    /// A listed instance with its state and address (kvm); `None`, with a log line, when the
    /// domain cannot be inspected (gone meanwhile, say).
    ///
    /// # Errors
    /// A failed connection or a caller that gave up: the whole list fails (review M15).
    async fn inspect(&self, cx: &OpCtx, host: &dyn Host, instance: Instance) -> Result<Option<Instance>, OpFailure> {
        let Ok((_, name)) = id::parse(instance.id.as_str()) else {
            return Ok(None);
        };
        let name = name.to_owned();
        let read = async {
            let state = host
                .domain_state(cx, &name)
                .await
                .doing(|| format!("reading the state of domain {name}"))?;
            let ip = if state.is_active() {
                observe::discover(cx, host, self.generation(), &name).await?
            } else {
                None
            };
            Ok::<_, OpFailure>((state, ip))
        };
        match read.await {
            Ok((state, ip)) => Ok(Some(
                Instance {
                    state: observe::map_state(state, ip.is_some()),
                    ..instance
                }
                .with_ip(ip),
            )),
            Err(f) if f.libvirt().is_some_and(|e| e.transport) || cx.interrupted().is_some() => Err(f),
            Err(f) => {
                tracing::debug!(host = host.name(), name = %name, error = %f, "skipping domain that could not be inspected");
                Ok(None)
            }
        }
    }
}

/// Review L9: a creation time in the future (a host clock ahead) reads as now, so GC's age
/// rule still applies to a true orphan.
fn not_in_future(at: SystemTime) -> SystemTime {
    at.min(SystemTime::now())
}

#[async_trait]
impl Checker for LibvirtProvider {
    async fn check(&self, cx: &OpCtx) -> Vec<TargetStatus> {
        let checks: Vec<futures::future::BoxFuture<'_, TargetStatus>> = self
            .shared
            .cfg
            .hosts
            .iter()
            .map(|h| {
                Box::pin(async move {
                    match self.host(&h.name) {
                        Some(host) => {
                            let pool = h.effective_pool();
                            let mut status = match self.generation() {
                                Generation::Kvm2 => {
                                    check::check_host(cx, host.as_ref(), &h.address, &h.user, pool).await
                                }
                                Generation::Kvm => {
                                    let probing = self.shared.probing.get(&h.name).cloned().unwrap_or_default();
                                    check::check_host_kvm(cx, host.clone(), &h.address, &h.user, pool, probing).await
                                }
                            };
                            if let Some(hostname) = status.details.get_mut("hostname") {
                                truncate(hostname, HOSTNAME_MAX);
                            }
                            status
                        }
                        None => TargetStatus::failed(
                            &h.name,
                            &h.address,
                            egress_provider::REASON_UNREACHABLE,
                            "no connection",
                            Duration::from_nanos(1),
                        ),
                    }
                }) as futures::future::BoxFuture<'_, TargetStatus>
            })
            .collect();
        futures::stream::iter(checks)
            .buffered(CHECK_CONCURRENCY)
            .collect()
            .await
    }
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use egress_provider::{ErrorClass, Op};

    use super::*;

    #[test]
    fn m8_only_a_missing_name_makes_a_seed_failure_permanent() {
        assert_eq!(
            seed_failure(SeedError::EmptyName).class(Op::Create),
            ErrorClass::Permanent
        );
        let write = SeedError::Write {
            name: "vm".into(),
            reason: "out of memory".into(),
        };
        assert_eq!(seed_failure(write).class(Op::Create), ErrorClass::Transient);
    }

    /// Review L20: the load refuses such sizes, and the arithmetic behind the pool-space check
    /// refuses them again rather than wrapping to a small number that would always fit.
    #[test]
    fn l20_an_overlay_size_that_would_wrap_is_refused() {
        let cfg = |gib: i64| KvmConfig {
            disk_size_gb: gib,
            ..KvmConfig::default()
        };
        assert_eq!(disk_bytes(&cfg(20), Generation::Kvm2).unwrap(), 20 << 30);
        // 2^34 GiB is 2^64 bytes: zero once wrapped.
        for gib in [17_179_869_184, i64::MAX] {
            let refused = disk_bytes(&cfg(gib), Generation::Kvm2).unwrap_err();
            assert_eq!(refused.class(Op::Create), ErrorClass::Permanent);
            assert_eq!(refused.to_string(), "kvm2.diskSizeGb is out of range");
        }
    }

    #[test]
    fn l18_a_hostname_is_cut_on_a_character_boundary() {
        let mut long = "é".repeat(200);
        truncate(&mut long, HOSTNAME_MAX);
        assert!(long.len() <= HOSTNAME_MAX && long.chars().all(|c| c == 'é'));
        let mut short = "beelink".to_owned();
        truncate(&mut short, HOSTNAME_MAX);
        assert_eq!(short, "beelink");
    }
}
