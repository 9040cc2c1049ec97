//! The engine on tokio's paused clock with a scripted prober: thresholds and the first verdict,
//! latency suppression, dropped-event retry, stale results, pruning with series cleanup, the
//! probe cadence; and the exit check's cadence, sharing, reserve and failures (`exits.rs`).

mod exits;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_health::{
    EchoError, Engine, EngineConfig, HealthMetrics, ProbeError, ProbeOutcome, ProbeRequest, ProbeSettings, Prober,
    ProxyKey, ProxySource, ProxyView, Snapshot,
};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Source(Mutex<Vec<ProxyView>>);

impl ProxySource for Source {
    fn proxies(&self) -> Vec<ProxyView> {
        self.0.lock().unwrap().clone()
    }
}

impl Source {
    fn set(&self, views: Vec<ProxyView>) {
        *self.0.lock().unwrap() = views;
    }
}

fn settings(interval_ms: u64) -> ProbeSettings {
    ProbeSettings {
        credentials: None,
        url: "https://target.test/204".into(),
        expected_status: 204,
        interval: Duration::from_millis(interval_ms),
        timeout: Duration::from_secs(5),
        success_threshold: 2,
        failure_threshold: 3,
        destinations: None,
    }
}

fn view(name: &str, uid: &str, host: &str) -> ProxyView {
    ProxyView {
        key: ProxyKey::new("ns", name),
        uid: uid.into(),
        host: host.into(),
        port: 3128,
        settings: settings(1000),
        known: None,
    }
}

/// Answers from a per-proxy script of (ok, latency ms); once a script runs out, repeats its
/// last answer. Records when each probe started, and can hold probes of one proxy at a gate.
#[derive(Default)]
struct Scripted {
    scripts: Mutex<HashMap<String, VecDeque<(bool, u64)>>>,
    last: Mutex<HashMap<String, (bool, u64)>>,
    started: Mutex<HashMap<String, Vec<Instant>>>,
    gate: Mutex<Option<(String, Arc<Notify>)>>,
    /// Per proxy, the exit checks' answers; the last one repeats.
    exits: Mutex<HashMap<String, VecDeque<Result<IpAddr, EchoError>>>>,
    /// Per proxy, when each exit check started and the URL it asked.
    exit_starts: Mutex<HashMap<String, Vec<(Instant, String)>>>,
    /// How long every probe holds its worker (none by default).
    hold: Mutex<Duration>,
}

impl Scripted {
    fn script(&self, proxy: &str, answers: &[(bool, u64)]) {
        self.scripts
            .lock()
            .unwrap()
            .insert(proxy.into(), answers.iter().copied().collect());
    }
    fn starts(&self, proxy: &str) -> Vec<Instant> {
        self.started.lock().unwrap().get(proxy).cloned().unwrap_or_default()
    }
    fn script_exits(&self, proxy: &str, answers: Vec<Result<IpAddr, EchoError>>) {
        self.exits.lock().unwrap().insert(proxy.into(), answers.into());
    }
    fn exit_starts(&self, proxy: &str) -> Vec<(Instant, String)> {
        self.exit_starts.lock().unwrap().get(proxy).cloned().unwrap_or_default()
    }
}

/// The engine owns its prober; the test keeps a second handle to the script.
struct Handle(Arc<Scripted>);

impl Prober for Handle {
    fn probe(&self, req: Arc<ProbeRequest>) -> impl Future<Output = ProbeOutcome> + Send {
        let me = self.0.clone();
        async move {
            me.started
                .lock()
                .unwrap()
                .entry(req.proxy.clone())
                .or_default()
                .push(Instant::now());
            // The answer is taken when the probe starts, so probes answer in their start order.
            let next = me
                .scripts
                .lock()
                .unwrap()
                .get_mut(&req.proxy)
                .and_then(VecDeque::pop_front);
            let (ok, ms) = match next {
                Some(a) => {
                    me.last.lock().unwrap().insert(req.proxy.clone(), a);
                    a
                }
                None => me.last.lock().unwrap().get(&req.proxy).copied().unwrap_or((true, 10)),
            };
            let hold = *me.hold.lock().unwrap();
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            let gate = me.gate.lock().unwrap().clone();
            if let Some((proxy, notify)) = gate
                && proxy == req.proxy
            {
                notify.notified().await;
            }
            ProbeOutcome {
                result: if ok {
                    Ok(())
                } else {
                    Err(ProbeError::Unreachable("scripted".into()))
                },
                latency: Duration::from_millis(ms),
            }
        }
    }

