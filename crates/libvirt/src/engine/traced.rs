//! The seam, observed (spec/kvm.md §11): every libvirt call of the provider runs inside a
//! `kvm2.<Method>` client span carrying the host and the objects it names, and logs one
//! `libvirt call` line at debug (with the call's duration, and libvirt's error number and name
//! when it failed) while that span is current. Per-call detail (documents, states, addresses)
//! is logged at trace level only. No span or line carries an upload's bytes: the seed holds the
//! Proxy's cloud-init.
//!
//! A dedicated connection is observed too. Dials (pooled or dedicated) run inside a `kvm2.dial`
//! span that the dialer opens.

use std::fmt::Debug;
use std::future::Future;
use std::time::Instant;

use crate::host::{AddressSource, DomainState, Host, Interface, LvResult, PoolInfo, UploadSource};
use async_trait::async_trait;
use egress_provider::OpCtx;
use tracing::Instrument;

use super::failure::shown_here;
use crate::generation::Generation;
use tracing::field::Empty;

/// A [`Host`] whose calls are observed.
#[derive(Debug)]
pub struct Traced<H: ?Sized> {
    /// Whether calls get spans (kvm2) or log lines only (kvm).
    spans: bool,
    inner: Box<H>,
}

impl Traced<dyn Host> {
    /// Observes `inner`'s calls as `generation` does.
    pub fn new(inner: Box<dyn Host>, generation: Generation) -> Self {
        Self {
            spans: generation.spans(),
            inner,
        }
    }
}

/// libvirt's name for an error number, as the `libvirtError` field shows it.
pub fn error_name(code: i32) -> String {
    match code {
        1 => "ErrInternalError".to_owned(),
        3 => "ErrNoSupport".to_owned(),
        8 => "ErrInvalidArg".to_owned(),
        9 => "ErrOperationFailed".to_owned(),
        27 => "ErrXMLError".to_owned(),
        38 => "ErrSystemError".to_owned(),
        39 => "ErrRPC".to_owned(),
        42 => "ErrNoDomain".to_owned(),
        45 => "ErrAuthFailed".to_owned(),
        49 => "ErrNoStoragePool".to_owned(),
        50 => "ErrNoStorageVol".to_owned(),
        55 => "ErrOperationInvalid".to_owned(),
        67 => "ErrConfigUnsupported".to_owned(),
        80 => "ErrNoDomainMetadata".to_owned(),
        86 => "ErrAgentUnresponsive".to_owned(),
        88 => "ErrAccessDenied".to_owned(),
        90 => "ErrStorageVolExist".to_owned(),
        n => format!("ErrorNumber({n})"),
    }
}

/// Opens the span of one call. Span names must be constants, hence a macro.
macro_rules! call_span {
    ($name:expr, $host:expr) => {
        tracing::info_span!(
            $name,
            otel.kind = "client",
            kvm2.host = %$host,
            kvm2.domain = Empty,
            kvm2.pool = Empty,
            kvm2.volume = Empty,
            kvm2.libvirt_code = Empty,
            otel.status_code = Empty,
            otel.status_description = Empty,
        )
    };
}

/// The objects a call names.
#[derive(Default)]
struct Names<'a> {
    domain: Option<&'a str>,
    pool: Option<&'a str>,
    volume: Option<&'a str>,
}

/// Runs one call inside `span`, recording what it names and how it ended, and logs its line.
async fn observe<T, F>(span: tracing::Span, rpc: &'static str, host: &str, names: Names<'_>, call: F) -> LvResult<T>
where
    F: Future<Output = LvResult<T>>,
    T: Debug,
{
    if let Some(d) = names.domain {
        span.record("kvm2.domain", d);
    }
    if let Some(p) = names.pool {
        span.record("kvm2.pool", p);
    }
    if let Some(v) = names.volume {
        span.record("kvm2.volume", v);
    }
    let started = Instant::now();
    let result = call.instrument(span.clone()).await;
    let _entered = span.enter();
    let duration = started.elapsed();
    let (domain, pool, volume) = (
        names.domain.unwrap_or_default(),
        names.pool.unwrap_or_default(),
        names.volume.unwrap_or_default(),
    );
    match &result {
        Ok(out) => {
            span.record("otel.status_code", "ok");
            tracing::debug!(rpc, host, domain, pool, volume, ?duration, "libvirt call");
            tracing::trace!(rpc, result = ?out, "libvirt call detail");
        }
        Err(e) => {
            // A backend may echo what it was given: shown scrubbed.
            let shown = shown_here(&e.to_string());
            span.record("otel.status_code", "error");
            span.record("otel.status_description", shown.as_str());
            if e.transport {
                tracing::debug!(rpc, host, domain, pool, volume, ?duration, error = %shown, "libvirt call");
            } else {
                span.record("kvm2.libvirt_code", i64::from(e.code));
                tracing::debug!(rpc, host, domain, pool, volume, ?duration, error = %shown, libvirtCode = e.code, libvirtError = %error_name(e.code), "libvirt call");
            }
        }
    }
    result
}

/// One observed call: its span (`kvm2.<rpc>`), the objects it names, the call itself.
macro_rules! observed {
    ($self:ident, $rpc:literal, {$($field:ident: $value:expr),*}, $call:expr) => {{
        let span = if $self.spans {
            call_span!(concat!("kvm2.", $rpc), $self.name())
        } else {
            tracing::Span::none()
        };
        let names = Names { $($field: Some($value),)* ..Names::default() };
        observe(span, $rpc, $self.name(), names, $call).await
    }};
}

