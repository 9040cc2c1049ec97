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

mod discovery_auth;
pub mod flags;
pub mod logging;
mod rest_metrics;
pub mod serve;
pub mod telemetry;

use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_api::Proxy;
use egress_controller::decide::Timings;
use egress_controller::gc::OrphanGc;
use egress_controller::leader::{ElectionTimings, Elector, LEASE_NAME};
use egress_controller::provider_health::{self, Monitor, Snapshot};
use egress_controller::reconciler::{Context, ControllerConfig, HealthVerdicts, controller};
use egress_provider::Registry;
use egress_provider::config::ProvidersConfig;
use egress_provider::decorate::ProviderMetrics;
use futures::{FutureExt as _, Stream, StreamExt as _};
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProviderFlags {
    /// `--gcp-wire-log-full-payloads`.
    pub gcp_wire_log_full_payloads: bool,
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

    let outcome = operate(options, extensions, shutdown).await;

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
async fn kube_client(kubeconfig: &str) -> Result<(kube::Client, rest_metrics::RestClientMetrics), String> {
    let config = if kubeconfig.is_empty() {
        kube::Config::infer().await.map_err(|e| e.to_string())?
    } else {
        let file =
            kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| format!("--kubeconfig {kubeconfig}: {e}"))?;
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| format!("--kubeconfig {kubeconfig}: {e}"))?
    };
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

/// The namespace the leader Lease lives in: the pod's own (downward API or service account), or
/// the kubeconfig's when run outside a cluster.
fn own_namespace(client: &kube::Client) -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| client.default_namespace().to_string())
}

/// This replica's name in the Lease: the pod (or host) name plus a random suffix, as
/// controller-runtime makes it, so a restarted pod is a new candidate.
fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "egress-operator".into());
    let suffix = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|u| u.trim().to_string())
        .unwrap_or_else(|_| format!("{}", std::process::id()));
    format!("{host}_{suffix}")
}

