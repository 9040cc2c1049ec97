//! controller-runtime's metric families, served beside the operator's own so dashboards and
//! alerts built for the Go operator (controller-runtime v0.24) keep their series: the same names,
//! labels and buckets (the HELP texts are this operator's own words).
//!
//! - `controller_runtime_reconcile_total{controller, result}`: `result` is `success` (the
//!   reconcile waits for the next change), `requeue_after` (it asked to run again after a
//!   while), `requeue` (never produced: this reconciler always names the delay) or `error`.
//! - `controller_runtime_reconcile_errors_total{controller}`: reconciles that failed (retried
//!   with backoff), panics included.
//! - `controller_runtime_reconcile_panics_total{controller}`: reconciles that panicked; the
//!   panic is caught, logged as a failed reconcile and retried, as controller-runtime does.
//! - `controller_runtime_reconcile_timeouts_total{controller}`: passes that outlived their
//!   deadline (`Timings::pass_deadline`, 25 minutes for all of a pass's provider calls): a call
//!   in flight then was cut short, and the Proxy is retried with backoff.
//!
//! controller-runtime's `controller_runtime_terminal_reconcile_errors_total` is not served. It
//! counts errors a controller will not retry, and this one has none: every failed reconcile is
//! retried with backoff ([`crate::proxy::reconciler::error_policy`]), and what waits for a change
//! instead (a latched `PermanentError`, a refused External Proxy) is a status, not an error
//! (docs/migrating-from-go.md).
//! - `controller_runtime_reconcile_time_seconds{controller}`: how long each reconcile took.
//! - `controller_runtime_max_concurrent_reconciles{controller}`: the worker count (3).
//! - `controller_runtime_active_workers{controller}`: reconciles running now.
//! - `workqueue_adds_total`, `workqueue_retries_total`, `workqueue_depth`,
//!   `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`,
//!   `workqueue_unfinished_work_seconds`, `workqueue_longest_running_processor_seconds`
//!   (`name` and `controller` both `proxy`): the reconcile queue as [`QueueMetrics`] observes it.
//! - `leader_election_master_status{name}`: 1 while this replica holds the leader Lease, 0
//!   while it does not; present only with `--leader-elect`.
//! - `process_*`: the process collector's families, read from `/proc/self` at each scrape.
//!
//! `controller` is `proxy`, the name controller-runtime gives a controller built for the
//! `Proxy` kind.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `controller` label of every family: controller-runtime names a controller after the
/// lower-cased kind it reconciles.
pub const CONTROLLER: &str = "proxy";

/// controller-runtime's buckets for `controller_runtime_reconcile_time_seconds`.
pub const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5,
    1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
];

/// How a reconcile ended, as `controller_runtime_reconcile_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileResult {
    Success,
    RequeueAfter,
    Error,
}

impl ReconcileResult {
    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::RequeueAfter => "requeue_after",
            Self::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: String,
}

fn controller() -> ControllerLabel {
    ControllerLabel {
        controller: CONTROLLER.to_owned(),
    }
}

fn reconcile_time_histogram() -> Histogram {
    Histogram::new(RECONCILE_TIME_BUCKETS)
}

/// The reconcile families, shared by every reconcile (cheap to clone).
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    total: Family<ResultLabels, Counter>,
    errors: Family<ControllerLabel, Counter>,
    panics: Family<ControllerLabel, Counter>,
    timeouts: Family<ControllerLabel, Counter>,
    time: Family<ControllerLabel, Histogram, fn() -> Histogram>,
    max_concurrent: Family<ControllerLabel, Gauge>,
    active: Family<ControllerLabel, Gauge>,
    queue: QueueMetrics,
}

