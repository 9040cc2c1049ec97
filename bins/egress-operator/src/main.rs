//! The egress-proxy operator. Everything but the choice of provider types and health engine lives
//! in the library (`egress_operator::main_with`).

use std::process::ExitCode;
use std::sync::Arc;

use egress_controller::reconciler::HealthVerdicts;
use egress_controller::status::Verdict;

/// The health engine's seam, empty until the engine lands: no Proxy gets a verdict, so none is
/// marked Ready or Unhealthy. Said loudly at start.
struct NoHealthEngine;

impl HealthVerdicts for NoHealthEngine {
    fn verdict(&self, _namespace: &str, _name: &str) -> Option<Verdict> {
        None
    }
}

fn main() -> ExitCode {
    egress_operator::main_with(egress_operator::Extensions {
        // Provider types are registered here as their crates land (local, libvirt, kubernetes, gcp).
        registry: egress_provider::Registry::new(),
        health: Arc::new(NoHealthEngine),
        health_events: Box::pin(futures::stream::pending()),
        notice: Some("this build has no health engine yet: Proxies are provisioned but never marked Ready"),
    })
}
