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
//! With an echo URL ([`EngineConfig::exit`]) the engine also checks each proxy's exit: right
//! after its first probe that passes, then once per exit interval, as one more job for the same
//! workers (probes go first, but due exit checks always have [`exit_reserve`] workers). A
//! changed exit tells the reconciler about the proxy, and about the one other proxy it makes
//! shared or leaves alone; a proxy whose exit is shared by more or fewer since it was last told
//! hears at its own next check (O(N) notices for N proxies at one exit). The exit check's parts
//! are in `engine/exits.rs`.
//!
//! A record is keyed by namespace/name and tagged with the Proxy's UID and address: a Proxy
//! recreated under the same name, or moved to another host or port, starts a fresh record, and a
//! result for a record that has since changed is discarded. A record is pruned when its proxy
//! is gone or has no host; pruning removes its verdict and its metric series.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::exit::EchoError;
use crate::metrics::HealthMetrics;
use crate::probe::{ProbeOutcome, ProbeRequest};
use crate::state::{Thresholds, Verdict};

mod exits;
mod prober;
mod snapshot;

pub use exits::{DEFAULT_EXIT_INTERVAL, ExitCheck, exit_reserve};
pub use prober::{ConnectProber, Prober};
pub use snapshot::{ExitSeen, Snapshot};

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
    /// What the proxy demands of its clients (`Proxy-Authorization: Basic`), when anything.
    pub credentials: Option<egress_credentials::Credentials>,
    pub url: String,
    pub expected_status: u16,
    pub interval: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
    /// Internal addresses the proxy's host must not resolve to (External proxies); see
    /// [`ProbeRequest::destinations`](crate::probe::ProbeRequest::destinations).
    pub destinations: Option<std::sync::Arc<egress_netguard::Guard>>,
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
    /// The verdict the Proxy's status already records, if any: a new record starts from it, so
    /// a new leader needs a threshold of results to change it (no flap at each failover).
    pub known: Option<Verdict>,
}

/// Where the engine reads proxies from (the operator's Proxy cache). Leave out proxies that are
/// being deleted.
pub trait ProxySource: Send + Sync + 'static {
    fn proxies(&self) -> Vec<ProxyView>;

    /// A number that changes whenever the proxies may have changed, when the source can tell;
    /// the engine then skips re-reading an unchanged source. `None`: always re-read.
    fn generation(&self) -> Option<u64> {
        None
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
    /// The exit check, when an echo URL is set.
    pub exit: Option<ExitCheck>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            workers: 10,
            refresh: Duration::from_secs(1),
            trace_probes: false,
            exit: None,
        }
    }
}

/// Capacity of the event channel the operator creates for [`Engine::new`] (spec: 1024).
pub const EVENT_CAPACITY: usize = 1024;

struct Record {
    /// Unique per record: a result carries it, so one for a replaced record is recognised.
    id: u64,
    key: Arc<ProxyKey>,
    uid: Arc<str>,
    host: Arc<str>,
    port: u16,
    settings: ProbeSettings,
    /// The probe to run, built once.
    request: Arc<ProbeRequest>,
    series: crate::metrics::ProxySeries,
    next_due: Instant,
    in_flight: bool,
    thresholds: Thresholds,
    /// The exit check to run, built once; `None` when the engine has no echo URL.
    exit_request: Option<Arc<ProbeRequest>>,
    /// When the exit is checked next; `None` until the first probe that passes.
    exit_next: Option<Instant>,
    exit_in_flight: bool,
}

/// The engine's state: one record per proxy (by record id, with an index by proxy), the queue of
/// due probes (earliest first; entries a record no longer matches are skipped when they come up),
/// and events not yet delivered.
#[derive(Default)]
struct Schedule {
    records: HashMap<u64, Record, BuildHasherDefault<IdHasher>>,
    index: HashMap<Arc<ProxyKey>, u64>,
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The queue of due exit checks, kept as `due` is.
    exit_due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Exit checks under way.
    exits_running: usize,
    unsent: HashSet<Arc<ProxyKey>>,
    next_id: u64,
    /// The source's generation at the last refresh.
    seen: Option<u64>,
}

/// Hashes record ids. They are counters the engine makes, never input, so the cost of a
/// flood-resistant hash buys nothing on this path, which runs twice per probe.
#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing spreads sequential ids over the table.
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

