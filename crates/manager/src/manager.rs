//! The manager `run` starts once the flags are parsed and the logger is up, in named steps:
//!
//! 1. [`load_providers`]: the providers file, built into providers, and the health probes'
//!    TLS roots. Fails fast, before any connection.
//! 2. [`start_replica`]: what every replica runs: the Kubernetes client, the Proxy and Secret
//!    caches, the lease store (`lease_store.rs`) with its sweep and, over TLS, the re-reading of
//!    its TLS files, the metrics registry, and the probe, metrics and discovery servers.
//! 3. [`lead`]: with `--leader-elect`, waiting for the Lease.
//! 4. [`start_leader_tasks`]: the leader's work: the view it publishes to the lease store, the
//!    health engine (with its CA file read again first: the Lease may have come long after the
//!    start), the Proxy and ProxyPool controllers, the orphan GC and the provider-health monitor.
//! 5. [`supervise`]: running until shutdown, a lost Lease, or a part that ends before it should.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_controller::create_budget::{CreateBudgets, SystemClock};
use egress_controller::gc::OrphanGc;
use egress_controller::leader::{ElectionTimings, Elector, LEASE_NAME};
use egress_controller::provider_health::{self, Monitor, ProviderHealthSnapshot, Schedule};
use egress_controller::proxy::context::Context;
use egress_controller::proxy::controller::ControllerConfig;
use egress_controller::proxy::credentials::CredentialCache;
use egress_controller::proxy::decide::Timings;
use egress_controller::proxy::health::HealthVerdicts;
use egress_controller::proxy_cache::ProxyCache;
use egress_controller::runtime_metrics::ReconcileMetrics;
use egress_controller::{pool, proxy};
use egress_lease::LeaseStore;
use egress_provider::Providers;
use egress_provider::config::ProvidersConfig;
use egress_provider::decorate::ProviderMetrics;
use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::watch;
use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::flags::Options;
use crate::install::Namespaced;
use crate::{Extensions, Health, HealthEvents, ProviderFlags, STOP_BUDGET};
use egress_runtime::Fatal;

/// Runs the operator until shutdown (or a failure), step by step.
pub(crate) async fn operate(
    options: Options,
    extensions: Extensions,
    shutdown: CancellationToken,
) -> Result<(), Fatal> {
    let Extensions {
        registry,
        health,
        notice,
    } = extensions;
    // Where the operator runs (contacts nothing), and so which namespaces it serves.
    let own_namespace = crate::install::own_namespace(&options.kubeconfig).await;
    let served = crate::install::namespaces(&options.proxy_namespaces, &own_namespace);
    let internal = internal_guard(&options)?;
    let registry = registry(&ProviderFlags {
        gcp_wire_log_full_payloads: options.gcp_wire_log_full_payloads,
        proxy_namespaces: served.names().map(|n| n.iter().cloned().collect()),
        internal: internal.clone(),
    });
    let loaded = load_providers(&options, &registry, &health)?;
    if let Some(notice) = notice {
        tracing::warn!("{notice}");
    }
    let replica = start_replica(
        &options,
        &loaded,
        Namespaced {
            own: own_namespace,
            served,
        },
        &shutdown,
    )
    .await?;
    let leading = match lead(&options, &replica, &shutdown).await? {
        Leadership::Stopping => return stop(replica.tasks).await,
        Leadership::Leading(leading) => leading,
    };
    let running = start_leader_tasks(&options, replica, loaded, health, &shutdown)?;
    supervise(running, leading, shutdown).await
}

/// The built providers and what the leader checks them with.
struct Loaded {
    providers: Arc<Providers>,
    provider_metrics: ProviderMetrics,
    /// Each entry's create budget (`createsPerMinute`): the leader's reconciler asks it before
    /// every create, and every replica serves its metrics (a non-leader's read 0).
    create_budgets: CreateBudgets,
    /// The provider-health checks' schedule (`None`: checks are off).
    schedule: Option<Schedule>,
    /// The health engine's TLS roots (`None` with scripted verdicts).
    probe_roots: Option<crate::probe_tls::ProbeRoots>,
}