impl ReconcileMetrics {
    /// The families for a controller running `workers` reconciles at most, every series at
    /// zero (as controller-runtime starts them, so a rate over a quiet controller is 0, not
    /// absent).
    pub fn new(workers: u16) -> Self {
        let metrics = Self {
            total: Family::default(),
            errors: Family::default(),
            panics: Family::default(),
            timeouts: Family::default(),
            time: Family::new_with_constructor(reconcile_time_histogram),
            max_concurrent: Family::default(),
            active: Family::default(),
            queue: QueueMetrics::default(),
        };
        // `get_or_create` makes the series; the guard it returns is let go at once.
        for result in ["success", "requeue", "requeue_after", "error"] {
            let _ = metrics.total.get_or_create(&ResultLabels {
                controller: CONTROLLER.to_owned(),
                result: result.to_owned(),
            });
        }
        for family in [&metrics.errors, &metrics.panics, &metrics.timeouts] {
            let _ = family.get_or_create(&controller());
        }
        metrics
            .max_concurrent
            .get_or_create(&controller())
            .set(i64::from(workers));
        let _ = metrics.active.get_or_create(&controller());
        metrics
    }

    /// Registers every family under controller-runtime's names.
    pub fn register(&self, registry: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles finished, by controller and how they ended",
            self.total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that failed (retried with backoff), by controller",
            self.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Reconciles that panicked (caught and retried), by controller",
            self.panics.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_timeouts",
            "Reconciles whose pass outlived its deadline, by controller",
            self.timeouts.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Seconds each reconcile took, by controller",
            self.time.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Reconciles a controller runs at once at most",
            self.max_concurrent.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Reconciles running now, by controller",
            self.active.clone(),
        );
        self.queue.register(registry);
    }

    /// The reconcile queue's families.
    pub fn queue(&self) -> &QueueMetrics {
        &self.queue
    }

    /// Marks a reconcile as running until the guard is dropped.
    pub fn start(&self) -> ActiveWorker {
        let gauge = self.active.get_or_create(&controller()).clone();
        gauge.inc();
        ActiveWorker(gauge)
    }

    /// Records one finished reconcile.
    pub fn finished(&self, took: Duration, result: ReconcileResult, panicked: bool) {
        self.time.get_or_create(&controller()).observe(took.as_secs_f64());
        self.total
            .get_or_create(&ResultLabels {
                controller: CONTROLLER.to_owned(),
                result: result.label().to_owned(),
            })
            .inc();
        if result == ReconcileResult::Error {
            self.errors.get_or_create(&controller()).inc();
        }
        if panicked {
            self.panics.get_or_create(&controller()).inc();
        }
    }

    /// Records a pass that outlived its deadline (it also ends as the reconcile it belongs to).
    pub fn timed_out(&self) {
        self.timeouts.get_or_create(&controller()).inc();
    }
}

/// A running reconcile, counted in `controller_runtime_active_workers` while it lives.
#[derive(Debug)]
pub struct ActiveWorker(Gauge);

impl Drop for ActiveWorker {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// controller-runtime's buckets for `workqueue_queue_duration_seconds` and
/// `workqueue_work_duration_seconds`: 10 ns to 1000 s, ten times apart.
pub const WORKQUEUE_BUCKETS: [f64; 12] = [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0];

/// The most Proxies the queue metrics track at once; beyond it, new ones are counted but not
/// timed (the cluster's Proxies bound the map long before this).
const MAX_TRACKED: usize = 65_536;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
    controller: String,
}

fn queue() -> QueueLabels {
    QueueLabels {
        name: CONTROLLER.to_owned(),
        controller: CONTROLLER.to_owned(),
    }
}

fn workqueue_histogram() -> Histogram {
    Histogram::new(WORKQUEUE_BUCKETS)
}

#[derive(Debug, Default)]
struct QueueState {
    /// Proxies waiting for a reconcile, by when they became due (a delayed requeue is due
    /// later), keyed `namespace/name`.
    waiting: std::collections::HashMap<String, std::time::Instant>,
    /// Reconciles running, by when they started.
    running: std::collections::HashMap<u64, std::time::Instant>,
    next_run: u64,
}

