//! The kvm2 provider (spec/kvm.md): each proxy is a libvirt domain on one of the configured
//! hypervisors, reached over SSH, booted from a cached base image through a per-VM overlay and a
//! NoCloud seed carrying the Proxy's cloud-init.
//!
//! The crate is usable on its own: [`Kvm2Provider::new`] takes the config block and one
//! [`egress_libvirt::Host`] per configured host (the SSH one of `egress-libvirt-ssh`, or the
//! in-memory fake), and [`construct`] builds it from a config entry as the operator does.
//!
//! - [`placement`], [`id`], [`names`]: what a request and an id resolve to;
//! - [`image`]: the base-image cache and its HTTP download;
//! - [`provider`]: create, get, delete, list and the health check;
//! - [`observe`], [`ops`], [`check`]: reading a domain back, removing and listing, checking a host;
//! - [`classify`], [`failure`]: what an error means for the reconciler;
//! - [`traced`]: spans and log lines around every libvirt call;
//! - [`locks`]: per-name and per-image locks whose waits end with the caller.

use std::sync::Arc;

use egress_libvirt::Host;
use egress_libvirt_ssh::{DialOptions, Dialer, HostKeys, HostTarget, Pool, RemoteHost};
use egress_provider::config::{ProviderConfig, validators};
use egress_provider::{BoxError, Provider, ProviderType};
use tracing::field::Empty;

pub mod check;
pub mod classify;
pub mod failure;
pub mod id;
pub mod image;
pub mod locks;
pub mod names;
pub mod observe;
pub mod ops;
pub mod placement;
pub mod provider;
pub mod traced;

pub use provider::Kvm2Provider;

/// The `type:` value.
pub const TYPE_NAME: &str = "kvm2";

/// The `kvm2` provider type for the operator's registry.
pub fn provider_type() -> ProviderType {
    ProviderType::new(TYPE_NAME, validators::kvm, construct)
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
    let cfg = entry.kvm2.clone().ok_or("kvm2 block is required")?;
    let host_keys = if cfg.insecure_ignore_host_key {
        HostKeys::AcceptAny
    } else {
        HostKeys::KnownHosts(cfg.known_hosts_file.clone().into())
    };
    let options = DialOptions {
        span: Some(dial_span),
        ..DialOptions::new(&cfg.ssh_key_file, host_keys)
    };
    let pool = Arc::new(Pool::new(Arc::new(Dialer::new(options))));
    let hosts = cfg
        .hosts
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
        .collect();
    Ok(Arc::new(Kvm2Provider::new(&entry.name, cfg, hosts)?))
}

/// Shared by the unit tests: a small valid kvm2 domain document.
#[cfg(test)]
pub(crate) fn test_domain_xml(name: &str, mark: egress_libvirt::Mark) -> String {
    egress_libvirt::DomainSpec {
        name: name.into(),
        memory_mib: 128,
        vcpus: 1,
        mark,
        firmware: "uefi".into(),
        domain_type: "qemu".into(),
        cpu_mode: None,
        disk_path: "/d".into(),
        disk_format: "qcow2".into(),
        seed_path: "/s".into(),
        bridge: "br0".into(),
        mac: None,
    }
    .to_xml(egress_libvirt::Flavour::Kvm2)
    .unwrap()
}