/// Step 1: the providers file, loaded and built (all or nothing), the probes' TLS roots, and
/// the GeoIP files checked.
fn load_providers(options: &Options, registry: &egress_provider::Registry, health: &Health) -> Result<Loaded, Fatal> {
    if options.providers_config.is_empty() {
        return Err(Fatal::plain("--providers-config is required"));
    }
    let schedule = provider_health::schedule(options.provider_check_interval, options.provider_check_timeout)
        .map_err(|e| Fatal::new("Invalid provider check flags", e))?;
    let path = std::path::Path::new(&options.providers_config);
    let config = ProvidersConfig::load(path, registry).map_err(|e| Fatal {
        message: "Failed to load providers config".into(),
        error: Some(e.message),
        path: Some(options.providers_config.clone()),
    })?;
    let probe_roots = match health {
        Health::Scripted { .. } => None,
        Health::Engine => Some(crate::probe_tls::load(&options.health_check_ca_file)?),
    };
    crate::exit_check::check_geoip(options)?;
    let provider_metrics = ProviderMetrics::new();
    let providers = Arc::new(
        registry
            .build(&config, &provider_metrics)
            .map_err(|e| Fatal::new("Failed to build providers", e))?,
    );
    tracing::info!(
        providers = ?providers.entries().iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        "Providers ready"
    );
    let create_budgets = CreateBudgets::for_providers(&providers, Arc::new(SystemClock));
    Ok(Loaded {
        providers,
        provider_metrics,
        create_budgets,
        schedule,
        probe_roots,
    })
}

/// What every replica runs, and the handles the leader's tasks share.
struct Replica {
    client: kube::Client,
    namespaces: Namespaced,
    /// `--installation-id`, or the one derived from the cluster and the namespace.
    installation: String,
    cache: ProxyCache,
    credentials: CredentialCache,
    /// The discovery API's view of the Proxies, which the leader publishes to a shared store.
    directory: Arc<egress_controller::discovery::LiveDirectory>,
    store: Arc<dyn LeaseStore>,
    metrics: Arc<Mutex<prometheus_client::registry::Registry>>,
    health_metrics: egress_health::HealthMetrics,
    reconcile_metrics: ReconcileMetrics,
    pool_metrics: pool::metrics::PoolMetrics,
    /// The default probe target, fetched directly by the leader's health engine.
    probe_target: egress_controller::probe_target::ProbeTarget,
    /// Lease requests this replica's discovery API refused, for the pool autoscaler (`None`
    /// when the API is not served).
    refusals: Option<Arc<egress_discovery::Refusals>>,
    /// What the provider-health monitor found, read by the metrics.
    provider_health: ProviderHealthSnapshot,
    tasks: JoinSet<()>,
    /// The tasks that run until shutdown; one that ends earlier is a failure of the manager.
    essential: HashSet<Id>,
}