struct Done {
    id: u64,
    outcome: Outcome,
}

/// What a job found.
enum Outcome {
    Probe(ProbeOutcome),
    Exit(Result<IpAddr, EchoError>),
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

    /// Runs until `shutdown`. Probes still in flight then finish within their own timeout and
    /// their results are dropped.
    pub async fn run(self, shutdown: CancellationToken) {
        let pool = Arc::new(Pool {
            running: AtomicUsize::new(0),
            workers: self.config.workers.max(1),
            freed: tokio::sync::Notify::new(),
        });
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        let done_tx = Arc::new(done_tx);
        let mut s = Schedule::default();
        let mut next_refresh = Instant::now();
        let started = Instant::now();
        // NB: one timer and one cancellation future for the whole run, re-armed rather than
        // re-created. The loop wakes on a GRAIN grid only, not per result: results wait for the
        // next turn, so ten thousand probes a second cost some fifty turns, not ten thousand.
        let cancelled = shutdown.cancelled();
        tokio::pin!(cancelled);
        let timer = tokio::time::sleep_until(next_refresh);
        tokio::pin!(timer);
        let signals = pool.clone();
        let freed = signals.freed.notified();
        tokio::pin!(freed);
        loop {
            tokio::select! {
                biased;
                _ = &mut cancelled => break,
                _ = &mut timer => {}
                _ = &mut freed => freed.set(signals.freed.notified()),
            }
            let now = Instant::now();
            while let Ok(done) = done_rx.try_recv() {
                self.finish(&mut s, done, now);
            }
            if now >= next_refresh {
                self.refresh(&mut s, now);
                next_refresh = now + self.config.refresh;
            }
            self.dispatch(&mut s, now, &pool, &done_tx);
            self.resend(&mut s.unsent);
            // The next turn: the next due probe or refresh, on the grid; no later than one grain
            // while probes run (their results and freed workers are picked up then).
            let next_due = [s.due.peek(), s.exit_due.peek()]
                .into_iter()
                .flatten()
                .map(|Reverse((due, _))| *due)
                .min();
            let mut wake = next_due.map_or(next_refresh, |due| on_grid(started, due).min(next_refresh));
            if pool.running.load(Ordering::Acquire) > 0 || !done_rx.is_empty() || !s.unsent.is_empty() {
                wake = wake.min(on_grid(started, now + GRAIN));
            }
            // A probe still due here waits for a worker: the freed signal, or a grain from now.
            wake = wake.max(on_grid(started, now + Duration::from_nanos(1)));
            timer.as_mut().reset(wake);
        }
    }

    /// Adds new proxies and prunes gone or changed ones.
    fn refresh(&self, s: &mut Schedule, now: Instant) {
        let generation = self.source.generation();
        if generation.is_some() && generation == s.seen {
            return;
        }
        s.seen = generation;
        let views: HashMap<ProxyKey, ProxyView> = self
            .source
            .proxies()
            .into_iter()
            .filter(|v| !v.host.is_empty())
            .map(|v| (v.key.clone(), v))
            .collect();
        let mut gone = Vec::new();
        let mut s_due_push = Vec::new();
        s.records.retain(|_, record| match views.get(&*record.key) {
            Some(v) if *v.uid == *record.uid && *v.host == *record.host && v.port == record.port => {
                if v.settings != record.settings {
                    // A shorter interval takes effect now, not after the old one has run out.
                    let last_start = record.next_due.checked_sub(record.settings.interval);
                    record.settings = v.settings.clone();
                    record.request = Arc::new(request(&record.host, record.port, &record.settings));
                    record.exit_request = self.exit_request(&record.host, record.port, &record.settings);
                    if let Some(last) = last_start
                        && !record.in_flight
                    {
                        let due = (last + record.settings.interval).max(now);
                        if due < record.next_due {
                            record.next_due = due;
                            s_due_push.push((due, record.id));
                        }
                    }
                }
                true
            }
            _ => {
                gone.push(record.key.clone());
                false
            }
        });
        s.due.extend(s_due_push.into_iter().map(Reverse));
        for key in gone {
            s.index.remove(&key);
            self.metrics.forget(&key.to_string());
            if let Some(sharers) = self.snapshot.remove(&key) {
                // Its verdict is gone: the status should drop it; a proxy it leaves alone at its
                // exit is no longer shared (the others hear the new count at their next check).
                self.notify(&key, &mut s.unsent);
                for other in sharers {
                    self.notify(&other, &mut s.unsent);
                }
            }
        }
        self.add_records(s, views, now);
    }

