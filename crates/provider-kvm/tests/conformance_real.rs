//! The conformance suite against the local hypervisor (`cargo xtask conformance --provider kvm
//! --real`): real domains booting the test guest over SSH to a real libvirtd. Without
//! `cargo xtask hypervisor up` every case skips, and under `cargo xtask test` fails.

use egress_libvirt_ssh::testing as support;

egress_conformance::conformance_suite!(support::RealTarget {
    generation: egress_libvirt::Generation::Kvm,
    construct: egress_provider_kvm::construct,
});