#[async_trait]
impl Host for Traced<dyn Host> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn version(&self, cx: &OpCtx) -> LvResult<(u32, String)> {
        // The seam reads libvirt's version and the host's name in one call.
        observed!(self, "ConnectGetLibVersion", {}, self.inner.version(cx))
    }

    async fn domain_names(&self, cx: &OpCtx) -> LvResult<Vec<String>> {
        observed!(self, "ConnectListAllDomains", {}, self.inner.domain_names(cx))
    }

    async fn domain_metadata(&self, cx: &OpCtx, domain: &str, namespace: &str) -> LvResult<Option<String>> {
        observed!(self, "DomainGetMetadata", {domain: domain}, self.inner.domain_metadata(cx, domain, namespace))
    }

    async fn set_domain_metadata(&self, cx: &OpCtx, domain: &str, namespace: &str, element: &str) -> LvResult<()> {
        tracing::trace!(element, "setting domain metadata");
        observed!(
            self,
            "DomainSetMetadata",
            {domain: domain},
            self.inner.set_domain_metadata(cx, domain, namespace, element)
        )
    }

    async fn domain_state(&self, cx: &OpCtx, domain: &str) -> LvResult<DomainState> {
        observed!(self, "DomainGetState", {domain: domain}, self.inner.domain_state(cx, domain))
    }

    async fn define_domain(&self, cx: &OpCtx, xml: &str) -> LvResult<()> {
        tracing::trace!(xml, "defining domain");
        observed!(self, "DomainDefineXML", {}, self.inner.define_domain(cx, xml))
    }

    async fn start_domain(&self, cx: &OpCtx, domain: &str) -> LvResult<()> {
        observed!(self, "DomainCreate", {domain: domain}, self.inner.start_domain(cx, domain))
    }

    async fn destroy_domain(&self, cx: &OpCtx, domain: &str) -> LvResult<()> {
        observed!(self, "DomainDestroy", {domain: domain}, self.inner.destroy_domain(cx, domain))
    }

    async fn undefine_domain(&self, cx: &OpCtx, domain: &str, flags: u32) -> LvResult<()> {
        observed!(self, "DomainUndefineFlags", {domain: domain}, self.inner.undefine_domain(cx, domain, flags))
    }

    async fn interface_addresses(&self, cx: &OpCtx, domain: &str, source: AddressSource) -> LvResult<Vec<Interface>> {
        observed!(
            self,
            "DomainInterfaceAddresses",
            {domain: domain},
            self.inner.interface_addresses(cx, domain, source)
        )
    }

    async fn pool_info(&self, cx: &OpCtx, pool: &str) -> LvResult<PoolInfo> {
        observed!(self, "StoragePoolGetInfo", {pool: pool}, self.inner.pool_info(cx, pool))
    }

    async fn refresh_pool(&self, cx: &OpCtx, pool: &str) -> LvResult<()> {
        observed!(self, "StoragePoolRefresh", {pool: pool}, self.inner.refresh_pool(cx, pool))
    }

    async fn volume_path(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<String> {
        observed!(self, "StorageVolGetPath", {pool: pool, volume: volume}, self.inner.volume_path(cx, pool, volume))
    }

    async fn create_volume(&self, cx: &OpCtx, pool: &str, xml: &str) -> LvResult<()> {
        tracing::trace!(xml, "creating volume");
        observed!(self, "StorageVolCreateXML", {pool: pool}, self.inner.create_volume(cx, pool, xml))
    }

    async fn volume_capacity(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<u64> {
        observed!(self, "StorageVolGetInfo", {pool: pool, volume: volume}, self.inner.volume_capacity(cx, pool, volume))
    }

    async fn volume_names(&self, cx: &OpCtx, pool: &str) -> LvResult<Vec<String>> {
        observed!(self, "StoragePoolListAllVolumes", {pool: pool}, self.inner.volume_names(cx, pool))
    }

    async fn delete_volume(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<()> {
        observed!(self, "StorageVolDelete", {pool: pool, volume: volume}, self.inner.delete_volume(cx, pool, volume))
    }

    async fn upload(&self, cx: &OpCtx, pool: &str, volume: &str, length: u64, source: UploadSource) -> LvResult<u64> {
        tracing::trace!(volume, offset = 0, length, "uploading");
        observed!(
            self,
            "StorageVolUpload",
            {pool: pool, volume: volume},
            self.inner.upload(cx, pool, volume, length, source)
        )
    }

    async fn download(&self, cx: &OpCtx, pool: &str, volume: &str, max: usize) -> LvResult<Vec<u8>> {
        // The bytes are not logged: only their count.
        let read = observed!(
            self,
            "StorageVolDownload",
            {pool: pool, volume: volume},
            async { self.inner.download(cx, pool, volume, max).await.map(Len) }
        )?;
        Ok(read.0)
    }

    async fn close(self: Box<Self>) {
        // No span: not a call of the provider's.
        self.inner.close().await;
    }

    async fn dedicated(&self, cx: &OpCtx) -> LvResult<Box<dyn Host>> {
        // The dial's own span (`kvm2.dial`) is opened by the dialer (see `crate::construct`).
        Ok(Box::new(Traced {
            spans: self.spans,
            inner: self.inner.dedicated(cx).await?,
        }))
    }
}

/// Downloaded bytes, shown by their count only.
struct Len(Vec<u8>);

impl Debug for Len {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}
