//! The `kvm` provider (spec/kvm.md, first generation): egress proxies as libvirt domains on
//! hypervisors reached over SSH, with the Go operator's `kvm` names and metadata namespace, so
//! the domains and cached base images it made are adopted, polled and collected after a switch.
//!
//! It runs on the engine it shares with `kvm2` (`egress_libvirt::engine`) as its first
//! generation: the `.../kvm` namespace, base images named `base-<key>.<format>`, ARP asked
//! before the guest agent, the first-generation error table, health checks on the shared
//! connection, SSH material read until it loads once and then kept. Where the original's
//! behaviour was a reviewed defect it is fixed; docs/providers/kvm.md lists each deviation.

use std::sync::Arc;

use egress_libvirt::Host;
use egress_libvirt::config::KvmConfig;
use egress_libvirt::engine::url_guard::SystemLookup;
pub use egress_libvirt::engine::{Generation, LibvirtProvider};
use egress_libvirt_ssh::{DialOptions, HostKeys};
use egress_netguard::Guard;
use egress_provider::config::ProviderConfig;
use egress_provider::{BoxError, Provider, ProviderType};

/// The `type:` value.
pub const TYPE_NAME: &str = "kvm";

/// The kvm provider: the shared engine as its first generation.
pub type KvmProvider = LibvirtProvider;

/// The `kvm` provider type for the operator's registry, judging image URLs by the fixed
/// lists of internal addresses alone ([`provider_type_judging`] adds the cluster's).
pub fn provider_type() -> ProviderType {
    provider_type_judging(Guard::default())
}

/// The `kvm` provider type whose entries refuse the image URLs of Proxies that `internal`
/// finds internal (when an entry has no `imageUrlHosts`): the operator passes the judge its
/// `--cluster-cidrs` and `--allowed-internal-destinations` make.
pub fn provider_type_judging(internal: Guard) -> ProviderType {
    ProviderType::with_block::<KvmConfig>(TYPE_NAME, move |entry| construct_judging(entry, &internal))
        .sharing("libvirt", egress_libvirt::config::shared_pools)
}

/// The provider of entry `entry` with block `cfg`, over `hosts` (one per configured host).
///
/// # Errors
/// A configured host without a [`Host`]; the HTTP client failing to build.
pub fn new(entry: &str, cfg: KvmConfig, hosts: Vec<Box<dyn Host>>) -> Result<KvmProvider, BoxError> {
    LibvirtProvider::new(Generation::Kvm, entry, cfg, hosts)
}

/// Builds a provider from a validated `kvm` entry: one SSH connection pool for its hosts; the
/// key is read on each dial until it loads once, then kept for the life of the process (the
/// first-generation rule: a rotated Secret needs a restart). Dials nothing.
///
/// # Errors
/// No `kvm` block (the validator refuses that first).
pub fn construct(entry: &ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> {
    construct_judging(entry, &Guard::default())
}

/// [`construct`], with `internal` judging what is internal for the image URLs of Proxies.
///
/// # Errors
/// As [`construct`].
pub fn construct_judging(entry: &ProviderConfig, internal: &Guard) -> Result<Arc<dyn Provider>, BoxError> {
    let cfg: KvmConfig = entry.block()?.ok_or("kvm block is required")?;
    let host_keys = if cfg.insecure_ignore_host_key {
        HostKeys::AcceptAny
    } else {
        HostKeys::KnownHosts(cfg.known_hosts_file.clone().into())
    };
    let options = DialOptions {
        reread_material: false,
        stall_limit: cfg.effective_stall_timeout(),
        ..DialOptions::new(&cfg.ssh_key_file, host_keys)
    };
    let hosts = egress_libvirt_ssh::hosts_of(&cfg, options);
    let provider = new(&entry.name, cfg, hosts)?.with_url_resolution(internal.clone(), Arc::new(SystemLookup))?;
    Ok(Arc::new(provider))
}