    /// Starts a record for each of `views` the schedule has none for.
    fn add_records(&self, s: &mut Schedule, views: HashMap<ProxyKey, ProxyView>, now: Instant) {
        for (key, view) in views {
            if s.index.contains_key(&key) {
                continue;
            }
            // Spread first probes over one interval, so a fleet does not fire at once.
            let spread = view.settings.interval.as_millis().max(1) as u64;
            let due = now + Duration::from_millis(rand::random_range(0..spread));
            let key = Arc::new(key);
            s.next_id += 1;
            let id = s.next_id;
            s.due.push(Reverse((due, id)));
            s.index.insert(key.clone(), id);
            s.records.insert(
                id,
                Record {
                    id,
                    series: self.metrics.series(&key.to_string()),
                    request: Arc::new(request(&view.host, view.port, &view.settings)),
                    exit_request: self.exit_request(&view.host, view.port, &view.settings),
                    exit_next: None,
                    exit_in_flight: false,
                    key,
                    next_due: due,
                    uid: view.uid.into(),
                    host: view.host.into(),
                    port: view.port,
                    settings: view.settings,
                    in_flight: false,
                    thresholds: Thresholds::starting_from(view.known),
                },
            );
        }
    }

    /// Starts due jobs there are workers for: exit checks up to their reserve, then probes,
    /// then exit checks again on any worker left. Probes go first, but an engine whose probes
    /// are always overdue still checks exits on its reserve, rather than never.
    fn dispatch(&self, s: &mut Schedule, now: Instant, pool: &Arc<Pool>, done_tx: &Arc<mpsc::UnboundedSender<Done>>) {
        self.dispatch_exits(s, now, pool, done_tx, exit_reserve(pool.workers));
        self.dispatch_probes(s, now, pool, done_tx);
        self.dispatch_exits(s, now, pool, done_tx, pool.workers);
    }

    /// Starts the due probes there are workers for, oldest due first.
    fn dispatch_probes(
        &self,
        s: &mut Schedule,
        now: Instant,
        pool: &Arc<Pool>,
        done_tx: &Arc<mpsc::UnboundedSender<Done>>,
    ) {
        while let Some(Reverse((due, _))) = s.due.peek() {
            if *due > now {
                return;
            }
            if pool.running.load(Ordering::Acquire) >= pool.workers {
                return; // stays due; a finishing probe frees a worker for a later turn
            }
            let Some(Reverse((due, id))) = s.due.pop() else { return };
            let Some(record) = s.records.get_mut(&id) else {
                continue; // pruned
            };
            if record.in_flight || record.next_due != due {
                continue; // an outdated entry; finish() queues the record again
            }
            record.in_flight = true;
            // Never sooner than one interval after this start.
            record.next_due = now + record.settings.interval;
            pool.running.fetch_add(1, Ordering::AcqRel);
            let req = record.request.clone();
            // The key travels only for the span.
            let key = self.config.trace_probes.then(|| record.key.clone());
            let prober = self.prober.clone();
            let tx = done_tx.clone();
            let pool = pool.clone();
            // Bounded by the probe's own timeout, so no cancellation is needed at shutdown.
            tokio::spawn(async move {
                // Reports even if the prober panics, so the worker and the record are freed.
                let panic = Outcome::Probe(ProbeOutcome {
                    result: Err(crate::probe::ProbeError::Io("the probe panicked".into())),
                    latency: Duration::ZERO,
                });
                let mut report = Report::new(pool, tx, id, panic);
                report.outcome = Some(Outcome::Probe(match key {
                    Some(key) => traced_probe(&*prober, req, &key).await,
                    None => prober.probe(req).await,
                }));
            });
        }
    }

    /// Folds one result into its record, and queues the record's next job.
    fn finish(&self, s: &mut Schedule, done: Done, now: Instant) {
        match done.outcome {
            Outcome::Probe(outcome) => self.finish_probe(s, done.id, &outcome, now),
            Outcome::Exit(found) => {
                s.exits_running = s.exits_running.saturating_sub(1);
                self.finish_exit(s, done.id, found, now);
            }
        }
    }