/// Step 2: what every replica runs, leader or not.
async fn start_replica(
    options: &Options,
    loaded: &Loaded,
    namespaces: Namespaced,
    shutdown: &CancellationToken,
) -> Result<Replica, Fatal> {
    // Leases live in this process (one replica) or in Redis (shared by every replica); the
    // store and its sweep run on every replica. First, as it contacts nothing: a store that
    // cannot be set up stops the start before anything else is made.
    let prepared = crate::lease_store::prepare(options)?;
    let (client, rest_metrics) = crate::kube_client(&options.kubeconfig)
        .await
        .map_err(|e| Fatal::new("Failed to create the Kubernetes client", e))?;
    let installation = crate::install::installation_id(options, &client, &namespaces.own).await?;
    let crate::lease_store::LeaseStore {
        store,
        follow_tls,
        follow_password,
    } = prepared.open(options, &installation)?;

    let provider_health = ProviderHealthSnapshot::default();
    tracing::info!(namespaces = %namespaces.served, "Serving the Proxies of these namespaces");
    let (cache, keep_cache) =
        egress_controller::proxy_cache::proxy_cache(client.clone(), &namespaces.served, shutdown.clone());
    let (credentials, keep_credentials) =
        proxy::credentials::credential_cache(client.clone(), &namespaces.served, shutdown.clone());
    let directory = crate::servers::live_directory(options, &cache, &credentials);
    let mut tasks = JoinSet::new();
    let cache_task = tasks.spawn(keep_cache).id();
    follow_store_files(follow_tls, follow_password, &mut tasks, shutdown);
    tasks.spawn(keep_credentials);
    let Served {
        registry,
        admission_metrics,
        health_metrics,
        pool_metrics,
        probe_target,
        reconcile_metrics,
    } = served(options, loaded, &rest_metrics, &provider_health, &cache, &store);
    let metrics = Arc::new(Mutex::new(registry));
    let mut essential: HashSet<Id> = [cache_task, tasks.spawn(sweep(store.clone(), shutdown.clone())).id()].into();

    let limits = crate::servers::server_limits(options);
    crate::servers::serve_probes_and_metrics(options, &client, &metrics, limits, shutdown).await?;
    let mut refusals = None;
    if options.discovery_addr != "0" {
        let api = crate::servers::DiscoveryParts {
            directory: &directory,
            store: &store,
            admission_metrics,
            client: &client,
            own_namespace: &namespaces.own,
        };
        let (serving, api_refusals) =
            crate::servers::serve_discovery(options, api, limits, &mut tasks, shutdown).await?;
        essential.insert(serving);
        refusals = api_refusals;
    }
    Ok(Replica {
        client,
        namespaces,
        installation,
        cache,
        credentials,
        directory,
        store,
        metrics,
        health_metrics,
        reconcile_metrics,
        pool_metrics,
        probe_target,
        refusals,
        provider_health,
        tasks,
        essential,
    })
}

/// Whether this replica goes on to lead.
enum Leadership {
    /// It leads; with `--leader-elect`, the receiver turns false when the Lease is lost.
    Leading(Option<watch::Receiver<bool>>),
    /// Shutdown came first.
    Stopping,
}

/// Step 3: with `--leader-elect`, waits until this replica holds the Lease (or shutdown).
async fn lead(options: &Options, replica: &Replica, shutdown: &CancellationToken) -> Result<Leadership, Fatal> {
    if !options.leader_elect {
        return Ok(Leadership::Leading(None));
    }
    let namespace = &replica.namespaces.own;
    let elector = Elector::new(
        kube::Api::namespaced(replica.client.clone(), namespace),
        LEASE_NAME,
        &crate::install::replica_identity(),
        ElectionTimings::default(),
    )
    .map_err(|e| Fatal::new("Failed to set up leader election", e))?;
    tracing::info!(lease = %format!("{namespace}/{LEASE_NAME}"), "Attempting to acquire leader lease");
    let (_task, rx) = elector.run(shutdown.clone());
    egress_controller::runtime_metrics::register_leader(
        &mut replica.metrics.lock().unwrap_or_else(|p| p.into_inner()),
        LEASE_NAME,
        rx.clone(),
    );
    until_led(rx, shutdown).await
}

/// Waits until the campaign behind `leading` wins, or shutdown comes first.
async fn until_led(mut leading: watch::Receiver<bool>, shutdown: &CancellationToken) -> Result<Leadership, Fatal> {
    tokio::select! {
        _ = shutdown.cancelled() => return Ok(Leadership::Stopping),
        // Only whether it was won is kept: the watch's read guard must not live across the
        // other arm's await, or this future could not be sent to another thread.
        won = leading.wait_for(|l| *l).map(|r| r.is_ok()) => if !won {
            // Shutdown ends the campaign too, so this arm may be the one seen: a standby
            // replica told to stop stops cleanly.
            if shutdown.is_cancelled() {
                return Ok(Leadership::Stopping);
            }
            return Err(Fatal::plain("leader election ended before this replica led"));
        },
    }
    Ok(Leadership::Leading(Some(leading)))
}

/// The running tasks, for [`supervise`].
struct Running {
    tasks: JoinSet<()>,
    essential: HashSet<Id>,
}

