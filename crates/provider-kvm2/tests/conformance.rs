//! The conformance suite against the in-memory libvirt fake, with every hook.

use egress_libvirt::testing as support;

egress_conformance::conformance_suite!(support::FakeTarget(egress_libvirt::Generation::Kvm2));
