//! The conformance suite against real tinyproxy processes and a real state directory
//! (`cargo xtask conformance --provider local --real`). The hooks a real process cannot honour
//! (held pending, an arbitrary address) answer Unsupported and their cases skip; without
//! tinyproxy every case skips, and under `cargo xtask test` fails.

mod support;

egress_conformance::conformance_suite!(support::LocalTarget::real());