impl Running {
    /// Spawns a part that runs until shutdown: one that ends before is a failure of the manager.
    fn spawn_essential(&mut self, part: impl std::future::Future<Output = ()> + Send + 'static) {
        let id = self.tasks.spawn(part).id();
        self.essential.insert(id);
    }
}

/// Every family the metrics server serves, and the parts of the manager that feed them.
struct Served {
    registry: prometheus_client::registry::Registry,
    admission_metrics: egress_discovery::AdmissionMetrics,
    health_metrics: egress_health::HealthMetrics,
    pool_metrics: pool::metrics::PoolMetrics,
    probe_target: egress_controller::probe_target::ProbeTarget,
    reconcile_metrics: ReconcileMetrics,
}

/// Registers every family a replica serves (a standby's too, so a scrape finds the same ones).
fn served(
    options: &Options,
    loaded: &Loaded,
    rest_metrics: &crate::rest_metrics::RestClientMetrics,
    provider_health: &ProviderHealthSnapshot,
    cache: &ProxyCache,
    store: &Arc<dyn LeaseStore>,
) -> Served {
    let mut registry = prometheus_client::registry::Registry::default();
    loaded.provider_metrics.register(&mut registry);
    loaded.create_budgets.register(&mut registry);
    let health_metrics = egress_health::HealthMetrics::new();
    health_metrics.register(&mut registry);
    egress_controller::metrics::register(&mut registry, provider_health.clone(), cache.store());
    let pool_metrics = pool::metrics::PoolMetrics::new();
    pool_metrics.register(&mut registry, cache.store());
    let probe_target = egress_controller::probe_target::ProbeTarget::new(options.health_check_url.clone());
    probe_target.register(&mut registry);
    // controller-runtime's families, for dashboards built for the Go operator.
    let reconcile_metrics = ReconcileMetrics::new(ControllerConfig::default().concurrency);
    reconcile_metrics.register(&mut registry);
    rest_metrics.register(&mut registry);
    egress_controller::runtime_metrics::register_process(&mut registry);
    registry.register_collector(Box::new(egress_controller::metrics::LeasesActive(store.clone())));
    registry.register_collector(Box::new(egress_controller::metrics::CooldownsDropped(store.clone())));
    registry.register_collector(Box::new(egress_controller::metrics::LeaseSessions(store.clone())));
    let admission_metrics = egress_discovery::AdmissionMetrics::default();
    admission_metrics.register(&mut registry);
    Served {
        registry,
        admission_metrics,
        health_metrics,
        pool_metrics,
        probe_target,
        reconcile_metrics,
    }
}

/// Step 4: the leader's work.
fn start_leader_tasks(
    options: &Options,
    mut replica: Replica,
    mut loaded: Loaded,
    health: Health,
    shutdown: &CancellationToken,
) -> Result<Running, Fatal> {
    tracing::info!("Starting manager");
    let mut running = Running {
        tasks: std::mem::take(&mut replica.tasks),
        essential: std::mem::take(&mut replica.essential),
    };
    // The leader publishes the proxies it serves to a shared store, so every replica leases
    // with the same capacity, health and latency.
    running.tasks.spawn(egress_discovery::publish_view(
        replica.directory.clone(),
        replica.store.clone(),
        shutdown.clone(),
    ));
    let external = Arc::new(external_rules(options, &replica.namespaces.own)?);
    let work = shutdown.child_token();
    let engine = EngineParts {
        roots: loaded.probe_roots.take(),
        source: proxy::health::CachedProxies {
            cache: replica.cache.clone(),
            default_url: options.health_check_url.clone(),
            credentials: replica.credentials.clone(),
            external: external.clone(),
        },
        metrics: replica.health_metrics.clone(),
        target: replica.probe_target.clone(),
    };
    let verdicts = leader_verdicts(options, health, engine, &mut running, &work)?;
    spawn_controllers(options, replica, loaded, verdicts, external, &mut running, &work);
    Ok(running)
}

