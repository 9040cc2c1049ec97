//! The engine: probes every proxy about once per interval through a bounded pool, folds results
//! into per-proxy thresholds, keeps the verdict snapshot the reconciler reads, and tells the
//! reconciler which proxy to look at when a result changes what its status should say.
//!
//! ```text
//!            every refresh          earliest due first
//! ProxySource ──────────► records ◄──── due? permit? ──► probe task ──► results ──► fold
//!                 (add, prune: forget series)                                       │
//!                                         snapshot ◄──── status-affecting ◄─────────┘
//!                                         events (try_send; retried when full)
//! ```
//!
//! A record is keyed by namespace/name and tagged with the Proxy's UID and address: a Proxy
//! recreated under the same name, or moved to another host or port, starts a fresh record, and a
//! result for a record that has since changed is discarded. A record is pruned when its proxy
//! is gone or has no host; pruning removes its verdict and its metric series.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::metrics::HealthMetrics;
use crate::probe::{ProbeOutcome, ProbeRequest, ProbeTls};
use crate::state::{Thresholds, Verdict};

/// A proxy's identity: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProxyKey {
    pub namespace: String,
    pub name: String,
}

impl ProxyKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ProxyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How one proxy is probed (a Proxy's `spec.healthCheck` with defaults applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSettings {
    pub url: String,
    pub expected_status: u16,
    pub interval: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// A proxy as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyView {
    pub key: ProxyKey,
    pub uid: String,
    /// Where the proxy listens; empty when it has no address (yet).
    pub host: String,
    pub port: u16,
    pub settings: ProbeSettings,
}

/// Where the engine reads proxies from (the operator's Proxy cache). Leave out proxies that are
/// being deleted.
pub trait ProxySource: Send + Sync + 'static {
    fn proxies(&self) -> Vec<ProxyView>;
}

/// Probes one proxy. The engine's only I/O; tests replace it.
pub trait Prober: Send + Sync + 'static {
    fn probe(&self, req: ProbeRequest) -> impl Future<Output = ProbeOutcome> + Send;
}

/// The real probe ([`crate::probe::probe`]).
#[derive(Debug, Clone)]
pub struct ConnectProber {
    pub tls: ProbeTls,
}

impl Prober for ConnectProber {
    fn probe(&self, req: ProbeRequest) -> impl Future<Output = ProbeOutcome> + Send {
        let tls = self.tls.clone();
        async move { crate::probe::probe(&req, &tls).await }
    }
}

/// The current verdicts, by proxy. Clones share them.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(Arc<RwLock<HashMap<ProxyKey, Verdict>>>);

impl Snapshot {
    /// The verdict for a proxy, if it has one.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Verdict> {
        // NB: the key is built for the lookup; verdicts are read once per reconcile, not per probe.
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ProxyKey::new(namespace, name))
            .copied()
    }

    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set(&self, key: &ProxyKey, verdict: Verdict) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), verdict);
    }

    fn remove(&self, key: &ProxyKey) -> bool {
        self.0.write().unwrap_or_else(|p| p.into_inner()).remove(key).is_some()
    }
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Probes in flight at most (`--health-workers`).
    pub workers: usize,
    /// How often the proxy list is read again.
    pub refresh: Duration,
    /// One `health.probe` root span per probe (`--trace-health-probes`).
    pub trace_probes: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            workers: 10,
            refresh: Duration::from_secs(1),
            trace_probes: false,
        }
    }
}

/// Capacity of the event channel the operator creates for [`Engine::new`] (spec: 1024).
pub const EVENT_CAPACITY: usize = 1024;

struct Record {
    uid: String,
    host: String,
    port: u16,
    settings: ProbeSettings,
    next_due: Instant,
    in_flight: bool,
    thresholds: Thresholds,
}

/// The engine's state: one record per proxy, the queue of due probes (earliest first; entries
/// a record no longer matches are skipped when they come up), and events not yet delivered.
#[derive(Default)]
struct Schedule {
    records: HashMap<ProxyKey, Record>,
    due: BinaryHeap<Reverse<(Instant, ProxyKey)>>,
    unsent: HashSet<ProxyKey>,
}

