//! [`Host`] over SSH: every call on the host's pooled connection (or on a dedicated one), on a
//! blocking thread, with the budget the call deserves.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use egress_libvirt::host::{
    AddressSource, DialFailure, DomainState, Host, Interface, LibvirtError, LvResult, PoolInfo, UploadSource,
};
use egress_provider::OpCtx;

use crate::connection::{
    Connection, DOMAIN_CREATE_BUDGET, RPC_BUDGET, SMALL_UPLOAD_BUDGET, SMALL_UPLOAD_BYTES, TRANSFER_BUDGET,
};
use crate::dial::{DialOptions, Dialer, HostTarget};
use crate::error::{CallError, DialCause, DialError, Stage};
use crate::pool::Pool;

/// One [`RemoteHost`] per host of a libvirt provider's config block, sharing one connection
/// pool dialled with `options`.
pub fn hosts_of(cfg: &egress_libvirt::config::KvmConfig, options: DialOptions) -> Vec<Box<dyn Host>> {
    let pool = Arc::new(Pool::new(Arc::new(Dialer::new(options))));
    cfg.hosts
        .iter()
        .map(|h| {
            Box::new(RemoteHost::new(
                HostTarget {
                    name: h.name.clone(),
                    address: h.address.clone(),
                    user: h.user.clone(),
                    socket: h.effective_socket().to_owned(),
                },
                pool.clone(),
            )) as Box<dyn Host>
        })
        .collect()
}

/// How an upload ended.
enum Upload {
    /// Every byte of the source went out; how many.
    Done(u64),
    /// The source failed (the stream was finished cleanly); its error.
    SourceFailed(String),
    /// libvirt kept taking nothing; bytes read until then.
    Stalled(u64),
}

/// One upload or download chunk.
const CHUNK: usize = 256 << 10;

/// A hypervisor reached over SSH.
#[derive(Debug)]
pub struct RemoteHost {
    target: HostTarget,
    pool: Arc<Pool>,
    /// A connection of this host alone (see [`Host::dedicated`]); `None` uses the pool's.
    own: Option<Arc<Connection>>,
}

impl RemoteHost {
    /// `target`, with calls on `pool`'s connection to it.
    pub fn new(target: HostTarget, pool: Arc<Pool>) -> Self {
        Self {
            target,
            pool,
            own: None,
        }
    }

    async fn connection(&self, cx: &OpCtx) -> LvResult<Arc<Connection>> {
        match &self.own {
            Some(c) => Ok(c.clone()),
            None => self.pool.get(cx, &self.target).await.map_err(|e| dial_error(&e)),
        }
    }

    async fn run<T, F>(&self, cx: &OpCtx, rpc: &str, budget: Duration, f: F) -> LvResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&virt::connect::Connect) -> Result<T, virt::error::Error> + Send + 'static,
    {
        let conn = self.connection(cx).await?;
        conn.call(cx, rpc, budget, f).await.map_err(|e| call_error(&e))
    }
}

/// A dial failure as the seam reports it: a connection failure that says what stopped it.
fn dial_error(e: &DialError) -> LibvirtError {
    let failure = match &e.cause {
        DialCause::KeyRead { .. } => DialFailure::KeyUnreadable,
        DialCause::KeyParse { .. } | DialCause::KeyExposed { .. } => DialFailure::KeyInvalid,
        DialCause::KnownHostsRead { .. } => DialFailure::KnownHostsUnreadable,
        DialCause::KnownHostsParse { .. } => DialFailure::KnownHostsInvalid,
        DialCause::HostKeyUnknown { .. } | DialCause::HostKeyChanged { .. } | DialCause::HostKeyRevoked { .. } => {
            DialFailure::HostKey
        }
        DialCause::AuthRefused { .. } => DialFailure::Auth,
        _ if e.is_timeout() => DialFailure::Timeout,
        _ => match e.stage {
            Stage::Socket => DialFailure::Socket,
            Stage::Libvirt => DialFailure::Libvirt,
            _ => DialFailure::Network,
        },
    };
    LibvirtError {
        // The caller gave up while the dial ran (not the dial's own budget running out).
        timed_out: matches!(e.cause, DialCause::Cancelled(_)),
        ..LibvirtError::dial(failure, e.to_string())
    }
}

