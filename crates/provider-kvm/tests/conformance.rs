//! The conformance suite against the in-memory libvirt fake, with every hook (the support is
//! the kvm2 crate's, run with the first generation).

use egress_libvirt_ssh::testing as support;

egress_conformance::conformance_suite!(support::FakeTarget(egress_libvirt::engine::Generation::Kvm));
