//! The operator with the conformance crate's in-memory reference provider registered as type
//! `reference` and a scripted health verdict (every probed Proxy is healthy, 7 ms). The same
//! program as `egress-operator` otherwise: the binary's end-to-end tests and `cargo xtask bench`
//! run it, since the shipped binary has no backend that runs inside a test.
//!
//! Not a product: instances live in this process's memory and vanish with it.

use std::process::ExitCode;
use std::sync::Arc;

use egress_conformance::memory::{MemoryBackend, MemoryProvider, MemoryTarget};
use egress_controller::reconciler::HealthVerdicts;
use egress_controller::status::Verdict;
use egress_provider::config::{ProviderConfig, validators};
use egress_provider::{Provider, ProviderType, Registry};

struct AllHealthy;

impl HealthVerdicts for AllHealthy {
    fn verdict(&self, _namespace: &str, _name: &str) -> Option<Verdict> {
        Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(7),
            auth_refused: false,
        })
    }
}

fn main() -> ExitCode {
    let backend = MemoryBackend::new();
    let registry = Registry::new().with(ProviderType::new(
        "reference",
        validators::none,
        move |entry: &ProviderConfig| {
            let p: Arc<dyn Provider> = Arc::new(MemoryProvider::new(
                &entry.name,
                MemoryTarget::config(&backend),
                backend.clone(),
                vec![],
            ));
            Ok(p)
        },
    ));
    egress_operator::main_with(egress_operator::Extensions {
        registry: Box::new(move |_| registry),
        health: egress_operator::Health::Scripted {
            verdicts: Arc::new(AllHealthy),
            events: Box::pin(futures::stream::pending()),
        },
        notice: Some("reference build: instances are in this process's memory, and every Proxy is reported healthy"),
    })
}