    fn exit(&self, req: Arc<ProbeRequest>) -> impl Future<Output = Result<IpAddr, EchoError>> + Send {
        self.0
            .exit_starts
            .lock()
            .unwrap()
            .entry(req.proxy.clone())
            .or_default()
            .push((Instant::now(), req.url.clone()));
        std::future::ready(self.next_exit(&req.proxy))
    }
}

impl Handle {
    fn next_exit(&self, proxy: &str) -> Result<IpAddr, EchoError> {
        let mut exits = self.0.exits.lock().unwrap();
        let queue = exits.get_mut(proxy);
        match queue {
            Some(q) if q.len() > 1 => q.pop_front().unwrap(),
            Some(q) => q.front().cloned().unwrap_or(Err(EchoError::NotAnAddress)),
            None => Err(EchoError::NotAnAddress),
        }
    }
}

struct Running {
    source: Arc<Source>,
    prober: Arc<Scripted>,
    snapshot: Snapshot,
    metrics: HealthMetrics,
    events: mpsc::Receiver<ProxyKey>,
    stop: CancellationToken,
}

fn start(views: Vec<ProxyView>, capacity: usize) -> Running {
    start_with(views, capacity, EngineConfig::default())
}

fn start_with(views: Vec<ProxyView>, capacity: usize, config: EngineConfig) -> Running {
    let source = Arc::new(Source::default());
    source.set(views);
    let prober = Arc::new(Scripted::default());
    let snapshot = Snapshot::default();
    let metrics = HealthMetrics::new();
    let (tx, events) = mpsc::channel(capacity);
    let stop = CancellationToken::new();
    let engine = Engine::new(
        source.clone(),
        Handle(prober.clone()),
        config,
        metrics.clone(),
        snapshot.clone(),
        tx,
    );
    tokio::spawn(engine.run(stop.clone()));
    Running {
        source,
        prober,
        snapshot,
        metrics,
        events,
        stop,
    }
}

