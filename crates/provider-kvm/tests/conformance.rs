//! The conformance suite against the in-memory libvirt fake, with every hook (the support is
//! the kvm2 crate's, run with the first generation).

#[path = "../../provider-kvm2/tests/support/mod.rs"]
mod support;

egress_conformance::conformance_suite!(support::FakeTarget(egress_libvirt::engine::Generation::Kvm));
