//! The exit check in the engine: its cadence, sharing, the workers it keeps while probes are
//! overdue, and failures that are no health failure.

use std::net::IpAddr;
use std::time::Duration;

use egress_health::{EchoError, EngineConfig, ExitCheck, ExitSeen, ProxyView};
use tokio::time::Instant;

use super::{start, start_with, view};

fn with_exit_check(interval_s: u64) -> EngineConfig {
    EngineConfig {
        exit: Some(ExitCheck {
            url: "https://echo.test/ip".into(),
            interval: Duration::from_secs(interval_s),
        }),
        ..EngineConfig::default()
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Waits (simulated time) until `check` holds.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within ten simulated minutes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_exit_is_checked_after_the_first_passing_probe_then_once_per_interval() {
    let a = view("a", "u1", "10.0.0.1");
    let mut r = start_with(vec![a.clone()], 16, with_exit_check(60));
    r.prober.script("10.0.0.1:3128", &[(false, 5), (false, 5), (true, 5)]);
    r.prober.script_exits("10.0.0.1:3128", vec![Ok(ip("203.0.113.1"))]);
    r.next_event().await; // the first verdict: unhealthy
    assert!(
        r.prober.exit_starts("10.0.0.1:3128").is_empty(),
        "no check before a probe passes"
    );
    let p = r.prober.clone();
    until("the first exit check", || !p.exit_starts("10.0.0.1:3128").is_empty()).await;
    let first_pass = *r.prober.starts("10.0.0.1:3128").get(2).unwrap();
    let checks = r.prober.exit_starts("10.0.0.1:3128");
    assert_eq!(checks[0].1, "https://echo.test/ip", "the echo, not the probe's target");
    assert!(
        checks[0].0 - first_pass < Duration::from_secs(1),
        "right after the first pass"
    );
    let s = r.snapshot.clone();
    let view_a = a.clone();
    until("the exit recorded", || s.exit_for(&view_a).is_some()).await;
    assert_eq!(r.snapshot.exit_for(&a).and_then(|e| e.ip()), Some(ip("203.0.113.1")));
    until("a second exit check", || p.exit_starts("10.0.0.1:3128").len() >= 2).await;
    let checks = r.prober.exit_starts("10.0.0.1:3128");
    assert!(checks[1].0 - checks[0].0 >= Duration::from_secs(60), "{checks:?}");
    assert!(
        r.prober.starts("10.0.0.1:3128").len() >= 60,
        "probes went on once a second meanwhile"
    );
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn proxies_at_one_exit_share_it_and_hear_when_that_changes() {
    let (a, b) = (view("a", "u1", "10.0.0.1"), view("b", "u2", "10.0.0.2"));
    let mut r = start_with(vec![a.clone(), b.clone()], 64, with_exit_check(60));
    let shared = ip("203.0.113.1");
    r.prober.script_exits("10.0.0.1:3128", vec![Ok(shared)]);
    r.prober
        .script_exits("10.0.0.2:3128", vec![Ok(shared), Ok(ip("203.0.113.2"))]);
    let s = r.snapshot.clone();
    until("both exits recorded", || s.sharing(shared) == 2).await;
    let mut known: Vec<String> = r.snapshot.with_exit().into_iter().map(|k| k.name).collect();
    known.sort();
    assert_eq!(known, ["a", "b"], "every proxy with a known exit, each once");
    while r.events.try_recv().is_ok() {}
    // b's next check finds another exit: a and b both hear of it.
    let mut heard = vec![r.next_event().await.name, r.next_event().await.name];
    heard.sort();
    assert_eq!(heard, ["a", "b"]);
    assert_eq!(r.snapshot.sharing(shared), 1);
    assert_eq!(r.snapshot.sharing(ip("203.0.113.2")), 1);
    // b gone: a, still at its exit, is told too only when they shared it; here they no longer do.
    r.source.set(vec![a.clone()]);
    assert_eq!(r.next_event().await.name, "b");
    assert_eq!(r.snapshot.exit_for(&a).and_then(|e| e.ip()), Some(shared));
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn exit_checks_keep_a_reserve_of_workers_while_probes_are_always_overdue() {
    let address = |i: usize| format!("10.0.1.{i}");
    let views: Vec<ProxyView> = (0..64)
        .map(|i| view(&format!("p{i}"), &format!("u{i}"), &address(i)))
        .collect();
    let config = EngineConfig {
        workers: 16,
        ..with_exit_check(60)
    };
    let r = start_with(views, 4096, config);
    // 16 workers, each probe holding one for a second: 16 probes a second of the 64 due.
    *r.prober.hold.lock().unwrap() = Duration::from_secs(1);
    for i in 0..64 {
        r.prober
            .script_exits(&format!("{}:3128", address(i)), vec![Ok(ip("203.0.113.1"))]);
    }
    let p = r.prober.clone();
    let checked = move || {
        (0..64)
            .filter(|&i| !p.exit_starts(&format!("{}:3128", address(i))).is_empty())
            .count()
    };
    until("exit checks while probes wait", || checked() == 64).await;
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failed_exit_check_is_unknown_and_not_a_health_failure() {
    let a = view("a", "u1", "10.0.0.1");
    let r = start_with(vec![a.clone()], 16, with_exit_check(60));
    r.prober.script_exits("10.0.0.1:3128", vec![Err(EchoError::List)]);
    let s = r.snapshot.clone();
    let view_a = a.clone();
    until("the exit check's finding", || s.exit_for(&view_a).is_some()).await;
    assert_eq!(
        r.snapshot.exit_for(&a),
        Some(ExitSeen::Unknown {
            why: EchoError::List.to_string()
        })
    );
    assert_eq!(r.verdict("a").map(|v| v.0), Some(true), "still healthy");
    assert_eq!(r.metrics.failures("ns/a"), Some(0));
    r.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn without_an_echo_url_no_exit_is_checked() {
    let mut r = start(vec![view("a", "u1", "10.0.0.1")], 16);
    r.next_event().await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(r.prober.exit_starts("10.0.0.1:3128").is_empty());
    r.stop.cancel();
}
