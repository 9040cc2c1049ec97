//! The engine both libvirt providers run on (`kvm` and `kvm2`): placement, the image cache,
//! create, get, delete, list and the health check over the [`Host`](crate::Host) seam, with the
//! review's fixes. Where the two providers differ (metadata namespace, volume names, address
//! source order, error table, health-check reasons, logging and spans) the [`Generation`]
//! decides.

pub mod check;
pub mod classify;
pub mod failure;
pub mod fence;
pub mod id;
pub mod image;
pub mod locks;
pub mod observe;
pub mod ops;
pub mod placement;
pub mod provider;
pub mod traced;
pub mod url_guard;

use egress_provider::{ErrorClass, Op};

pub use crate::generation::Generation;
use crate::host::{AddressSource, LibvirtError};

pub use provider::LibvirtProvider;

impl Generation {
    /// The `type:` value and config block name.
    pub fn block(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Kvm2 => "kvm2",
        }
    }

    /// How log lines name the provider (`KVM domain fetched`, `kvm2 domain fetched`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Kvm => "KVM",
            Self::Kvm2 => "kvm2",
        }
    }

    /// The address sources, in the order asked.
    pub fn sources(self) -> [AddressSource; 2] {
        match self {
            // The Go kvm provider asked ARP first.
            Self::Kvm => [AddressSource::Arp, AddressSource::Agent],
            Self::Kvm2 => [AddressSource::Agent, AddressSource::Arp],
        }
    }

    /// The class of libvirt error `e` met during `op`.
    pub fn classify(self, e: &LibvirtError, op: Op) -> ErrorClass {
        match self {
            Self::Kvm => classify::classify_kvm(e, op),
            Self::Kvm2 => classify::classify(e, op),
        }
    }

    /// Whether libvirt calls, dials and downloads get child spans (kvm has none).
    pub fn spans(self) -> bool {
        self == Self::Kvm2
    }
}

/// Shared by the unit tests: a small valid kvm2 domain document.
#[cfg(test)]
pub(crate) fn test_domain_xml(name: &str, mark: crate::Mark) -> String {
    crate::DomainSpec {
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
    .to_xml(Generation::Kvm2)
    .unwrap()
}
