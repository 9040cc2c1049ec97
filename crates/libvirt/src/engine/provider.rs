//! A libvirt provider (kvm or kvm2) over the [`Host`] seam: create (its steps on a host in
//! `provider/create.rs`), get, delete, list, mark (in `provider/mark.rs`) and the health check of
//! spec/kvm.md §7 and §10, with the review's fixes (each named where it lands).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime};

use crate::Mark;
use crate::config::KvmConfig;
use crate::host::{Host, code};
use async_trait::async_trait;
use egress_provider::{
    BoxError, Checker, CreateRequest, Instance, OpCtx, Provider, ProviderError, ProviderId, TargetStatus, is_identifier,
};
use futures::StreamExt as _;

use super::failure::{self, Context as _, OpFailure};
use super::image::{self, Cached};
use super::locks::KeyedLocks;
use super::placement;
use super::traced::{Traced, error_name};
use super::url_guard::{Lookup, SystemLookup, UrlHosts};
use super::{check, id, observe, ops};
use crate::generation::Generation;
use egress_netguard::Guard;

mod create;
mod mark;

/// Hosts checked at once (review L19).
const CHECK_CONCURRENCY: usize = 8;
/// The longest hostname a check reports (review L18: a DNS name's limit).
const HOSTNAME_MAX: usize = 253;
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
    /// Where the URLs Proxies give may lead (`imageUrlHosts`, else no internal address).
    url_hosts: UrlHosts,
    /// Downloads of the URLs Proxies give, checked by `url_hosts` as they resolve and redirect.
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
        refuse_exposed_key(&cfg.ssh_key_file)?;
        warn_about_files(&cfg);
        let mut by_name: BTreeMap<String, Arc<dyn Host>> = BTreeMap::new();
        for host in hosts {
            by_name.insert(host.name().to_owned(), Arc::new(Traced::new(host, generation)));
        }
        if let Some(missing) = cfg.hosts.iter().find(|h| !by_name.contains_key(&h.name)) {
            return Err(format!("host {:?} has no connection", missing.name).into());
        }
        let probing = cfg.hosts.iter().map(|h| (h.name.clone(), Arc::default())).collect();
        let url_hosts = UrlHosts::for_proxies(cfg.image_url_hosts.as_deref(), Guard::default());
        let url_http = image::http_client(url_hosts.clone(), Arc::new(SystemLookup))?;
        Ok(Self {
            shared: Arc::new(Shared {
                generation,
                probing,
                entry: entry.to_owned(),
                cfg,
                hosts: by_name,
                http: image::http_client(UrlHosts::Catalogue, Arc::new(SystemLookup))?,
                url_hosts,
                url_http,
                names: KeyedLocks::new(),
                images: KeyedLocks::new(),
                writer: super::fence::new_writer_id(),
            }),
        })
    }

    /// The provider with its downloads resolving names through `lookup`, and `guard` judging
    /// what is internal for the URLs Proxies give when `imageUrlHosts` is absent: the
    /// operator's judge (with the cluster's ranges), or a test's, whose mirrors are on loopback
    /// and whose names resolve where the test says.
    ///
    /// # Errors
    /// The HTTP clients failing to build.
    pub fn with_url_resolution(mut self, guard: Guard, lookup: Arc<dyn Lookup>) -> Result<Self, BoxError> {
        let shared = Arc::get_mut(&mut self.shared).ok_or("the provider is already shared")?;
        shared.url_hosts = UrlHosts::for_proxies(shared.cfg.image_url_hosts.as_deref(), guard);
        shared.url_http = image::http_client(shared.url_hosts.clone(), lookup.clone())?;
        shared.http = image::http_client(UrlHosts::Catalogue, lookup)?;
        Ok(self)
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
/// A key file others may read is refused at once, naming it (a missing one is warned about:
/// its Secret may come later). Each dial checks again.
fn refuse_exposed_key(path: &str) -> Result<(), BoxError> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    match egress_files::others_may_access(&meta) {
        None => Ok(()),
        Some(mode) => Err(format!(
            "ssh key file {path} may be read by others (mode {mode:03o}): a private key must not be; make it 0600, or 0440 with the Pod's fsGroup (the Secret volume's defaultMode)"
        )
        .into()),
    }
}

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

#[async_trait]
impl Provider for LibvirtProvider {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let op = egress_provider::Op::Create;
        let resolved = placement::resolve(
            self.generation(),
            &self.shared.cfg,
            &self.shared.url_hosts,
            &req.placement,
        )
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
    use super::*;

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
