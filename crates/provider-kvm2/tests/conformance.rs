//! The conformance suite against the in-memory libvirt fake, with every hook.

mod support;

egress_conformance::conformance_suite!(support::FakeTarget(egress_libvirt::engine::Generation::Kvm2));