/// controller-runtime's `workqueue_*` families for the reconcile queue. kube-rs has no
/// workqueue of its own to read, so the queue is observed from the outside (docs/operations.md):
/// a Proxy is added when a trigger names it (a watch event, a cloud-init Secret it uses, a
/// health event) or a reconcile asks to run it again; it waits until its reconcile starts.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    adds: Family<QueueLabels, Counter>,
    retries: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    work_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    state: std::sync::Arc<std::sync::Mutex<QueueState>>,
}

impl Default for QueueMetrics {
    fn default() -> Self {
        let metrics = Self {
            adds: Family::default(),
            retries: Family::default(),
            queue_duration: Family::new_with_constructor(workqueue_histogram),
            work_duration: Family::new_with_constructor(workqueue_histogram),
            state: std::sync::Arc::default(),
        };
        let _ = metrics.adds.get_or_create(&queue());
        let _ = metrics.retries.get_or_create(&queue());
        metrics
    }
}

impl QueueMetrics {
    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A trigger named `key` (`namespace/name`): due now.
    pub fn added(&self, key: &str) {
        self.adds.get_or_create(&queue()).inc();
        self.wait(key, std::time::Instant::now());
    }

    /// A reconcile of `key` asked to run again after `delay` (a requeue or a backoff).
    pub fn retried(&self, key: &str, delay: Duration) {
        self.adds.get_or_create(&queue()).inc();
        self.retries.get_or_create(&queue()).inc();
        self.wait(key, std::time::Instant::now() + delay);
    }

    fn wait(&self, key: &str, due: std::time::Instant) {
        let mut state = self.state();
        if let Some(at) = state.waiting.get_mut(key) {
            // Already waiting: the queue holds it once, due at the earlier time.
            *at = (*at).min(due);
        } else if state.waiting.len() < MAX_TRACKED {
            state.waiting.insert(key.to_owned(), due);
        }
    }

    /// A reconcile of `key` starts; the guard records its work time when dropped.
    pub fn started(&self, key: &str) -> Working {
        let now = std::time::Instant::now();
        let mut state = self.state();
        if let Some(due) = state.waiting.remove(key) {
            let waited = now.saturating_duration_since(due);
            self.queue_duration
                .get_or_create(&queue())
                .observe(waited.as_secs_f64());
        }
        let run = state.next_run;
        state.next_run = state.next_run.wrapping_add(1);
        state.running.insert(run, now);
        Working {
            metrics: self.clone(),
            run,
        }
    }

    /// `key` left the queue without a reconcile (the Proxy was gone when its turn came).
    pub fn forget(&self, key: &str) {
        self.state().waiting.remove(key);
    }

    /// Registers the families under controller-runtime's names.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "workqueue_adds",
            "Proxies put on the reconcile queue, by queue and controller",
            self.adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Proxies put back on the reconcile queue with a delay, by queue and controller",
            self.retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "Seconds a due Proxy waited on the queue before its reconcile started",
            self.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "Seconds a reconcile taken from the queue took",
            self.work_duration.clone(),
        );
        registry.register_collector(Box::new(QueueGauges(self.clone())));
    }
}

/// A running reconcile; its work time is recorded when it is dropped.
#[derive(Debug)]
pub struct Working {
    metrics: QueueMetrics,
    run: u64,
}

impl Drop for Working {
    fn drop(&mut self) {
        let started = self.metrics.state().running.remove(&self.run);
        if let Some(started) = started {
            let took = started.elapsed().as_secs_f64();
            self.metrics.work_duration.get_or_create(&queue()).observe(took);
        }
    }
}

/// The gauges read at scrape time: depth, unfinished work, longest running processor.
#[derive(Debug)]
struct QueueGauges(QueueMetrics);