fn call_error(e: &CallError) -> LibvirtError {
    match e {
        CallError::Libvirt { error, transport, .. } => LibvirtError {
            code: i32::try_from(error.code().to_raw()).unwrap_or(-1),
            message: error.message().to_owned(),
            transport: *transport,
            dial: None,
            timed_out: false,
        },
        CallError::OverBudget { .. } | CallError::Abandoned { .. } | CallError::NotStarted { .. } => {
            LibvirtError::timeout(e.to_string())
        }
        other => LibvirtError::transport(other.to_string()),
    }
}

/// Metadata kind "element" (`VIR_DOMAIN_METADATA_ELEMENT`).
const METADATA_ELEMENT: i32 = 2;
/// The prefix an element set through `virDomainSetMetadata` is written with (libvirt needs one;
/// readers go by the namespace, and the mark by local names).
const METADATA_PREFIX: &str = "egress";
/// `VIR_CONNECT_LIST_DOMAINS_ACTIVE | VIR_CONNECT_LIST_DOMAINS_INACTIVE`.
const LIST_ALL: u32 = 1 | 2;

fn source_number(source: AddressSource) -> u32 {
    match source {
        AddressSource::Lease => 0,
        AddressSource::Agent => 1,
        AddressSource::Arp => 2,
    }
}

/// Why paused domain `dom` is paused (`virDomainPausedReason`); 0, unknown, when libvirt will
/// not say or the domain is no longer paused.
fn paused_reason(dom: &virt::domain::Domain) -> u32 {
    use virt::domain::DomainStateReason;
    use virt::enumutil::Enum;
    match dom.state() {
        Ok((_, Enum::Known(DomainStateReason::Paused(reason)))) => reason.to_raw(),
        _ => 0,
    }
}

fn not_found_metadata(e: &virt::error::Error) -> bool {
    e.code().is(virt::error::ErrorNumber::NoDomainMetadata)
}

#[async_trait]
impl Host for RemoteHost {
    fn name(&self) -> &str {
        &self.target.name
    }

    async fn version(&self, cx: &OpCtx) -> LvResult<(u32, String)> {
        self.run(cx, "ConnectGetLibVersion", RPC_BUDGET, |c| {
            Ok((c.lib_version()?, c.hostname()?))
        })
        .await
    }

    async fn domain_names(&self, cx: &OpCtx) -> LvResult<Vec<String>> {
        self.run(cx, "ConnectListAllDomains", RPC_BUDGET, |c| {
            c.list_all_domains(LIST_ALL)?
                .iter()
                .map(virt::domain::Domain::name)
                .collect()
        })
        .await
    }

