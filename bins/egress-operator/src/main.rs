//! The egress-proxy operator. Everything but the choice of provider types lives in the library
//! (`egress_manager::main_with`).

use std::process::ExitCode;

fn main() -> ExitCode {
    egress_manager::main_with(egress_manager::Extensions {
        registry: Box::new(|flags| {
            // The order is the one the loader names keys and blocks in its messages
            // (`expected one of ...`, `a <block> block is set`), as the Go operator's did.
            egress_provider::Registry::new()
                .with(egress_provider_kubernetes::provider_type_serving(
                    flags.proxy_namespaces.clone(),
                ))
                .with(egress_provider_gcp::provider_type(egress_provider_gcp::WireOptions {
                    full_payloads: flags.gcp_wire_log_full_payloads,
                }))
                .with(egress_provider_kvm::provider_type_judging(flags.internal.clone()))
                .with(egress_provider_kvm2::provider_type_judging(flags.internal.clone()))
                .with(egress_provider_local::provider_type())
        }),
        health: egress_manager::Health::Engine,
        notice: None,
    })
}