impl Collector for QueueGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let now = std::time::Instant::now();
        let (depth, unfinished, longest) = {
            let state = self.0.state();
            let depth = state.waiting.values().filter(|due| **due <= now).count();
            let running: Vec<f64> = state
                .running
                .values()
                .map(|s| now.saturating_duration_since(*s).as_secs_f64())
                .collect();
            (
                depth,
                // A fold from 0.0: an empty f64 `sum` is -0.0, which would be written as such.
                running.iter().fold(0.0, |total, s| total + s),
                running.iter().copied().fold(0.0, f64::max),
            )
        };
        let depth_labels = [("name", CONTROLLER), ("controller", CONTROLLER), ("priority", "")];
        let labels = [("name", CONTROLLER), ("controller", CONTROLLER)];
        let mut family = encoder.encode_descriptor(
            "workqueue_depth",
            "Proxies due for a reconcile that has not started, by queue and controller",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(depth as i64).encode(family.encode_family(&depth_labels)?)?;
        let mut family = encoder.encode_descriptor(
            "workqueue_unfinished_work_seconds",
            "Seconds of work done by reconciles still running, summed",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(unfinished).encode(family.encode_family(&labels)?)?;
        let mut family = encoder.encode_descriptor(
            "workqueue_longest_running_processor_seconds",
            "Seconds the longest-running reconcile has been running",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(longest).encode(family.encode_family(&labels)?)
    }
}

/// `leader_election_master_status{name}` from the elector's channel.
#[derive(Debug)]
pub struct LeaderStatus {
    pub lease: String,
    pub leading: tokio::sync::watch::Receiver<bool>,
}

impl Collector for LeaderStatus {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "leader_election_master_status",
            "1 while this replica holds the leader Lease named by name, 0 while another does",
            None,
            MetricType::Gauge,
        )?;
        let labels = [("name", self.lease.as_str())];
        ConstGauge::new(i64::from(*self.leading.borrow())).encode(family.encode_family(&labels)?)
    }
}

/// The process collector's families, read from `/proc/self` at each scrape (Linux; elsewhere,
/// none are written).
#[derive(Debug, Default)]
pub struct ProcessMetrics;

/// One reading of `/proc/self`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessReading {
    pub cpu_seconds: f64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
    pub virtual_memory_bytes: u64,
    pub virtual_memory_max_bytes: Option<u64>,
    pub resident_memory_bytes: u64,
    pub start_time_seconds: f64,
}

/// Parses `/proc/self/stat`, `/proc/self/limits` and `/proc/stat`'s `btime` (pure, for tests).
/// `ticks` is the clock's ticks per second, `page` the page size in bytes.
pub fn parse_process(
    stat: &str,
    limits: &str,
    proc_stat: &str,
    open_fds: u64,
    ticks: u64,
    page: u64,
) -> Option<ProcessReading> {
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name, field 3 (state) is index 0: utime 14, stime 15, starttime 22, vsize 23,
    // rss 24 are indexes 11, 12, 19, 20, 21.
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let ticks = ticks.max(1) as f64;
    let boot: u64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())?;
    let limit = |name: &str| {
        let line = limits.lines().find(|l| l.starts_with(name))?;
        // "Max open files            1024                 1048576              files"
        line[name.len()..]
            .split_whitespace()
            .next()
            .and_then(|soft| soft.parse().ok())
    };
    Some(ProcessReading {
        cpu_seconds: (number(11)? + number(12)?) as f64 / ticks,
        open_fds,
        max_fds: limit("Max open files"),
        virtual_memory_bytes: number(20)?,
        virtual_memory_max_bytes: limit("Max address space"),
        resident_memory_bytes: number(21)?.saturating_mul(page),
        start_time_seconds: boot as f64 + number(19)? as f64 / ticks,
    })
}

fn read_process() -> Option<ProcessReading> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let proc_stat = std::fs::read_to_string("/proc/stat").ok()?;
    // Bounded by the process's own descriptor limit.
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let ticks = rustix::param::clock_ticks_per_second();
    let page = rustix::param::page_size() as u64;
    parse_process(&stat, &limits, &proc_stat, open_fds, ticks, page)
}

