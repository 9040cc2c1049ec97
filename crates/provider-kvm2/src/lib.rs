//! The kvm2 provider (spec/kvm.md): each proxy is a libvirt domain on one of the configured
//! hypervisors, reached over SSH, booted from a cached base image through a per-VM overlay and a
//! NoCloud seed carrying the Proxy's cloud-init.
//!
//! The crate is usable on its own: [`new`] takes the config block and one
//! [`egress_libvirt::Host`] per configured host (the SSH one of `egress-libvirt-ssh`, or the
//! in-memory fake), and [`construct`] builds it from a config entry as the operator does. The
//! engine is `egress_libvirt::engine`, shared with the first-generation `kvm` provider; its
//! modules (and the volume names, `egress_libvirt::names`) are re-exported here:
//!
//! - [`placement`], [`id`], [`names`]: what a request and an id resolve to;
//! - [`image`], [`fence`]: the base-image cache, its HTTP download, and the fill leases that fence it;
//! - [`provider`]: create, get, delete, list and the health check;
//! - [`observe`], [`ops`], [`check`]: reading a domain back, removing and listing, checking a host;
//! - [`classify`], [`failure`]: what an error means for the reconciler;
//! - [`traced`]: spans and log lines around every libvirt call;
//! - [`locks`]: per-name and per-image locks whose waits end with the caller.

use std::sync::Arc;

use egress_libvirt::Host;
use egress_libvirt::config::KvmConfig;
use egress_libvirt::engine::url_guard::SystemLookup;
pub use egress_libvirt::engine::{
    Generation, LibvirtProvider, check, classify, failure, fence, id, image, locks, observe, ops, placement, provider,
    traced,
};
pub use egress_libvirt::names;
use egress_libvirt_ssh::{DialOptions, HostKeys, HostTarget};
use egress_netguard::Guard;
use egress_provider::config::ProviderConfig;
use egress_provider::{BoxError, Provider, ProviderType};
use tracing::field::Empty;

/// The kvm2 provider: the shared engine as its second generation.
pub type Kvm2Provider = LibvirtProvider;

/// The provider of entry `entry` with block `cfg`, over `hosts` (one per configured host).
///
/// # Errors
/// An entry name that cannot be part of a volume name; a configured host without a [`Host`].
pub fn new(entry: &str, cfg: KvmConfig, hosts: Vec<Box<dyn Host>>) -> Result<Kvm2Provider, BoxError> {
    LibvirtProvider::new(Generation::Kvm2, entry, cfg, hosts)
}

/// The `type:` value.
pub const TYPE_NAME: &str = "kvm2";

/// The `kvm2` provider type for the operator's registry, judging image URLs by the fixed
/// lists of internal addresses alone ([`provider_type_judging`] adds the cluster's).
pub fn provider_type() -> ProviderType {
    provider_type_judging(Guard::default())
}

/// The `kvm2` provider type whose entries refuse the image URLs of Proxies that `internal`
/// finds internal (when an entry has no `imageUrlHosts`): the operator passes the judge its
/// `--cluster-cidrs` and `--allowed-internal-destinations` make.
pub fn provider_type_judging(internal: Guard) -> ProviderType {
    ProviderType::with_block::<KvmConfig>(TYPE_NAME, move |entry| construct_judging(entry, &internal))
        .sharing("libvirt", egress_libvirt::config::shared_pools)
}

/// The span of every dial to a host, pooled or dedicated.
fn dial_span(host: &HostTarget) -> tracing::Span {
    tracing::info_span!(
        "kvm2.dial",
        otel.kind = "client",
        kvm2.host = %host.name,
        kvm2.address = %host.address,
        kvm2.user = %host.user,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Builds a provider from a validated `kvm2` entry: one SSH connection pool for its hosts, the
/// key (and known_hosts) read on every dial, so a rotated Secret applies to the next
/// connection. Dials nothing; SSH files that are missing now are only warned about (the Secret
/// may be mounted later, and the other providers must start regardless).
///
/// # Errors
/// No `kvm2` block (the validator refuses that first); an entry name that cannot be part of a
/// volume name.
pub fn construct(entry: &ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> {
    construct_judging(entry, &Guard::default())
}

/// [`construct`], with `internal` judging what is internal for the image URLs of Proxies.
///
/// # Errors
/// As [`construct`].
pub fn construct_judging(entry: &ProviderConfig, internal: &Guard) -> Result<Arc<dyn Provider>, BoxError> {
    let cfg: KvmConfig = entry.block()?.ok_or("kvm2 block is required")?;
    let host_keys = if cfg.insecure_ignore_host_key {
        HostKeys::AcceptAny
    } else {
        HostKeys::KnownHosts(cfg.known_hosts_file.clone().into())
    };
    let options = DialOptions {
        span: Some(dial_span),
        stall_limit: cfg.effective_stall_timeout(),
        ..DialOptions::new(&cfg.ssh_key_file, host_keys)
    };
    let hosts = egress_libvirt_ssh::hosts_of(&cfg, options);
    let provider = new(&entry.name, cfg, hosts)?.with_url_resolution(internal.clone(), Arc::new(SystemLookup))?;
    Ok(Arc::new(provider))
}