/// The leader's controllers on `verdicts`: the Proxy and ProxyPool controllers and the orphan
/// GC, which run until shutdown, and the provider-health monitor (with checks off it only cleans
/// up and ends, so it is not essential).
fn spawn_controllers(
    options: &Options,
    replica: Replica,
    loaded: Loaded,
    verdicts: LeaderVerdicts,
    external: Arc<proxy::destinations::ExternalRules>,
    running: &mut Running,
    work: &CancellationToken,
) {
    let installation = Some(replica.installation);
    let ctx = Arc::new(
        Context::new(
            replica.client.clone(),
            loaded.providers.clone(),
            verdicts.verdicts,
            Timings {
                address_budget: options.provisioning_timeout,
                ..Timings::default()
            },
            installation.clone(),
            work.clone(),
        )
        .with_credentials(replica.credentials)
        .with_external_rules(external)
        .with_metrics(replica.reconcile_metrics)
        .with_create_budgets(loaded.create_budgets)
        .with_exit_findings(verdicts.exits),
    );
    let mut pools = pool::pass::PoolContext::new(
        replica.client.clone(),
        replica.cache.clone(),
        replica.store,
        replica.pool_metrics,
        replica.refusals,
    )
    .with_exit_policy(options.exit_policy);
    if let Some(target) = verdicts.fetched_target {
        pools = pools.with_probe_target(target);
    }
    running.spawn_essential(pool::controller::run(
        Arc::new(pools),
        replica.namespaces.served.clone(),
        work.clone(),
    ));
    let config = ControllerConfig {
        namespaces: replica.namespaces.served,
        ..Default::default()
    };
    running.spawn_essential(proxy::controller::run(
        ctx,
        config,
        replica.cache,
        verdicts.events,
        work.clone(),
    ));
    let gc = OrphanGc {
        client: replica.client.clone(),
        providers: loaded.providers.clone(),
        interval: options.gc_interval,
        min_age: options.gc_min_age,
        installation,
    };
    running.spawn_essential(gc.run(work.clone()));
    let monitor = Monitor {
        client: replica.client,
        providers: loaded.providers,
        schedule: loaded.schedule,
        snapshot: replica.provider_health,
    };
    running.tasks.spawn(monitor.run(work.clone()));
}

/// What the leader's own health engine probes with and counts in.
struct EngineParts {
    roots: Option<crate::probe_tls::ProbeRoots>,
    source: proxy::health::CachedProxies,
    metrics: egress_health::HealthMetrics,
    target: egress_controller::probe_target::ProbeTarget,
}

/// The verdicts and change events the reconciler takes, and the probe target when the engine
/// also fetches it directly (so a pool can tell a dead target from dead members).
struct LeaderVerdicts {
    verdicts: Arc<dyn HealthVerdicts>,
    exits: Arc<dyn proxy::exit_findings::ExitFindings>,
    events: HealthEvents,
    fetched_target: Option<egress_controller::probe_target::ProbeTarget>,
}

/// Verdicts from the caller's script, or from a health engine started here.
fn leader_verdicts(
    options: &Options,
    health: Health,
    engine: EngineParts,
    running: &mut Running,
    work: &CancellationToken,
) -> Result<LeaderVerdicts, Fatal> {
    match health {
        Health::Scripted { verdicts, events } => Ok(LeaderVerdicts {
            verdicts,
            exits: Arc::new(proxy::exit_findings::NoExitChecks),
            events,
            fetched_target: None,
        }),
        Health::Engine => start_health_engine(options, engine, running, work),
    }
}

