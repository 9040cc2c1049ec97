//! The conformance suite against the in-memory libvirt fake, with every hook.

use egress_libvirt_ssh::testing as support;

egress_conformance::conformance_suite!(support::FakeTarget(egress_libvirt::engine::Generation::Kvm2));
