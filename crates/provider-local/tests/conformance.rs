//! The conformance suite against simulated records and processes, with every hook.

mod support;

egress_conformance::conformance_suite!(support::LocalTarget::simulated());
