//! The conformance suite against the fake Compute server, whose state and fault injection
//! serve as the backend hooks.

mod support;

egress_conformance::conformance_suite!(support::GcpTarget);