struct Done {
    key: ProxyKey,
    uid: String,
    host: String,
    port: u16,
    outcome: ProbeOutcome,
}

/// The health engine.
pub struct Engine<P: Prober> {
    source: Arc<dyn ProxySource>,
    prober: Arc<P>,
    config: EngineConfig,
    metrics: HealthMetrics,
    snapshot: Snapshot,
    events: mpsc::Sender<ProxyKey>,
}

impl<P: Prober> fmt::Debug for Engine<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<P: Prober> Engine<P> {
    /// An engine reading `source`, probing with `prober`, keeping `snapshot` and sending the keys
    /// of proxies whose status should change on `events`.
    pub fn new(
        source: Arc<dyn ProxySource>,
        prober: P,
        config: EngineConfig,
        metrics: HealthMetrics,
        snapshot: Snapshot,
        events: mpsc::Sender<ProxyKey>,
    ) -> Self {
        Self {
            source,
            prober: Arc::new(prober),
            config,
            metrics,
            snapshot,
            events,
        }
    }

    /// Runs until `shutdown`; probes in flight are abandoned then.
    pub async fn run(self, shutdown: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.config.workers.max(1)));
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        let mut s = Schedule::default();
        let mut next_refresh = Instant::now();
        let probes = tokio_util::task::TaskTracker::new();
        loop {
            // Wake for the next due probe or the next refresh, whichever is first.
            let wake = s
                .due
                .peek()
                .map_or(next_refresh, |Reverse((due, _))| (*due).min(next_refresh));
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(done) = done_rx.recv() => self.finish(&mut s, done),
                _ = tokio::time::sleep_until(wake) => {}
            }
            let now = Instant::now();
            if now >= next_refresh {
                self.refresh(&mut s, now);
                next_refresh = now + self.config.refresh;
            }
            self.dispatch(&mut s, now, &permits, &done_tx, &probes, &shutdown);
            self.resend(&mut s.unsent);
        }
        probes.close();
    }

    /// Adds new proxies and prunes gone or changed ones.
    fn refresh(&self, s: &mut Schedule, now: Instant) {
        let mut views: HashMap<ProxyKey, ProxyView> = self
            .source
            .proxies()
            .into_iter()
            .filter(|v| !v.host.is_empty())
            .map(|v| (v.key.clone(), v))
            .collect();
        let mut gone = Vec::new();
        s.records.retain(|key, record| match views.get(key) {
            Some(v) if v.uid == record.uid && v.host == record.host && v.port == record.port => {
                record.settings = v.settings.clone();
                true
            }
            _ => {
                gone.push(key.clone());
                false
            }
        });
        for key in gone {
            self.metrics.forget(&key.to_string());
            if self.snapshot.remove(&key) {
                // Its verdict is gone: the status should drop it.
                self.notify(&key, &mut s.unsent);
            }
        }
        for (key, view) in views.drain() {
            if s.records.contains_key(&key) {
                continue;
            }
            // Spread first probes over one interval, so a fleet does not fire at once.
            let spread = view.settings.interval.as_millis().max(1) as u64;
            let due = now + Duration::from_millis(rand::random_range(0..spread));
            s.due.push(Reverse((due, key.clone())));
            s.records.insert(
                key,
                Record {
                    next_due: due,
                    uid: view.uid,
                    host: view.host,
                    port: view.port,
                    settings: view.settings,
                    in_flight: false,
                    thresholds: Thresholds::default(),
                },
            );
        }
    }

    /// Starts the due probes there are workers for, oldest due first.
    fn dispatch(
        &self,
        s: &mut Schedule,
        now: Instant,
        permits: &Arc<Semaphore>,
        done_tx: &mpsc::UnboundedSender<Done>,
        probes: &tokio_util::task::TaskTracker,
        shutdown: &CancellationToken,
    ) {
        while let Some(Reverse((due, _))) = s.due.peek() {
            if *due > now {
                return;
            }
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                return; // stays due; a finishing probe frees a worker and wakes the loop
            };
            let Some(Reverse((due, key))) = s.due.pop() else { return };
            let Some(record) = s.records.get_mut(&key) else {
                continue; // pruned
            };
            if record.in_flight || record.next_due != due {
                continue; // an outdated entry; finish() queues the record again
            }
            record.in_flight = true;
            // Never sooner than one interval after this start.
            record.next_due = now + record.settings.interval;
            let req = ProbeRequest {
                proxy: if record.host.contains(':') {
                    format!("[{}]:{}", record.host, record.port)
                } else {
                    format!("{}:{}", record.host, record.port)
                },
                url: record.settings.url.clone(),
                expected_status: record.settings.expected_status,
                timeout: record.settings.timeout,
            };
            let (uid, host, port) = (record.uid.clone(), record.host.clone(), record.port);
            let prober = self.prober.clone();
            let tx = done_tx.clone();
            let trace = self.config.trace_probes;
            let shutdown = shutdown.clone();
            probes.spawn(async move {
                let _permit = permit;
                let outcome = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    o = traced_probe(&*prober, req, &key, trace) => o,
                };
                let _ = tx.send(Done {
                    key,
                    uid,
                    host,
                    port,
                    outcome,
                });
            });
        }
    }

    /// Folds one result into its record, and queues the record's next probe.
    fn finish(&self, s: &mut Schedule, done: Done) {
        let Some(record) = s.records.get_mut(&done.key) else {
            return; // pruned while the probe ran
        };
        if record.uid != done.uid || record.host != done.host || record.port != done.port {
            return; // a result for an earlier Proxy of that name, or an earlier address
        }
        record.in_flight = false;
        s.due.push(Reverse((record.next_due, done.key.clone())));
        let proxy = done.key.to_string();
        let ok = done.outcome.ok();
        self.metrics.observe(&proxy, done.outcome.latency, ok);
        if let Err(e) = &done.outcome.result {
            tracing::debug!(proxy = %proxy, reason = %e, "health probe failed");
        }
        let settings = &record.settings;
        if let Some(verdict) = record.thresholds.fold(
            ok,
            done.outcome.latency,
            settings.success_threshold,
            settings.failure_threshold,
        ) {
            self.snapshot.set(&done.key, verdict);
            self.notify(&done.key, &mut s.unsent);
        }
    }

    /// Tells the reconciler; never waits. A full channel keeps the key for the next tick.
    fn notify(&self, key: &ProxyKey, unsent: &mut HashSet<ProxyKey>) {
        match self.events.try_send(key.clone()) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                unsent.insert(key.clone());
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn resend(&self, unsent: &mut HashSet<ProxyKey>) {
        if unsent.is_empty() {
            return;
        }
        let keys: Vec<ProxyKey> = unsent.drain().collect();
        for key in keys {
            self.notify(&key, unsent);
        }
    }
}

/// A probe, in its own root `health.probe` span when asked. The span ends before the result is
/// folded.
async fn traced_probe<P: Prober>(prober: &P, req: ProbeRequest, key: &ProxyKey, trace: bool) -> ProbeOutcome {
    if !trace {
        return prober.probe(req).await;
    }
    let span = tracing::info_span!(
        parent: None,
        "health.probe",
        otel.kind = "client",
        proxy = %key,
        probe.ok = tracing::field::Empty,
        probe.latency_ms = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    );
    let outcome = prober.probe(req).instrument(span.clone()).await;
    span.record("probe.ok", outcome.ok());
    span.record("probe.latency_ms", outcome.latency.as_millis() as i64);
    match &outcome.result {
        Ok(()) => span.record("otel.status_code", "ok"),
        Err(e) => {
            span.record("otel.status_code", "error");
            span.record("otel.status_description", e.to_string())
        }
    };
    outcome
}