    async fn volume_capacity(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<u64> {
        let (pool, name) = (pool.to_owned(), volume.to_owned());
        self.run(cx, "StorageVolGetInfo", RPC_BUDGET, move |c| {
            Ok(c.lookup_storage_pool_by_name(&pool)?
                .lookup_storage_vol_by_name(&name)?
                .info()?
                .capacity)
        })
        .await
    }

    async fn volume_names(&self, cx: &OpCtx, pool: &str) -> LvResult<Vec<String>> {
        let pool = pool.to_owned();
        self.run(cx, "StoragePoolListAllVolumes", RPC_BUDGET, move |c| {
            c.lookup_storage_pool_by_name(&pool)?
                .list_all_volumes(0)?
                .iter()
                .map(virt::storage_vol::StorageVol::name)
                .collect()
        })
        .await
    }

    async fn domain_metadata(&self, cx: &OpCtx, domain: &str, namespace: &str) -> LvResult<Option<String>> {
        let (domain, namespace) = (domain.to_owned(), namespace.to_owned());
        self.run(cx, "DomainGetMetadata", RPC_BUDGET, move |c| {
            let dom = c.lookup_domain_by_name(&domain)?;
            match dom.metadata(METADATA_ELEMENT, Some(&namespace), 0) {
                Ok(xml) => Ok(Some(xml)),
                Err(e) if not_found_metadata(&e) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn set_domain_metadata(&self, cx: &OpCtx, domain: &str, namespace: &str, element: &str) -> LvResult<()> {
        let (domain, namespace, element) = (domain.to_owned(), namespace.to_owned(), element.to_owned());
        self.run(cx, "DomainSetMetadata", RPC_BUDGET, move |c| {
            let dom = c.lookup_domain_by_name(&domain)?;
            // The persistent definition always, so a restart keeps the element; the live one too
            // while the domain runs, since a read (flags 0) then shows the live one. A domain
            // that stops in between fails the call (the live definition is gone): retried.
            let flags = if dom.is_active()? {
                virt::sys::VIR_DOMAIN_AFFECT_LIVE | virt::sys::VIR_DOMAIN_AFFECT_CONFIG
            } else {
                virt::sys::VIR_DOMAIN_AFFECT_CONFIG
            };
            dom.set_metadata(
                METADATA_ELEMENT,
                Some(&element),
                Some(METADATA_PREFIX),
                Some(&namespace),
                flags,
            )
        })
        .await
    }

    async fn domain_state(&self, cx: &OpCtx, domain: &str) -> LvResult<DomainState> {
        let domain = domain.to_owned();
        // NB: virt 0.5's `state()` drops virDomainGetState's error (and reports -1);
        // virDomainGetInfo's is returned, so the cause (a domain gone meanwhile) survives.
        // Only a paused domain's reason matters (review M1), so only then is it asked for; a
        // reason that cannot be read is "unknown", a pause that is waited out.
        let (state, reason) = self
            .run(cx, "DomainGetInfo", RPC_BUDGET, move |c| {
                let dom = c.lookup_domain_by_name(&domain)?;
                let state = dom.info()?.state.to_raw();
                let reason = if state == virt::sys::VIR_DOMAIN_PAUSED {
                    paused_reason(&dom)
                } else {
                    0
                };
                Ok((state, reason))
            })
            .await?;
        Ok(DomainState::from_raw(state, reason))
    }

    async fn define_domain(&self, cx: &OpCtx, xml: &str) -> LvResult<()> {
        let xml = xml.to_owned();
        self.run(cx, "DomainDefineXML", RPC_BUDGET, move |c| {
            c.define_domain_xml(&xml).map(drop)
        })
        .await
    }

    async fn start_domain(&self, cx: &OpCtx, domain: &str) -> LvResult<()> {
        let domain = domain.to_owned();
        self.run(cx, "DomainCreate", DOMAIN_CREATE_BUDGET, move |c| {
            c.lookup_domain_by_name(&domain)?.create().map(drop)
        })
        .await
    }

    async fn destroy_domain(&self, cx: &OpCtx, domain: &str) -> LvResult<()> {
        let domain = domain.to_owned();
        self.run(cx, "DomainDestroy", RPC_BUDGET, move |c| {
            c.lookup_domain_by_name(&domain)?.destroy()
        })
        .await
    }

    async fn undefine_domain(&self, cx: &OpCtx, domain: &str, flags: u32) -> LvResult<()> {
        let domain = domain.to_owned();
        self.run(cx, "DomainUndefineFlags", RPC_BUDGET, move |c| {
            c.lookup_domain_by_name(&domain)?.undefine_flags(flags)
        })
        .await
    }

    async fn interface_addresses(&self, cx: &OpCtx, domain: &str, source: AddressSource) -> LvResult<Vec<Interface>> {
        let domain = domain.to_owned();
        self.run(cx, "DomainInterfaceAddresses", RPC_BUDGET, move |c| {
            let interfaces = c
                .lookup_domain_by_name(&domain)?
                .interface_addresses(source_number(source), 0)?;
            Ok(interfaces
                .into_iter()
                .map(|i| Interface {
                    name: i.name,
                    hwaddr: i.hwaddr.unwrap_or_default(),
                    addresses: i
                        .addrs
                        .into_iter()
                        .map(|a| egress_libvirt::host::Address {
                            kind: i32::try_from(a.typed).unwrap_or(-1),
                            text: a.addr,
                        })
                        .collect(),
                })
                .collect())
        })
        .await
    }

    async fn pool_info(&self, cx: &OpCtx, pool: &str) -> LvResult<PoolInfo> {
        let pool = pool.to_owned();
        self.run(cx, "StoragePoolGetInfo", RPC_BUDGET, move |c| {
            let info = c.lookup_storage_pool_by_name(&pool)?.info()?;
            Ok(PoolInfo {
                state: info.state,
                capacity: info.capacity,
                allocation: info.allocation,
                available: info.available,
            })
        })
        .await
    }

    async fn refresh_pool(&self, cx: &OpCtx, pool: &str) -> LvResult<()> {
        let pool = pool.to_owned();
        self.run(cx, "StoragePoolRefresh", RPC_BUDGET, move |c| {
            c.lookup_storage_pool_by_name(&pool)?.refresh(0).map(drop)
        })
        .await
    }

    async fn volume_path(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<String> {
        let (pool, volume) = (pool.to_owned(), volume.to_owned());
        self.run(cx, "StorageVolGetPath", RPC_BUDGET, move |c| {
            c.lookup_storage_pool_by_name(&pool)?
                .lookup_storage_vol_by_name(&volume)?
                .path()
        })
        .await
    }

    async fn create_volume(&self, cx: &OpCtx, pool: &str, xml: &str) -> LvResult<()> {
        let (pool, xml) = (pool.to_owned(), xml.to_owned());
        self.run(cx, "StorageVolCreateXML", RPC_BUDGET, move |c| {
            let pool = c.lookup_storage_pool_by_name(&pool)?;
            virt::storage_vol::StorageVol::create_xml(&pool, &xml, 0).map(drop)
        })
        .await
    }

    async fn delete_volume(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<()> {
        let (pool, volume) = (pool.to_owned(), volume.to_owned());
        self.run(cx, "StorageVolDelete", RPC_BUDGET, move |c| {
            c.lookup_storage_pool_by_name(&pool)?
                .lookup_storage_vol_by_name(&volume)?
                .delete(0)
        })
        .await
    }

    async fn upload(
        &self,
        cx: &OpCtx,
        pool: &str,
        volume: &str,
        length: u64,
        mut source: UploadSource,
    ) -> LvResult<u64> {
        let (pool, name) = (pool.to_owned(), volume.to_owned());
        // A base image's budget grows with its size (the stall limit catches a silent host).
        let budget = if length <= SMALL_UPLOAD_BYTES {
            SMALL_UPLOAD_BUDGET
        } else {
            egress_libvirt::transfer_budget(length)
        };
        let outcome = self
            .run(cx, "StorageVolUpload", budget, move |c| {
                let vol = c
                    .lookup_storage_pool_by_name(&pool)?
                    .lookup_storage_vol_by_name(&name)?;
                let stream = virt::stream::Stream::new(c, 0)?;
                vol.upload(&stream, 0, length, 0)?;
                let mut buf = vec![0u8; CHUNK];
                let mut read = 0u64;
                // NB: a source error ends the stream like its end does (spec H2): it is kept
                // and reported after libvirt has finished, never fed into the stream.
                let mut source_error = None;
                loop {
                    let n = match source.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            source_error = Some(e.to_string());
                            break;
                        }
                    };
                    read += n as u64;
                    let mut at = 0;
                    let mut stalled = 0;
                    while at < n {
                        match stream.send(&buf[at..n]) {
                            Ok(sent) if sent > 0 => {
                                at += usize::try_from(sent).unwrap_or(0);
                                stalled = 0;
                            }
                            // A blocking stream should never take nothing; if it keeps doing
                            // so, give up rather than spin (the budget bounds this too).
                            Ok(_) if stalled < 1000 => stalled += 1,
                            Ok(_) => {
                                let _ = stream.abort();
                                return Ok(Upload::Stalled(read));
                            }
                            Err(e) => {
                                let _ = stream.abort();
                                return Err(e);
                            }
                        }
                    }
                }
                stream.finish()?;
                Ok(match source_error {
                    Some(e) => Upload::SourceFailed(e),
                    None => Upload::Done(read),
                })
            })
            .await?;
        match outcome {
            Upload::Done(read) => Ok(read),
            Upload::SourceFailed(e) => Err(LibvirtError::transport(format!(
                "reading the upload source for {volume}: {e}"
            ))),
            Upload::Stalled(read) => Err(LibvirtError::transport(format!(
                "uploading {volume}: libvirt stopped accepting data after {read} bytes"
            ))),
        }
    }

    async fn download(&self, cx: &OpCtx, pool: &str, volume: &str, max: usize) -> LvResult<Vec<u8>> {
        let (pool, name) = (pool.to_owned(), volume.to_owned());
        self.run(cx, "StorageVolDownload", TRANSFER_BUDGET, move |c| {
            let vol = c
                .lookup_storage_pool_by_name(&pool)?
                .lookup_storage_vol_by_name(&name)?;
            let stream = virt::stream::Stream::new(c, 0)?;
            vol.download(&stream, 0, 0, 0)?;
            let mut kept = Vec::new();
            let mut buf = vec![0u8; CHUNK.min(64 << 10)];
            loop {
                let n = usize::try_from(stream.recv(&mut buf)?).unwrap_or(0);
                if n == 0 {
                    break;
                }
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            stream.finish()?;
            Ok(kept)
        })
        .await
    }

    async fn close(self: Box<Self>) {
        if let Some(conn) = self.own
            && let Ok(conn) = Arc::try_unwrap(conn)
        {
            conn.close().await;
        }
    }

    async fn dedicated(&self, cx: &OpCtx) -> LvResult<Box<dyn Host>> {
        let conn = self
            .pool
            .dialer()
            .dial(cx, &self.target)
            .await
            .map_err(|e| dial_error(&e))?;
        Ok(Box::new(Self {
            target: self.target.clone(),
            pool: self.pool.clone(),
            own: Some(Arc::new(conn)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use egress_libvirt::host::code;
    use virt::sys;

    #[test]
    fn the_seams_error_numbers_are_libvirts() {
        for (ours, libvirt) in [
            (code::INTERNAL_ERROR, sys::VIR_ERR_INTERNAL_ERROR),
            (code::INVALID_ARG, sys::VIR_ERR_INVALID_ARG),
            (code::SYSTEM_ERROR, sys::VIR_ERR_SYSTEM_ERROR),
            (code::RPC, sys::VIR_ERR_RPC),
            (code::NO_DOMAIN, sys::VIR_ERR_NO_DOMAIN),
            (code::NO_STORAGE_POOL, sys::VIR_ERR_NO_STORAGE_POOL),
            (code::NO_STORAGE_VOL, sys::VIR_ERR_NO_STORAGE_VOL),
            (code::OPERATION_INVALID, sys::VIR_ERR_OPERATION_INVALID),
            (code::ACCESS_DENIED, sys::VIR_ERR_ACCESS_DENIED),
            (code::NO_DOMAIN_METADATA, sys::VIR_ERR_NO_DOMAIN_METADATA),
            (code::AGENT_UNRESPONSIVE, sys::VIR_ERR_AGENT_UNRESPONSIVE),
            (code::STORAGE_VOL_EXIST, sys::VIR_ERR_STORAGE_VOL_EXIST),
        ] {
            assert_eq!(i64::from(ours), i64::from(libvirt), "code {ours}");
        }
    }
}