async fn operate(options: Options, extensions: Extensions, shutdown: CancellationToken) -> Result<(), Fatal> {
    let Extensions {
        registry,
        health,
        notice,
    } = extensions;
    let registry = registry(&ProviderFlags {
        gcp_wire_log_full_payloads: options.gcp_wire_log_full_payloads,
    });
    if options.providers_config.is_empty() {
        return Err(fatal_plain("--providers-config is required"));
    }
    let schedule = provider_health::schedule(options.provider_check_interval, options.provider_check_timeout)
        .map_err(|e| fatal("Invalid provider check flags", e))?;
    let path = std::path::Path::new(&options.providers_config);
    let config = ProvidersConfig::load(path, &registry).map_err(|e| Fatal {
        message: "Failed to load providers config".into(),
        error: Some(e.message),
        path: Some(options.providers_config.clone()),
    })?;
    let probe_tls = match (&health, options.health_check_ca_file.as_str()) {
        (Health::Scripted { .. }, _) => None,
        (Health::Engine, "") => Some(egress_health::ProbeTls::system()),
        (Health::Engine, file) => Some(egress_health::ProbeTls::system_and_file(std::path::Path::new(file))),
    }
    .transpose()
    .map_err(|e| fatal("Failed to load the health probes' CA roots", e))?;
    let provider_metrics = ProviderMetrics::new();
    let providers = Arc::new(
        registry
            .build(&config, &provider_metrics)
            .map_err(|e| fatal("Failed to build providers", e))?,
    );
    tracing::info!(
        providers = ?providers.entries().iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        "Providers ready"
    );
    if let Some(notice) = notice {
        tracing::warn!("{notice}");
    }

    let (client, rest_metrics) = kube_client(&options.kubeconfig)
        .await
        .map_err(|e| fatal("Failed to create the Kubernetes client", e))?;

    // Every replica: probes, metrics, the Proxy cache.
    let snapshot = Snapshot::default();
    let namespace = Some(options.proxy_namespace.clone()).filter(|n| !n.is_empty());
    let (cache, keep_cache) =
        egress_controller::proxy_cache::proxy_cache(client.clone(), namespace.as_deref(), shutdown.clone());
    let (credentials, keep_credentials) =
        egress_controller::credentials::credential_cache(client.clone(), namespace.as_deref(), shutdown.clone());
    let mut tasks = tokio::task::JoinSet::new();
    let cache_task = tasks.spawn(keep_cache).id();
    tasks.spawn(keep_credentials);
    let mut registry = prometheus_client::registry::Registry::default();
    provider_metrics.register(&mut registry);
    let health_metrics = egress_health::HealthMetrics::new();
    health_metrics.register(&mut registry);
    egress_controller::metrics::register(&mut registry, snapshot.clone(), cache.store());
    // controller-runtime's families, for dashboards built for the Go operator.
    let reconcile_metrics =
        egress_controller::runtime_metrics::ReconcileMetrics::new(ControllerConfig::default().concurrency);
    reconcile_metrics.register(&mut registry);
    rest_metrics.register(&mut registry);
    egress_controller::runtime_metrics::register_process(&mut registry);
    // Leases live in this process (one replica) or in Redis (shared by every replica); the
    // store and its sweep run on every replica.
    let store = lease_store(&options)?;
    registry.register_collector(Box::new(egress_controller::metrics::LeasesActive(store.clone())));
    registry.register_collector(Box::new(egress_controller::metrics::CooldownsDropped(store.clone())));
    let registry = Arc::new(Mutex::new(registry));
    let mut always = vec![cache_task, tasks.spawn(sweep(store.clone(), shutdown.clone())).id()];

    let limits = egress_http::Limits {
        max_connections: options.max_connections,
        ..egress_http::Limits::DEFAULT
    };
    if options.health_probe_bind_address != "0" {
        let addr = serve::bind_address("health-probe-bind-address", &options.health_probe_bind_address)
            .map_err(|e| fatal("Failed to start the health probe server", e))?;
        let bound = serve::probes(addr, limits, shutdown.clone())
            .await
            .map_err(|e| fatal("Failed to start the health probe server", e))?;
        tracing::info!(address = %bound, "Serving health probes");
    }
    if options.metrics_bind_address != "0" {
        let addr = serve::bind_address("metrics-bind-address", &options.metrics_bind_address)
            .map_err(|e| fatal("Failed to start the metrics server", e))?;
        let guard = options.metrics_secure.then(|| serve::Guard::new(client.clone()));
        let bound = serve::metrics(
            addr,
            registry.clone(),
            guard,
            options.enable_http2,
            limits,
            shutdown.clone(),
        )
        .await
        .map_err(|e| fatal("Failed to start the metrics server", e))?;
        tracing::info!(address = %bound, secure = options.metrics_secure, "Serving metrics");
    }
    if options.discovery_addr != "0" {
        let addr = serve::bind_address("discovery-addr", &options.discovery_addr)
            .map_err(|e| fatal("Failed to start the discovery server", e))?;
        let listener = serve::listen(addr)
            .await
            .map_err(|e| fatal("Failed to start the discovery server", format!("binding {addr}: {e}")))?;
        let bound = listener
            .local_addr()
            .map_err(|e| fatal("Failed to start the discovery server", e))?;
        let auth = discovery_auth::start(&options, &client, &own_namespace(&client), &mut tasks, &shutdown).await;
        let api = egress_discovery::Api {
            directory: Arc::new(egress_controller::discovery::CachedDirectory::new(
                cache.clone(),
                credentials.clone(),
            )),
            store: store.clone(),
            max_ttl: options.max_lease_ttl,
            auth,
        };
        always.push(
            tasks
                .spawn(egress_discovery::serve(
                    listener,
                    Arc::new(api),
                    limits,
                    shutdown.clone(),
                ))
                .id(),
        );
        tracing::info!(address = %bound, "Serving the discovery API");
    }

    // Leader-only work waits for the Lease.
    let mut leading = None;
    if options.leader_elect {
        let namespace = own_namespace(&client);
        let elector = Elector::new(
            kube::Api::namespaced(client.clone(), &namespace),
            LEASE_NAME,
            &identity(),
            ElectionTimings::default(),
        )
        .map_err(|e| fatal("Failed to set up leader election", e))?;
        tracing::info!(lease = %format!("{namespace}/{LEASE_NAME}"), "Attempting to acquire leader lease");
        let (_task, mut rx) = elector.run(shutdown.clone());
        egress_controller::runtime_metrics::register_leader(
            &mut registry.lock().unwrap_or_else(|p| p.into_inner()),
            LEASE_NAME,
            rx.clone(),
        );
        tokio::select! {
            _ = shutdown.cancelled() => return stop(tasks).await,
            // Only whether it was won is kept: the watch's read guard must not live across the
            // other arm's await, or this future could not be sent to another thread.
            won = rx.wait_for(|l| *l).map(|r| r.is_ok()) => if !won {
                return Err(fatal_plain("leader election ended before this replica led"));
            },
        }
        leading = Some(rx);
    }

    tracing::info!("Starting manager");
    // The leader publishes the proxies it serves to a shared store, so every replica leases
    // with the same capacity, health and latency.
    tasks.spawn(egress_discovery::publish_view(
        Arc::new(egress_controller::discovery::CachedDirectory::new(
            cache.clone(),
            credentials.clone(),
        )),
        store.clone(),
        shutdown.clone(),
    ));
    let installation = Some(options.installation_id.clone()).filter(|i| !i.is_empty());
    let work = shutdown.child_token();
    let mut essential: std::collections::HashSet<tokio::task::Id> = always.into_iter().collect();
    let (verdicts, health_events): (Arc<dyn HealthVerdicts>, HealthEvents) = match (health, probe_tls) {
        (Health::Scripted { verdicts, events }, _) => (verdicts, events),
        (Health::Engine, tls) => {
            let snapshot = egress_health::Snapshot::default();
            let (tx, rx) = tokio::sync::mpsc::channel(egress_health::engine::EVENT_CAPACITY);
            let engine = egress_health::Engine::new(
                Arc::new(egress_controller::health::CachedProxies {
                    cache: cache.clone(),
                    default_url: options.health_check_url.clone(),
                    credentials: credentials.clone(),
                }),
                egress_health::ConnectProber {
                    tls: tls.ok_or_else(|| fatal_plain("the health engine has no TLS settings (a bug)"))?,
                },
                egress_health::EngineConfig {
                    workers: options.health_workers,
                    trace_probes: options.trace_health_probes,
                    ..Default::default()
                },
                health_metrics,
                snapshot.clone(),
                tx,
            );
            essential.insert(tasks.spawn(engine.run(work.clone())).id());
            let events =
                tokio_stream::wrappers::ReceiverStream::new(rx).map(|key| egress_controller::health::object_ref(&key));
            (Arc::new(snapshot), Box::pin(events))
        }
    };
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            providers.clone(),
            verdicts,
            Timings::default(),
            installation.clone(),
            work.clone(),
        )
        .with_credentials(credentials.clone())
        .with_metrics(reconcile_metrics),
    );
    let config = ControllerConfig {
        namespace,
        ..Default::default()
    };
    // These run until shutdown; one that ends before is a failure of the manager. (The monitor
    // may end early by design: with checks off it only cleans up.)
    essential.insert(
        tasks
            .spawn(controller(ctx, config, cache.clone(), health_events, work.clone()))
            .id(),
    );
    essential.insert(
        tasks
            .spawn(
                OrphanGc {
                    client: client.clone(),
                    providers: providers.clone(),
                    interval: options.gc_interval,
                    min_age: options.gc_min_age,
                    installation,
                }
                .run(work.clone()),
            )
            .id(),
    );
    tasks.spawn(
        Monitor {
            client,
            providers,
            schedule,
            snapshot,
        }
        .run(work.clone()),
    );

    let lost = async {
        match leading.as_mut() {
            Some(rx) => {
                let _ = rx.wait_for(|l| !*l).await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(lost);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return stop(tasks).await,
            _ = &mut lost => {
                if shutdown.is_cancelled() {
                    return stop(tasks).await;
                }
                // As controller-runtime does: a replica that lost the Lease stops at once (no
                // grace: another replica may lead already) and exits, to be restarted as a fresh
                // candidate.
                tasks.abort_all();
                shutdown.cancel();
                return Err(fatal_plain("leader election lost"));
            }
            Some(ended) = tasks.join_next_with_id() => {
                if shutdown.is_cancelled() {
                    // Parts end because of the shutdown; that is no failure.
                    return stop(tasks).await;
                }
                let failure = match ended {
                    Ok((id, ())) if essential.contains(&id) => "a part of the manager stopped unexpectedly".to_string(),
                    Ok(_) => continue,
                    Err(e) if e.is_panic() => format!("a part of the manager panicked: {e}"),
                    Err(e) => e.to_string(),
                };
                shutdown.cancel();
                let _ = stop(tasks).await;
                return Err(fatal("Failed to run manager", failure));
            }
        }
    }
}