    /// Folds a probe's result into its record, and queues its next probe; after the first probe
    /// that passes, its first exit check.
    fn finish_probe(&self, s: &mut Schedule, id: u64, outcome: &ProbeOutcome, now: Instant) {
        // Ids are never reused: a result for a pruned or replaced record (a Proxy recreated under
        // the same name, or moved) finds nothing and is dropped.
        let Some(record) = s.records.get_mut(&id) else {
            return;
        };
        record.in_flight = false;
        s.due.push(Reverse((record.next_due, record.id)));
        let ok = outcome.ok();
        let auth_refused = matches!(outcome.result, Err(crate::probe::ProbeError::ProxyAuthRequired));
        record.series.observe(outcome.latency, ok);
        if ok && record.exit_request.is_some() && record.exit_next.is_none() {
            record.exit_next = Some(now);
            s.exit_due.push(Reverse((now, id)));
        }
        if let Err(e) = &outcome.result {
            tracing::debug!(proxy = %record.key, reason = %e, "health probe failed");
        }
        let settings = &record.settings;
        if let Some(verdict) = record.thresholds.fold(
            ok,
            auth_refused,
            outcome.latency,
            settings.success_threshold,
            settings.failure_threshold,
        ) {
            self.snapshot.set(record, verdict);
            let key = record.key.clone();
            self.notify(&key, &mut s.unsent);
        }
    }

    /// Tells the reconciler; never waits. A full channel keeps the key for a later turn.
    fn notify(&self, key: &Arc<ProxyKey>, unsent: &mut HashSet<Arc<ProxyKey>>) {
        match self.events.try_send(ProxyKey::clone(key)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                unsent.insert(key.clone());
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn resend(&self, unsent: &mut HashSet<Arc<ProxyKey>>) {
        if unsent.is_empty() {
            return;
        }
        let keys: Vec<Arc<ProxyKey>> = unsent.drain().collect();
        for key in keys {
            self.notify(&key, unsent);
        }
    }
}

/// Frees a worker and sends a probe's result when dropped: after the probe, or when a panicking
/// prober unwinds (reported as a failed probe).
/// The probes in flight: a counter, not a semaphore (whose release takes a lock). Only the
/// engine's loop starts probes, so its check-then-increment cannot overshoot.
struct Pool {
    running: AtomicUsize,
    workers: usize,
    /// Signalled when a full pool frees a worker, so due probes start without waiting for a turn.
    freed: tokio::sync::Notify,
}

struct Report {
    pool: Arc<Pool>,
    tx: Arc<mpsc::UnboundedSender<Done>>,
    id: u64,
    outcome: Option<Outcome>,
    /// What is reported when the job unwinds before it set `outcome`.
    if_panicked: Option<Outcome>,
}

impl Report {
    fn new(pool: Arc<Pool>, tx: Arc<mpsc::UnboundedSender<Done>>, id: u64, if_panicked: Outcome) -> Self {
        Self {
            pool,
            tx,
            id,
            outcome: None,
            if_panicked: Some(if_panicked),
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if self.pool.running.fetch_sub(1, Ordering::AcqRel) == self.pool.workers {
            self.pool.freed.notify_one();
        }
        if let Some(outcome) = self.outcome.take().or_else(|| self.if_panicked.take()) {
            let _ = self.tx.send(Done { id: self.id, outcome });
        }
    }
}

/// How late a due probe may start, so starts can be batched.
const GRAIN: Duration = Duration::from_millis(20);

/// The first point of the GRAIN grid (counted from `origin`) at or after `t`.
fn on_grid(origin: Instant, t: Instant) -> Instant {
    let since = t.saturating_duration_since(origin).as_nanos();
    let grain = GRAIN.as_nanos();
    let steps = since.div_ceil(grain);
    origin + Duration::from_nanos(u64::try_from(steps * grain).unwrap_or(u64::MAX))
}

fn request(host: &str, port: u16, settings: &ProbeSettings) -> ProbeRequest {
    ProbeRequest {
        proxy: if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        },
        url: settings.url.clone(),
        expected_status: settings.expected_status,
        timeout: settings.timeout,
        credentials: settings.credentials.clone(),
        destinations: settings.destinations.clone(),
    }
}

/// A probe in its own root `health.probe` span. The span ends before the result is folded.
async fn traced_probe<P: Prober>(prober: &P, req: Arc<ProbeRequest>, key: &ProxyKey) -> ProbeOutcome {
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