impl Collector for ProcessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(p) = read_process() else {
            return Ok(());
        };
        let mut gauge = |name: &str, help: &str, value: f64| -> Result<(), std::fmt::Error> {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(metric)
        };
        gauge(
            "process_open_fds",
            "File descriptors this process has open",
            p.open_fds as f64,
        )?;
        if let Some(max) = p.max_fds {
            gauge(
                "process_max_fds",
                "File descriptors this process may open (soft limit)",
                max as f64,
            )?;
        }
        gauge(
            "process_virtual_memory_bytes",
            "Virtual memory of this process, in bytes",
            p.virtual_memory_bytes as f64,
        )?;
        // An unlimited address space is written as -1, as the Go collector writes it.
        gauge(
            "process_virtual_memory_max_bytes",
            "Address space this process may use, in bytes (-1: unlimited)",
            p.virtual_memory_max_bytes.map_or(-1.0, |m| m as f64),
        )?;
        gauge(
            "process_resident_memory_bytes",
            "Resident memory of this process, in bytes",
            p.resident_memory_bytes as f64,
        )?;
        gauge(
            "process_start_time_seconds",
            "When this process started, in seconds since the Unix epoch",
            p.start_time_seconds,
        )?;
        let counter = encoder.encode_descriptor(
            "process_cpu_seconds",
            "CPU seconds this process spent, user and system",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(p.cpu_seconds).encode(counter)
    }
}

/// Registers the families that do not depend on the reconciler (the process collector).
pub fn register_process(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessMetrics));
}