/// The store `--lease-store` names. Contacts nothing: a Redis that is down only makes lease
/// calls answer 503 until it is up.
fn lease_store(options: &Options) -> Result<Arc<dyn egress_lease::LeaseStore>, Fatal> {
    if options.lease_store == "memory" {
        return Ok(Arc::new(egress_lease::MemoryStore::new(
            Arc::new(egress_lease::SystemClock),
            options.lease_cooldown,
        )));
    }
    // Two installations sharing one Redis keep apart by their installation id.
    let prefix = match options.installation_id.as_str() {
        "" => egress_lease_redis::DEFAULT_PREFIX.to_owned(),
        id => format!("{}{id}:", egress_lease_redis::DEFAULT_PREFIX),
    };
    let store = egress_lease_redis::RedisStore::new(&options.lease_store, &prefix, options.lease_cooldown)
        .map_err(|e| fatal("Failed to set up the lease store", e))?;
    tracing::info!(redis = %egress_lease_redis::shown_url(&options.lease_store), prefix, "Leases are kept in Redis");
    Ok(Arc::new(store))
}

/// Forgets ended leases and cooldowns every 30 s, until `shutdown`.
async fn sweep(store: Arc<dyn egress_lease::LeaseStore>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(30)) => {
                if let Err(e) = store.sweep().await {
                    tracing::info!(error = %e, "Lease sweep skipped");
                }
            }
        }
    }
}

/// Waits for the running parts to stop, within [`STOP_BUDGET`].
async fn stop(mut tasks: tokio::task::JoinSet<()>) -> Result<(), Fatal> {
    let all = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(STOP_BUDGET, all).await.is_err() {
        tracing::info!("Some parts did not stop within the budget; exiting anyway");
    }
    tracing::info!("Stopped");
    Ok(())
}