/// The leader's health engine over `parts.source`, with its CA file followed, its default
/// target also fetched directly and, with an echo URL, exits checked: the verdicts, exit
/// findings and events the reconciler takes. The engine is an essential part.
fn start_health_engine(
    options: &Options,
    parts: EngineParts,
    running: &mut Running,
    work: &CancellationToken,
) -> Result<LeaderVerdicts, Fatal> {
    let fetched_target = Some(parts.target.clone());
    let (prober, follower) = parts
        .roots
        .ok_or_else(|| Fatal::plain("the health engine has no TLS settings (a bug)"))?
        .prober();
    running.tasks.spawn(parts.target.run(prober.clone(), work.clone()));
    if let Some(follower) = follower {
        // This replica may have waited long for the Lease: the file as it is now, before the
        // first probe.
        let mut following = crate::followed::Following::new(follower);
        following.check_now();
        running
            .tasks
            .spawn(following.run(crate::followed::FILE_POLL, work.clone()));
    }
    let snapshot = egress_health::Snapshot::default();
    let (tx, rx) = tokio::sync::mpsc::channel(egress_health::engine::EVENT_CAPACITY);
    let exits = crate::exit_check::start(options, (&snapshot, &prober, &tx), &mut running.tasks, work)?;
    let engine = egress_health::Engine::new(
        Arc::new(parts.source),
        prober,
        egress_health::EngineConfig {
            workers: options.health_workers,
            trace_probes: options.trace_health_probes,
            exit: crate::exit_check::engine_setting(options),
            ..Default::default()
        },
        parts.metrics,
        snapshot.clone(),
        tx,
    );
    running.spawn_essential(engine.run(work.clone()));
    let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(|key| proxy::health::object_ref(&key));
    Ok(LeaderVerdicts {
        verdicts: Arc::new(snapshot),
        exits,
        events: Box::pin(events),
        fetched_target,
    })
}

/// Step 5: runs until shutdown, a lost Lease, or an essential part that ends.
async fn supervise(
    running: Running,
    mut leading: Option<watch::Receiver<bool>>,
    shutdown: CancellationToken,
) -> Result<(), Fatal> {
    let Running { mut tasks, essential } = running;
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
                return Err(Fatal::plain("leader election lost"));
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
                return Err(Fatal::new("Failed to run manager", failure));
            }
        }
    }
}

/// What is internal: the fixed lists, the cluster's ranges (`--cluster-cidrs`), minus
/// `--allowed-internal-destinations`.
fn internal_guard(options: &Options) -> Result<egress_netguard::Guard, Fatal> {
    // Both lists were checked as the flags were read.
    egress_netguard::Guard::new(&options.cluster_cidrs, &options.allowed_internal_destinations)
        .map_err(|e| Fatal::plain(format!("invalid --cluster-cidrs: {e}")))
}

/// Where External Proxies are accepted (by default only in the operator's own namespace) and
/// what they may not point at.
fn external_rules(options: &Options, own_namespace: &str) -> Result<proxy::destinations::ExternalRules, Fatal> {
    use proxy::destinations::ExternalRules;
    Ok(ExternalRules {
        namespaces: crate::install::namespaces(&options.external_proxy_namespaces, own_namespace),
        guard: Arc::new(internal_guard(options)?),
    })
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

/// Spawns the followers of the lease store's files (TLS, password), those there are.
fn follow_store_files(
    tls: Option<crate::lease_store::TlsFollower>,
    password: Option<crate::lease_password::PasswordFollower>,
    tasks: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) {
    if let Some(follower) = tls {
        let following = crate::followed::Following::new(follower);
        tasks.spawn(following.run(crate::followed::FILE_POLL, shutdown.clone()));
    }
    if let Some(follower) = password {
        let following = crate::followed::Following::new(follower);
        tasks.spawn(following.run(crate::followed::FILE_POLL, shutdown.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shutdown ends the campaign as it ends the wait, so both are ready together; whichever
    /// the wait sees, a standby told to stop stops cleanly (tried often: the pick is random).
    #[tokio::test]
    async fn a_standby_told_to_stop_stops_cleanly() {
        for _ in 0..64 {
            let shutdown = CancellationToken::new();
            let (campaign, leading) = watch::channel(false);
            shutdown.cancel();
            drop(campaign);
            let outcome = until_led(leading, &shutdown).await;
            let why = outcome.as_ref().err().map(|f| f.message.clone());
            assert!(matches!(outcome, Ok(Leadership::Stopping)), "{why:?}");
        }
    }

    #[tokio::test]
    async fn a_campaign_that_ends_unwon_without_shutdown_is_fatal() {
        let (campaign, leading) = watch::channel(false);
        drop(campaign);
        assert!(until_led(leading, &CancellationToken::new()).await.is_err());
    }
}
