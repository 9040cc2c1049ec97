//! The egress-proxy operator process: flags, logging, tracing export, the metrics and probe
//! servers, leader election, and the composition of the controllers.
//!
//! ```text
//! flags ─► logger ─► tracing ─► signals ─► providers (load, build: fail fast)
//!       ─► kube client ─► probe + metrics servers ─► Proxy cache (every replica)
//!       ─► leader? ─► reconciler, orphan GC, provider-health monitor ─► shutdown, flush
//! ```
//!
//! [`main_with`] is the whole program; the binary calls it with the provider types it ships and
//! the health engine's seam. Tests and the bench call it with the conformance crate's reference
//! provider and a scripted health verdict.

mod clients_config;
mod discovery_auth;
mod discovery_tls;
mod exit_check;
pub mod flags;
mod followed;
mod install;
mod lease_password;
mod lease_store;
mod log_keys;
mod manager;
mod probe_tls;
mod rest_metrics;
mod servers;

use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use egress_api::Proxy;
use egress_controller::proxy::health::HealthVerdicts;
use egress_provider::Registry;
use egress_runtime::process::{self, Program};
pub use egress_runtime::serve;
use futures::Stream;
use kube::runtime::reflector::ObjectRef;

use crate::flags::Options;

/// The operator, for its help, start line and spans.
pub const PROGRAM: Program = Program {
    name: "egress-operator",
    service: "egress-proxies-operator",
    commit: egress_runtime::COMMIT,
    rust_version: egress_runtime::RUSTC_VERSION,
    span_keys: &[log_keys::RECONCILE],
};
/// The commit this binary was built from.
pub const COMMIT: &str = PROGRAM.commit;

/// How long the controllers get to stop after SIGTERM before the process exits anyway (the
/// Deployment's grace period is 10 s; the trace flush has its own budget after this).
const STOP_BUDGET: Duration = Duration::from_secs(5);

/// Flags the composition root defines for provider types, handed to the registry builder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderFlags {
    /// `--gcp-wire-log-full-payloads`.
    pub gcp_wire_log_full_payloads: bool,
    /// The namespaces the operator serves (`--proxy-namespace`, resolved); `None`: every one.
    pub proxy_namespaces: Option<Vec<String>>,
    /// What is internal for what providers fetch on a Proxy's word (kvm and kvm2 image URLs):
    /// the fixed lists, plus `--cluster-cidrs`, minus `--allowed-internal-destinations`; the
    /// same judge the External Proxies' endpoints meet.
    pub internal: egress_netguard::Guard,
}

/// Builds the registry of provider types once the command line is parsed.
pub type RegistryBuilder = Box<dyn FnOnce(&ProviderFlags) -> Registry + Send>;

/// What the caller plugs in: the provider types it ships, and where health verdicts come from.
pub struct Extensions {
    pub registry: RegistryBuilder,
    pub health: Health,
    /// Said once at start when set: what this build lacks.
    pub notice: Option<&'static str>,
}

/// Proxies whose verdict changed, so they are reconciled at once.
pub type HealthEvents = Pin<Box<dyn Stream<Item = ObjectRef<Proxy>> + Send>>;

/// Where health verdicts come from.
pub enum Health {
    /// The health engine, probing through each proxy (configured by the `--health-*` flags).
    Engine,
    /// Verdicts given from outside (tests and the bench, with the reference provider).
    Scripted {
        verdicts: Arc<dyn HealthVerdicts>,
        events: HealthEvents,
    },
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Engine => "Health::Engine",
            Self::Scripted { .. } => "Health::Scripted",
        })
    }
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extensions").finish_non_exhaustive()
    }
}

/// Parses the process's arguments and runs the operator ([`egress_runtime::process::main`]).
pub fn main_with(extensions: Extensions) -> ExitCode {
    process::main(&PROGRAM, flags::all(), |options, shutdown| {
        manager::operate(options, extensions, shutdown)
    })
}

/// Runs the operator with `options` until SIGTERM/SIGINT or a fatal error: in this process, for
/// tests and the bench.
pub async fn run(options: Options, extensions: Extensions) -> ExitCode {
    process::run(&PROGRAM, options, |options, shutdown| {
        manager::operate(options, extensions, shutdown)
    })
    .await
}

/// The API client, its requests counted as client-go counted them: from `--kubeconfig` when
/// given (the Go operator's flag, from controller-runtime), else as kube infers it
/// (`KUBECONFIG`, `~/.kube/config`, in-cluster).
/// The client settings `--kubeconfig` (or, empty, kube's inference) gives. Contacts nothing.
async fn kube_config(kubeconfig: &str) -> Result<kube::Config, String> {
    if kubeconfig.is_empty() {
        return kube::Config::infer().await.map_err(|e| e.to_string());
    }
    let file =
        kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| format!("--kubeconfig {kubeconfig}: {e}"))?;
    kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| format!("--kubeconfig {kubeconfig}: {e}"))
}

async fn kube_client(kubeconfig: &str) -> Result<(kube::Client, rest_metrics::RestClientMetrics), String> {
    let config = kube_config(kubeconfig).await?;
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let metrics = rest_metrics::RestClientMetrics::new(host);
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| e.to_string())?
        .with_layer(&metrics)
        .build();
    Ok((client, metrics))
}