/// Registers `leader_election_master_status` for `lease`.
pub fn register_leader(registry: &mut Registry, lease: &str, leading: tokio::sync::watch::Receiver<bool>) {
    registry.register_collector(Box::new(LeaderStatus {
        lease: lease.to_owned(),
        leading,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn the_reconcile_families_start_at_zero_and_count_each_end() {
        let metrics = ReconcileMetrics::new(3);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let text = scrape(&registry);
        for line in [
            r#"controller_runtime_reconcile_total{controller="proxy",result="success"} 0"#,
            r#"controller_runtime_reconcile_total{controller="proxy",result="requeue"} 0"#,
            r#"controller_runtime_reconcile_errors_total{controller="proxy"} 0"#,
            r#"controller_runtime_reconcile_panics_total{controller="proxy"} 0"#,
            r#"controller_runtime_reconcile_timeouts_total{controller="proxy"} 0"#,
            r#"controller_runtime_max_concurrent_reconciles{controller="proxy"} 3"#,
            r#"controller_runtime_active_workers{controller="proxy"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        let worker = metrics.start();
        assert!(scrape(&registry).contains(r#"controller_runtime_active_workers{controller="proxy"} 1"#));
        drop(worker);
        metrics.finished(Duration::from_millis(30), ReconcileResult::RequeueAfter, false);
        metrics.finished(Duration::from_millis(7), ReconcileResult::Error, true);
        let text = scrape(&registry);
        for line in [
            r#"controller_runtime_reconcile_total{controller="proxy",result="requeue_after"} 1"#,
            r#"controller_runtime_reconcile_total{controller="proxy",result="error"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="proxy"} 1"#,
            r#"controller_runtime_reconcile_panics_total{controller="proxy"} 1"#,
            r#"controller_runtime_active_workers{controller="proxy"} 0"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="proxy"} 2"#,
            r#"controller_runtime_reconcile_time_seconds_bucket{le="0.01",controller="proxy"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_bucket{le="0.05",controller="proxy"} 2"#,
            r#"controller_runtime_reconcile_time_seconds_bucket{le="60.0",controller="proxy"} 2"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn a_pass_past_its_deadline_is_a_timeout_and_no_terminal_family_is_served() {
        let metrics = ReconcileMetrics::new(3);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let text = scrape(&registry);
        assert!(!text.contains("controller_runtime_terminal_reconcile_errors"), "{text}");
        metrics.timed_out();
        let text = scrape(&registry);
        let line = r#"controller_runtime_reconcile_timeouts_total{controller="proxy"} 1"#;
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }

    #[test]
    fn the_queue_counts_adds_waits_and_work() {
        let metrics = ReconcileMetrics::new(3);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let queue = metrics.queue();
        let has = |line: &str| {
            let text = scrape(&registry);
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        };
        has(r#"workqueue_depth{name="proxy",controller="proxy",priority=""} 0"#);
        has(r#"workqueue_adds_total{name="proxy",controller="proxy"} 0"#);
        // Two triggers for one Proxy and one for another: three adds, two due.
        queue.added("crawl/a");
        queue.added("crawl/a");
        queue.added("crawl/b");
        has(r#"workqueue_adds_total{name="proxy",controller="proxy"} 3"#);
        has(r#"workqueue_depth{name="proxy",controller="proxy",priority=""} 2"#);
        let working = queue.started("crawl/a");
        has(r#"workqueue_depth{name="proxy",controller="proxy",priority=""} 1"#);
        has(r#"workqueue_queue_duration_seconds_count{name="proxy",controller="proxy"} 1"#);
        assert!(scrape(&registry).contains("workqueue_longest_running_processor_seconds{"));
        drop(working);
        has(r#"workqueue_work_duration_seconds_count{name="proxy",controller="proxy"} 1"#);
        has(r#"workqueue_unfinished_work_seconds{name="proxy",controller="proxy"} 0.0"#);
        // A requeue in an hour: added and retried, but not due, so not in the depth.
        queue.retried("crawl/a", Duration::from_secs(3600));
        has(r#"workqueue_retries_total{name="proxy",controller="proxy"} 1"#);
        has(r#"workqueue_depth{name="proxy",controller="proxy",priority=""} 1"#);
        // A Proxy gone when its turn came leaves the queue.
        queue.forget("crawl/b");
        has(r#"workqueue_depth{name="proxy",controller="proxy",priority=""} 0"#);
    }

    #[test]
    fn the_leader_gauge_follows_the_election() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut registry = Registry::default();
        register_leader(&mut registry, "b47711d1.example.com", rx);
        let line = |v| format!(r#"leader_election_master_status{{name="b47711d1.example.com"}} {v}"#);
        assert!(scrape(&registry).lines().any(|l| l == line(0)));
        tx.send(true).unwrap();
        assert!(scrape(&registry).lines().any(|l| l == line(1)));
    }

    #[test]
    fn process_figures_are_read_from_proc() {
        let stat = "4242 (egress operator) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 9 0 1000 \
                    123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         unlimited            unlimited            bytes\n\
                      Max open files            1024                 1048576              files\n";
        let proc_stat = "cpu  1 2 3\nbtime 1796000000\n";
        let p = parse_process(stat, limits, proc_stat, 12, 100, 4096).unwrap();
        assert_eq!(
            p,
            ProcessReading {
                cpu_seconds: 3.0,
                open_fds: 12,
                max_fds: Some(1024),
                virtual_memory_bytes: 123_456_789,
                virtual_memory_max_bytes: None,
                resident_memory_bytes: 2048 * 4096,
                start_time_seconds: 1_796_000_010.0,
            }
        );
        assert_eq!(parse_process("garbage", limits, proc_stat, 0, 100, 4096), None);
        // This process, read for real.
        let mut registry = Registry::default();
        register_process(&mut registry);
        let text = scrape(&registry);
        for family in [
            "process_cpu_seconds_total ",
            "process_open_fds ",
            "process_max_fds ",
            "process_virtual_memory_bytes ",
            "process_virtual_memory_max_bytes ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
        ] {
            assert!(text.lines().any(|l| l.starts_with(family)), "{family} missing:\n{text}");
        }
    }
}
