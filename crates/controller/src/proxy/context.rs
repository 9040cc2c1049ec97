//! What every reconcile of a Proxy shares: the clients and providers it acts with, where it
//! reads verdicts and credentials, its timings and metrics, and what the reconciler remembers
//! between passes (each Proxy's failures in a row, and since when its instance has had no
//! address).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_provider::{InstanceState, Providers};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::create_budget::{CreateBudgets, SystemClock};
use crate::identity::reporting_instance;
use crate::proxy::credentials::CredentialCache;
use crate::proxy::decide::{ProviderFailure, Timings};
use crate::proxy::destinations::ExternalRules;
use crate::proxy::exit_findings::{ExitFindings, NoExitChecks};
use crate::proxy::health::HealthVerdicts;
use crate::runtime_metrics::ReconcileMetrics;

/// Proxies reconciled at once unless the controller is told otherwise: 3, as the Go operator.
pub const DEFAULT_CONCURRENCY: u16 = 3;

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub providers: Arc<Providers>,
    pub health: Arc<dyn HealthVerdicts>,
    /// What the exit checks found ([`crate::proxy::exit_findings`]); off unless given.
    pub exits: Arc<dyn ExitFindings>,
    pub timings: Timings,
    /// The installation the operator runs as, if any: the mark providers write at create, and
    /// the one a pass writes on its Proxy's running instance that carries none.
    pub installation: Option<String>,
    /// Cancelled at shutdown: provider calls in flight return promptly.
    pub shutdown: CancellationToken,
    /// controller-runtime's reconcile families (register them to serve them).
    pub metrics: ReconcileMetrics,
    /// The credential Secrets as watched, when the operator keeps them: a running Generated
    /// instance whose Secret it shows serving it needs no read of the Secret, and an External
    /// Proxy whose Secret does not name it is refused. Its changes enqueue the External Proxies
    /// that name the changed Secret ([`crate::proxy::controller::run`]).
    pub credentials: Option<CredentialCache>,
    /// Each provider entry's create budget, asked before every create.
    pub create_budgets: CreateBudgets,
    /// Where External Proxies are accepted and what they may not point at.
    pub external: Arc<ExternalRules>,
    /// The reporting instance of the Events it publishes on Proxies (events.k8s.io/v1).
    pub(crate) instance: String,
    /// The configured entries' names, in config order.
    pub(crate) provider_names: Vec<String>,
    failures: Mutex<HashMap<(String, String), u32>>,
    /// Per Proxy UID: since when its instance has answered without an address (item 54). An
    /// entry goes when a Get answers anything else, so it holds at most one per Proxy.
    address_missing: Mutex<HashMap<String, Time>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(
        client: Client,
        providers: Arc<Providers>,
        health: Arc<dyn HealthVerdicts>,
        timings: Timings,
        installation: Option<String>,
        shutdown: CancellationToken,
    ) -> Self {
        let instance = reporting_instance();
        let provider_names = providers.entries().iter().map(|e| e.name.clone()).collect();
        let create_budgets = CreateBudgets::for_providers(&providers, Arc::new(SystemClock));
        Self {
            client,
            provider_names,
            providers,
            health,
            exits: Arc::new(NoExitChecks),
            timings,
            installation,
            shutdown,
            credentials: None,
            create_budgets,
            external: Arc::default(),
            metrics: ReconcileMetrics::new(DEFAULT_CONCURRENCY),
            instance,
            failures: Mutex::default(),
            address_missing: Mutex::default(),
        }
    }

    /// Counts reconciles in `metrics` (the ones the operator serves).
    #[must_use]
    pub fn with_metrics(mut self, metrics: ReconcileMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Asks `budgets` before each create: the operator's, whose metrics it serves, or a test's
    /// on a clock it moves. (`new` gives every configured entry its budget, unserved.)
    #[must_use]
    pub fn with_create_budgets(mut self, budgets: CreateBudgets) -> Self {
        self.create_budgets = budgets;
        self
    }

    /// Refuses External Proxies outside `rules` (`new` accepts them in every namespace and
    /// refuses every internal destination, with no allowlist and no cluster ranges).
    #[must_use]
    pub fn with_external_rules(mut self, rules: Arc<ExternalRules>) -> Self {
        self.external = rules;
        self
    }

    /// Judges exits with what `findings` gives (the engine's exit checks).
    #[must_use]
    pub fn with_exit_findings(mut self, findings: Arc<dyn ExitFindings>) -> Self {
        self.exits = findings;
        self
    }

    /// Reads credentials from `cache` where it can, sparing the API server.
    #[must_use]
    pub fn with_credentials(mut self, cache: CredentialCache) -> Self {
        self.credentials = Some(cache);
        self
    }

    /// The workqueue's backoff for a failing Proxy: 5 ms doubling per failure, at most 1000 s
    /// (client-go's default rate limiter).
    pub(crate) fn backoff(&self, key: (String, String)) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        let millis = 5u64.saturating_mul(1u64 << (*n - 1).min(30));
        Duration::from_millis(millis).min(Duration::from_secs(1000))
    }

    pub(crate) fn succeeded(&self, key: &(String, String)) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    /// Since when the Proxy `uid`'s instance has answered without an address, if it has.
    pub(crate) fn address_missing_since(&self, uid: &str) -> Option<Time> {
        self.address_missing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(uid)
            .cloned()
    }

    /// Notes what this pass's Get said about the address of Proxy `uid`'s instance.
    pub(crate) fn saw_instance(
        &self,
        uid: &str,
        get: Option<&Result<egress_provider::Instance, ProviderFailure>>,
        now: &Time,
    ) {
        let Some(answer) = get else { return };
        let mut missing = self.address_missing.lock().unwrap_or_else(|p| p.into_inner());
        match answer {
            Ok(i) if matches!(i.state, InstanceState::Provisioning | InstanceState::Running) && i.ip.is_none() => {
                missing.entry(uid.to_owned()).or_insert_with(|| now.clone());
            }
            _ => {
                missing.remove(uid);
            }
        }
    }
}
