//! The kvm2 provider (spec/kvm.md): each proxy is a libvirt domain on one of the configured
//! hypervisors, reached over SSH, booted from a cached base image through a per-VM overlay and a
//! NoCloud seed.
//!
//! Work in progress: this crate holds the provider's rules so far (providerIDs, placement
//! resolution, volume names, the classify table, state mapping, address discovery, removing a
//! domain with its volumes, listing the marked domains, checking a host). The provider itself, its checker and its
//! registration follow; until then the operator does not accept `type: kvm2`.

pub mod check;
pub mod classify;
pub mod id;
pub mod names;
pub mod observe;
pub mod ops;
pub mod placement;

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
    }
    .to_xml(egress_libvirt::Flavour::Kvm2)
    .unwrap()
}
