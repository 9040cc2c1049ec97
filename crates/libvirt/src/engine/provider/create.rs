//! `create` on libvirt: an existing domain adopted when its mark says so, otherwise the base
//! image cached (after the pool-space check), the overlay and the seed made, the domain defined
//! (and everything of it removed again when that fails) and started.

use std::time::{Duration, Instant, SystemTime};

use egress_provider::{CreateRequest, OpCtx};

use super::{LibvirtProvider, owned_mark};
use crate::config::KvmConfig;
use crate::engine::Generation;
use crate::engine::check;
use crate::engine::failure::{Context as _, OpFailure};
use crate::engine::image::{self, Cached};
use crate::engine::placement::Resolved;
use crate::host::{DomainState, Host, POOL_RUNNING, UNDEFINE_FLAGS, code};
use crate::names;
use crate::seed::{SeedError, seed_iso_with, vendor_data};
use crate::{DomainSpec, Mark, VolumeSpec};

/// Bytes kept free for the seed in the pool-space check.
const SEED_RESERVE: u64 = 16 << 20;
/// How long a started domain may take to report running.
const RUNNING_CAP: Duration = Duration::from_secs(15);
/// How often the state is read while waiting for running.
const RUNNING_POLL: Duration = Duration::from_millis(500);
/// Cleaning up after a failed create: bounded, and not cut short by the caller.
const CLEANUP_BUDGET: Duration = Duration::from_secs(30);

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

/// A context for cleanups: the caller cannot cut it short; bounded by [`CLEANUP_BUDGET`].
fn cleanup_cx() -> OpCtx {
    OpCtx::background().with_timeout(CLEANUP_BUDGET)
}

impl LibvirtProvider {
    /// Creates domain `req.name` on `host` as `r` resolved it, or adopts the one there: its
    /// image cached, its volumes made, defined and started.
    pub(super) async fn create_on(
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
}