impl Running {
    async fn next_event(&mut self) -> ProxyKey {
        tokio::time::timeout(Duration::from_secs(600), self.events.recv())
            .await
            .expect("an event within ten simulated minutes")
            .expect("the engine runs")
    }
    fn verdict(&self, name: &str) -> Option<(bool, u64)> {
        self.snapshot
            .get("ns", name)
            .map(|v| (v.healthy, v.latency.as_millis() as u64))
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_verdict_at_once_then_flips_at_the_thresholds() {
    let mut r = start(vec![view("a", "u1", "10.0.0.1")], 16);
    r.prober.script(
        "10.0.0.1:3128",
        &[(true, 40), (false, 1), (false, 1), (false, 2), (true, 30), (true, 35)],
    );
    assert_eq!(r.next_event().await, ProxyKey::new("ns", "a"));
    assert_eq!(r.verdict("a"), Some((true, 40)), "first result, no threshold");
    r.next_event().await;
    assert_eq!(r.verdict("a"), Some((false, 2)), "third failure in a row");
    assert_eq!(
        r.prober.starts("10.0.0.1:3128").len(),
        4,
        "no event for the first two failures"
    );
    r.next_event().await;
    assert_eq!(r.verdict("a"), Some((true, 35)), "second success in a row");
    assert_eq!(r.metrics.failures("ns/a"), Some(3));
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn latency_jitter_sends_no_event_but_a_material_change_does() {
    let mut r = start(vec![view("a", "u1", "10.0.0.1")], 16);
    r.prober.script(
        "10.0.0.1:3128",
        &[(true, 40), (true, 60), (true, 90), (true, 120), (true, 400)],
    );
    r.next_event().await;
    r.next_event().await;
    assert_eq!(r.verdict("a"), Some((true, 400)));
    assert_eq!(
        r.prober.starts("10.0.0.1:3128").len(),
        5,
        "60, 90 and 120 ms were jitter"
    );
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_event_dropped_on_a_full_channel_is_sent_later() {
    let mut r = start(vec![view("a", "u1", "10.0.0.1"), view("b", "u2", "10.0.0.2")], 1);
    // Both first verdicts are due within the first interval; the channel holds one.
    let deadline = Instant::now() + Duration::from_secs(5);
    while r.snapshot.len() < 2 {
        assert!(Instant::now() < deadline, "both proxies probed within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = r.next_event().await;
    let second = r.next_event().await;
    let mut got = vec![first.name, second.name];
    got.sort();
    assert_eq!(got, ["a", "b"], "the dropped event came on a later tick");
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_result_for_a_replaced_proxy_is_discarded() {
    let mut r = start(vec![view("a", "old", "10.0.0.1")], 16);
    let gate = Arc::new(Notify::new());
    *r.prober.gate.lock().unwrap() = Some(("10.0.0.1:3128".into(), gate.clone()));
    r.prober.script("10.0.0.1:3128", &[(false, 5), (true, 20)]);
    // The old Proxy's probe is held; meanwhile the Proxy is recreated under the same name.
    let deadline = Instant::now() + Duration::from_secs(5);
    while r.prober.starts("10.0.0.1:3128").is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r.source.set(vec![view("a", "new", "10.0.0.1")]);
    tokio::time::sleep(Duration::from_millis(1500)).await; // a refresh: the record is replaced
    *r.prober.gate.lock().unwrap() = None;
    gate.notify_waiters();
    // The held (failing) result belongs to the old UID: the first verdict comes from the new one.
    r.next_event().await;
    assert_eq!(r.verdict("a"), Some((true, 20)));
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_gone_proxy_is_pruned_with_its_series_and_verdict() {
    let mut r = start(vec![view("a", "u1", "10.0.0.1"), view("b", "u2", "10.0.0.2")], 16);
    r.next_event().await;
    r.next_event().await;
    assert!(r.metrics.has_series("ns/a"));
    // a is deleted; b loses its address (its instance went back to provisioning).
    r.source.set(vec![view("b", "u2", "")]);
    let mut pruned = vec![r.next_event().await.name, r.next_event().await.name];
    pruned.sort();
    assert_eq!(pruned, ["a", "b"], "the reconciler hears of both");
    assert_eq!((r.verdict("a"), r.verdict("b")), (None, None));
    assert!(!r.metrics.has_series("ns/a") && !r.metrics.has_series("ns/b"));
    let probes = r.prober.starts("10.0.0.1:3128").len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(r.prober.starts("10.0.0.1:3128").len(), probes, "no more probes of a");
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_moved_proxy_starts_a_fresh_record() {
    let mut r = start(vec![view("a", "u1", "10.0.0.1")], 16);
    r.prober.script("10.0.0.1:3128", &[(true, 10)]);
    r.prober.script("10.0.0.9:3128", &[(false, 10)]);
    r.next_event().await;
    assert_eq!(r.verdict("a"), Some((true, 10)));
    r.source.set(vec![view("a", "u1", "10.0.0.9")]);
    // The old verdict goes (event), then the new address's first result is a verdict at once.
    r.next_event().await;
    r.next_event().await;
    assert_eq!(r.verdict("a"), Some((false, 10)));
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn no_proxy_is_probed_more_often_than_its_interval() {
    let mut views: Vec<ProxyView> = (0..50)
        .map(|i| view(&format!("p{i}"), &format!("u{i}"), &format!("10.0.1.{i}")))
        .collect();
    views[0].settings.interval = Duration::from_millis(2500);
    let r = start(views, 4096);
    tokio::time::sleep(Duration::from_secs(30)).await;
    for i in 0..50 {
        let starts = r.prober.starts(&format!("10.0.1.{i}:3128"));
        let interval = if i == 0 { 2500 } else { 1000 };
        assert!(
            starts.len() >= 30_000 / interval - 2,
            "p{i} probed {} times",
            starts.len()
        );
        for pair in starts.windows(2) {
            assert!(
                pair[1] - pair[0] >= Duration::from_millis(interval as u64),
                "p{i}: probes {:?} apart",
                pair[1] - pair[0]
            );
        }
    }
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn first_probes_are_spread_over_one_interval() {
    let views: Vec<ProxyView> = (0..40)
        .map(|i| view(&format!("p{i}"), &format!("u{i}"), &format!("10.0.2.{i}")))
        .collect();
    let started = Instant::now();
    let r = start(views, 4096);
    tokio::time::sleep(Duration::from_millis(1021)).await;
    let firsts: Vec<Instant> = (0..40)
        .map(|i| r.prober.starts(&format!("10.0.2.{i}:3128"))[0])
        .collect();
    // Within the first interval (a start may be up to the engine's 20 ms batching grain late).
    assert!(
        firsts.iter().all(|t| *t - started <= Duration::from_millis(1020)),
        "all within the first interval"
    );
    let distinct: std::collections::HashSet<_> = firsts.iter().collect();
    assert!(
        distinct.len() > 10,
        "not all at once: {} distinct start times",
        distinct.len()
    );
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn each_probe_is_a_root_span_only_when_asked() {
    let (capture, _guard) = egress_conformance::capture::Capture::start();
    let config = EngineConfig {
        trace_probes: true,
        ..Default::default()
    };
    let mut r = start_with(vec![view("a", "u1", "10.0.0.1")], 16, config);
    r.prober.script("10.0.0.1:3128", &[(false, 12)]);
    r.next_event().await;
    r.stop.cancel();
    let spans: Vec<_> = capture
        .spans()
        .into_iter()
        .filter(|s| s.name == "health.probe")
        .collect();
    assert!(!spans.is_empty());
    let s = &spans[0];
    assert_eq!(s.parent, None, "a root span");
    assert_eq!(s.field("proxy"), Some("ns/a"));
    assert_eq!(s.field("probe.ok"), Some("false"));
    assert_eq!(s.field("probe.latency_ms"), Some("12"));
    assert_eq!(s.field("otel.status_code"), Some("error"));
    assert_eq!(
        s.field("otel.status_description"),
        Some("the proxy is unreachable: scripted")
    );

    let mark = capture.span_mark();
    let mut quiet = start(vec![view("b", "u2", "10.0.0.2")], 16);
    quiet.next_event().await;
    quiet.stop.cancel();
    assert!(
        capture.spans_since(mark).iter().all(|s| s.name != "health.probe"),
        "no probe spans by default"
    );
}

#[tokio::test(start_paused = true)]
async fn a_busy_pool_delays_probes_without_spinning() {
    let config = EngineConfig {
        workers: 1,
        ..Default::default()
    };
    let mut r = start_with(
        vec![view("a", "u1", "10.0.0.1"), view("b", "u2", "10.0.0.2")],
        16,
        config,
    );
    let gate = Arc::new(Notify::new());
    *r.prober.gate.lock().unwrap() = Some(("10.0.0.1:3128".into(), gate.clone()));
    // Whichever starts first, a's probe ends up holding the only worker for a while: the engine
    // must keep sleeping (time advances) rather than spin on the due probe of b.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let a = r.prober.starts("10.0.0.1:3128").len();
    let b = r.prober.starts("10.0.0.2:3128").len();
    assert_eq!(a, 1, "a's probe is held");
    assert!(b <= 1, "b waits for the worker a holds: {b} probes");
    *r.prober.gate.lock().unwrap() = None;
    gate.notify_waiters();
    while r.snapshot.len() < 2 {
        r.next_event().await;
    }
    assert!(!r.prober.starts("10.0.0.2:3128").is_empty());
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_verdict_already_in_the_status_needs_a_threshold_to_change() {
    let mut known = view("a", "u1", "10.0.0.1");
    known.known = Some(egress_health::Verdict {
        healthy: true,
        latency: Duration::from_millis(30),
        auth_refused: false,
    });
    let mut r = start(vec![known], 16);
    r.prober.script(
        "10.0.0.1:3128",
        &[(false, 5), (true, 30), (false, 5), (false, 6), (false, 7)],
    );
    let event = r.next_event().await;
    assert_eq!(event.name, "a");
    assert_eq!(
        r.verdict("a"),
        Some((false, 7)),
        "only the third failure in a row flips it"
    );
    assert_eq!(r.prober.starts("10.0.0.1:3128").len(), 5);
    r.stop.cancel();
}

/// A source that says when it changed.
#[derive(Default)]
struct Versioned {
    views: Mutex<Vec<ProxyView>>,
    generation: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicU64,
}

impl ProxySource for Versioned {
    fn proxies(&self) -> Vec<ProxyView> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.views.lock().unwrap().clone()
    }
    fn generation(&self) -> Option<u64> {
        Some(self.generation.load(std::sync::atomic::Ordering::SeqCst))
    }
}

#[tokio::test(start_paused = true)]
async fn an_unchanged_source_is_not_read_again() {
    let source = Arc::new(Versioned::default());
    *source.views.lock().unwrap() = vec![view("a", "u1", "10.0.0.1")];
    let prober = Arc::new(Scripted::default());
    let (tx, mut events) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let snapshot = Snapshot::default();
    let engine = Engine::new(
        source.clone(),
        Handle(prober.clone()),
        EngineConfig::default(),
        HealthMetrics::new(),
        snapshot.clone(),
        tx,
    );
    tokio::spawn(engine.run(stop.clone()));
    events.recv().await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(source.reads.load(std::sync::atomic::Ordering::SeqCst), 1, "read once");
    // A change the source reports is picked up at the next refresh.
    source.views.lock().unwrap().clear();
    source.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(events.recv().await.unwrap().name, "a", "pruned");
    assert!(snapshot.is_empty());
    stop.cancel();
}

/// Panics on every probe of one address.
struct Panicky(Arc<Scripted>);

impl Prober for Panicky {
    fn probe(&self, req: Arc<ProbeRequest>) -> impl Future<Output = ProbeOutcome> + Send {
        let handle = Handle(self.0.clone());
        async move {
            if req.proxy == "10.0.0.1:3128" {
                panic!("a broken prober");
            }
            handle.probe(req).await
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_probe_frees_its_worker_and_counts_as_a_failure() {
    let source = Arc::new(Source::default());
    source.set(vec![view("a", "u1", "10.0.0.1"), view("b", "u2", "10.0.0.2")]);
    let prober = Arc::new(Scripted::default());
    let (tx, mut events) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let snapshot = Snapshot::default();
    let metrics = HealthMetrics::new();
    let config = EngineConfig {
        workers: 1,
        ..Default::default()
    };
    let engine = Engine::new(
        source,
        Panicky(prober.clone()),
        config,
        metrics.clone(),
        snapshot.clone(),
        tx,
    );
    tokio::spawn(engine.run(stop.clone()));
    let mut seen = vec![events.recv().await.unwrap().name, events.recv().await.unwrap().name];
    seen.sort();
    assert_eq!(seen, ["a", "b"]);
    assert_eq!(snapshot.get("ns", "a").map(|v| v.healthy), Some(false));
    assert_eq!(snapshot.get("ns", "b").map(|v| v.healthy), Some(true));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(metrics.failures("ns/a").unwrap_or(0) >= 2, "a keeps being probed");
    stop.cancel();
}
