//! The operator with the conformance crate's in-memory reference provider registered as type
//! `reference` and a scripted health verdict (every probed Proxy is healthy, 7 ms). The same
//! program as `egress-operator` otherwise: the binary's end-to-end tests and `cargo xtask bench`
//! run it, since the shipped binary has no backend that runs inside a test.
//!
//! With `REFERENCE_UNHEALTHY_FILE` set, the Proxies that file lists (`<namespace>/<name>`, one
//! per line) are unhealthy: the file is read every 10 ms, and a Proxy whose verdict changed is
//! reconciled at once, as a health event of the real engine makes it. The pool bench fails
//! members this way.
//!
//! Not a product: instances live in this process's memory and vanish with it.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use egress_api::Proxy;
use egress_conformance::memory::{MemoryBackend, MemoryProvider, MemoryTarget};
use egress_controller::reconciler::HealthVerdicts;
use egress_controller::status::Verdict;
use egress_provider::config::{ProviderConfig, validators};
use egress_provider::{Provider, ProviderType, Registry};
use kube::runtime::reflector::ObjectRef;

/// Every Proxy healthy, but those named in the unhealthy set.
#[derive(Default)]
struct Scripted {
    unhealthy: Arc<std::sync::RwLock<HashSet<String>>>,
}

impl HealthVerdicts for Scripted {
    fn verdict(&self, namespace: &str, name: &str) -> Option<Verdict> {
        let listed = self
            .unhealthy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&format!("{namespace}/{name}"));
        Some(Verdict {
            healthy: !listed,
            latency: std::time::Duration::from_millis(7),
            auth_refused: false,
        })
    }
}

/// Follows `file` into `unhealthy`, and yields each Proxy whose verdict changed.
fn follow(file: PathBuf, unhealthy: Arc<std::sync::RwLock<HashSet<String>>>) -> egress_operator::HealthEvents {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        loop {
            let listed: HashSet<String> = std::fs::read_to_string(&file)
                .unwrap_or_default()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect();
            let changed: Vec<String> = {
                let mut now = unhealthy.write().unwrap_or_else(|p| p.into_inner());
                let changed = now.symmetric_difference(&listed).cloned().collect();
                *now = listed;
                changed
            };
            for key in changed {
                if let Some((namespace, name)) = key.split_once('/')
                    && tx.send(ObjectRef::<Proxy>::new(name).within(namespace)).is_err()
                {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
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
        health: {
            let verdicts = Scripted::default();
            let events = match std::env::var_os("REFERENCE_UNHEALTHY_FILE") {
                Some(file) => follow(file.into(), verdicts.unhealthy.clone()),
                None => Box::pin(futures::stream::pending()),
            };
            egress_operator::Health::Scripted {
                verdicts: Arc::new(verdicts),
                events,
            }
        },
        notice: Some("reference build: instances are in this process's memory, and every Proxy is reported healthy"),
    })
}
