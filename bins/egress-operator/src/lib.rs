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
pub mod flags;
mod followed;
mod install;
mod lease_store;
pub mod logging;
mod manager;
mod probe_tls;
mod rest_metrics;
pub mod serve;
pub mod telemetry;

use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use egress_api::Proxy;
use egress_controller::proxy::health::HealthVerdicts;
use egress_provider::Registry;
use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::flags::{Command, Options};

/// The commit this binary was built from.
pub const COMMIT: &str = env!("EGRESS_COMMIT");

/// How long the controllers get to stop after SIGTERM before the process exits anyway (the
/// Deployment's grace period is 10 s; the trace flush has its own budget after this).
const STOP_BUDGET: Duration = Duration::from_secs(5);
/// The budget of the final trace flush.
const FLUSH_BUDGET: Duration = Duration::from_secs(10);

/// Flags the composition root defines for provider types, handed to the registry builder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderFlags {
    /// `--gcp-wire-log-full-payloads`.
    pub gcp_wire_log_full_payloads: bool,
    /// The namespaces the operator serves (`--proxy-namespace`, resolved); `None`: every one.
    pub proxy_namespaces: Option<Vec<String>>,
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

/// Parses the process's arguments and runs the operator; the exit code follows the Go operator:
/// 2 for an unusable command line, 1 for a failed start or run, 0 after a clean shutdown.
pub fn main_with(extensions: Extensions) -> ExitCode {
    let options = match flags::parse(std::env::args().skip(1)) {
        Ok(Command::Run(o)) => o,
        Ok(Command::Help) => {
            eprint!("{}", flags::usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // Before any logger exists: plain text.
            eprintln!("{e}");
            eprintln!("Run egress-operator -h to list the flags.");
            return ExitCode::from(2);
        }
    };
    if options.version {
        println!("{COMMIT}");
        return ExitCode::SUCCESS;
    }
    // reqwest (OTLP export) is built without a default crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(*options, extensions));
    // Tasks still running (servers, watches) are dropped here, without waiting on them.
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// Installs the operator's logger as `options` ask for it, without span export: for a program
/// that serves part of the operator alone and must log as the manager does (the bench's API
/// over a fixed directory writes the same request lines).
pub fn install_logger(options: &Options) {
    install_logging(options, None);
}

/// Installs the logger (and the span exporter when the environment asks for one).
fn install_logging(options: &Options, tracer: Option<&opentelemetry_sdk::trace::SdkTracerProvider>) {
    let config = options.log.resolve();
    let filter = tracing_subscriber::filter::filter_fn(move |meta| {
        // Spans of our crates always reach the formatter, so their fields are on every line
        // inside them whatever the level.
        (meta.is_span() && meta.target().starts_with("egress")) || config.enabled(meta.target(), *meta.level())
    });
    let fmt = tracing_subscriber::fmt::layer()
        .fmt_fields(logging::span_fields())
        .event_format(logging::ZapFormat { config })
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let otel = tracer.map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(telemetry::tracer(provider))
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::dynamic_filter_fn(|meta, cx| {
                // Only spans (no span events), and only ours, plus Kubernetes API calls made
                // inside one of ours: watches, lease renewals and other background calls never
                // start a trace.
                meta.is_span()
                    && (meta.target().starts_with("egress")
                        || (meta.target().starts_with("kube_client") && cx.lookup_current().is_some()))
            }))
    });
    let subscriber = tracing_subscriber::registry().with(fmt).with(otel);
    let dispatch = tracing::Dispatch::new(subscriber);
    if tracer.is_some() {
        logging::enable_trace_ids(&dispatch);
    }
    let _ = tracing::dispatcher::set_global_default(dispatch);
}

/// Runs until SIGTERM/SIGINT or a fatal error.
pub async fn run(options: Options, extensions: Extensions) -> ExitCode {
    let env = |k: &str| std::env::var(k).ok();
    let tracing_mode = telemetry::mode(env);
    let provider = match &tracing_mode {
        Ok(mode) => telemetry::provider(*mode, COMMIT),
        Err(e) => Err(e.clone()),
    };
    install_logging(&options, provider.as_ref().ok().and_then(Option::as_ref));
    tracing::info!(
        commit = COMMIT,
        rustVersion = env!("EGRESS_RUSTC_VERSION"),
        "Starting egress-proxies-operator"
    );
    let tracer = match provider {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "Failed to set up tracing");
            return ExitCode::FAILURE;
        }
    };
    match (&tracer, &tracing_mode) {
        (Some(_), Ok(mode)) => tracing::info!(exporter = ?mode, "tracing enabled"),
        _ => tracing::info!("tracing disabled"),
    }

    let shutdown = CancellationToken::new();
    if let Err(e) = on_signal(shutdown.clone()) {
        tracing::error!(error = %e, "Failed to install the signal handler");
        return ExitCode::FAILURE;
    }

    let outcome = manager::operate(options, extensions, shutdown).await;

    if let Some(provider) = tracer
        && let Err(e) = telemetry::shutdown(provider, FLUSH_BUDGET).await
    {
        tracing::error!(error = %e, "Failed to flush traces on shutdown");
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fatal { message, error, path }) => {
            match (error, path) {
                (Some(error), Some(path)) => tracing::error!(error = %error, path = %path, "{message}"),
                (Some(error), None) => tracing::error!(error = %error, "{message}"),
                _ => tracing::error!("{message}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// Why the operator stops with exit code 1: the message, and the cause when there is one.
struct Fatal {
    message: String,
    error: Option<String>,
    /// The file the problem is in, as its own log key.
    path: Option<String>,
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

fn fatal(message: impl Into<String>, error: impl std::fmt::Display) -> Fatal {
    Fatal {
        message: message.into(),
        error: Some(error.to_string()),
        path: None,
    }
}

fn fatal_plain(message: impl Into<String>) -> Fatal {
    Fatal {
        message: message.into(),
        error: None,
        path: None,
    }
}

fn on_signal(shutdown: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "Stopping"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "Stopping"),
        }
        shutdown.cancel();
    });
    Ok(())
}
