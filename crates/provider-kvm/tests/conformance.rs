//! The conformance suite against the in-memory libvirt fake, with every hook (the target is
//! `egress-libvirt`'s, shared with kvm2, run with the first generation).

use egress_libvirt::testing as support;

egress_conformance::conformance_suite!(support::FakeTarget(egress_libvirt::Generation::Kvm));
