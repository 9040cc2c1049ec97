//! The egress-proxy operator. Everything but the choice of provider types lives in the library
//! (`egress_operator::main_with`).

use std::process::ExitCode;

fn main() -> ExitCode {
    egress_operator::main_with(egress_operator::Extensions {
        // Provider types are registered here as their crates land (local, libvirt, kubernetes, gcp).
        registry: egress_provider::Registry::new(),
        health: egress_operator::Health::Engine,
        notice: None,
    })
}
