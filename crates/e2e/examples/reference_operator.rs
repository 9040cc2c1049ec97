//! The operator with the conformance crate's in-memory reference provider registered as type
//! `reference` and a scripted health verdict (every probed Proxy is healthy, 7 ms). The same
//! program as `egress-operator` otherwise: the binary's end-to-end tests and `cargo xtask bench`
//! run it, since the shipped binary has no backend that runs inside a test.
//!
//! With `REFERENCE_UNHEALTHY_FILE` set, the Proxies that file lists (`<namespace>/<name>`, one
//! per line) are unhealthy, and those listed with a number after the name
//! (`<namespace>/<name> 250`) healthy with that latency in milliseconds: the file is read every
//! 10 ms, and a Proxy whose verdict changed is reconciled at once, as a health event of the real
//! engine makes it. The pool bench fails members this way; the operator bench writes status
//! changes through the API server this way.
//!
//! Not a product: instances live in this process's memory and vanish with it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use egress_api::Proxy;
use egress_conformance::memory::{MemoryBackend, MemoryProvider, MemoryTarget};
use egress_controller::proxy::health::HealthVerdicts;
use egress_controller::proxy::status::Verdict;
use egress_provider::config::{ProviderConfig, validators};
use egress_provider::{Provider, ProviderType, Registry};
use kube::runtime::reflector::ObjectRef;

/// The latency of every Proxy the file does not list.
const SCRIPTED_LATENCY: Duration = Duration::from_millis(7);

/// What the file says of the Proxies it lists: `None` unhealthy, `Some(latency)` healthy.
type Listed = HashMap<String, Option<Duration>>;

/// Every Proxy healthy at [`SCRIPTED_LATENCY`], but those the file lists.
#[derive(Default)]
struct Scripted {
    listed: Arc<std::sync::RwLock<Listed>>,
}

impl HealthVerdicts for Scripted {
    fn verdict(&self, namespace: &str, name: &str) -> Option<Verdict> {
        let listed = self
            .listed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&format!("{namespace}/{name}"))
            .copied();
        Some(Verdict {
            healthy: !matches!(listed, Some(None)),
            latency: listed.flatten().unwrap_or(SCRIPTED_LATENCY),
            auth_refused: false,
        })
    }
}

/// The file's lines: a key alone, or a key and a latency in milliseconds.
fn parse(text: &str) -> Listed {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let key = words.next()?.to_owned();
            let latency = words.next().and_then(|ms| ms.parse().ok()).map(Duration::from_millis);
            Some((key, latency))
        })
        .collect()
}

/// Follows `file` into `listed`, and yields each Proxy whose verdict changed.
fn follow(file: PathBuf, listed: Arc<std::sync::RwLock<Listed>>) -> egress_manager::HealthEvents {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        loop {
            let now = parse(&std::fs::read_to_string(&file).unwrap_or_default());
            let changed: Vec<String> = {
                let mut before = listed.write().unwrap_or_else(|p| p.into_inner());
                let mut changed: Vec<String> = before
                    .iter()
                    .filter(|(k, v)| now.get(*k) != Some(v))
                    .map(|(k, _)| k.clone())
                    .collect();
                changed.extend(now.keys().filter(|k| !before.contains_key(*k)).cloned());
                *before = now;
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
    egress_manager::main_with(egress_manager::Extensions {
        registry: Box::new(move |_| registry),
        health: {
            let verdicts = Scripted::default();
            let events = match std::env::var_os("REFERENCE_UNHEALTHY_FILE") {
                Some(file) => follow(file.into(), verdicts.listed.clone()),
                None => Box::pin(futures::stream::pending()),
            };
            egress_manager::Health::Scripted {
                verdicts: Arc::new(verdicts),
                events,
            }
        },
        notice: Some("reference build: instances are in this process's memory, and every Proxy is reported healthy"),
    })
}
