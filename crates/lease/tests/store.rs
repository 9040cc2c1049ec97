//! The store's rules, its invariants under random operation sequences, and capacity under
//! concurrent acquisitions.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_lease::{
    Candidate, LeaseRequest, LeaseStore, ManualClock, MemoryStore, NoMatch, ReportResult, UnknownLease,
};
use proptest::prelude::*;

const COOLDOWN: Duration = Duration::from_secs(900);

fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn store() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new(start());
    (MemoryStore::new(Arc::new(clock.clone()), COOLDOWN), clock)
}

/// A proxy the test owns; candidates borrow from it.
#[derive(Debug, Clone)]
struct P {
    id: String,
    healthy: bool,
    latency_millis: i64,
    max_leases: i32,
}

fn proxy(id: &str, latency_millis: i64, max_leases: i32) -> P {
    P {
        id: id.into(),
        healthy: true,
        latency_millis,
        max_leases,
    }
}

/// Acquires over `fleet`, handing the store its candidates in the order it wants.
fn acquire(s: &MemoryStore, fleet: &[P], r: &LeaseRequest) -> Result<egress_lease::Grant, NoMatch> {
    let mut candidates: Vec<Candidate<'_>> = fleet
        .iter()
        .map(|p| Candidate {
            id: &p.id,
            healthy: p.healthy,
            latency_millis: p.latency_millis,
            max_leases: p.max_leases,
        })
        .collect();
    candidates.sort_by(|a, b| a.order(b));
    s.acquire(&mut candidates.into_iter(), r)
}

fn req(target: Option<&str>) -> LeaseRequest {
    LeaseRequest {
        ttl: Duration::from_secs(300),
        target: target.map(str::to_string),
    }
}

#[test]
fn selection_prefers_fewest_leases_then_latency_then_id() {
    let (s, _) = store();
    let fleet = [proxy("ns/c", 10, 5), proxy("ns/b", 10, 5), proxy("ns/a", 50, 5)];
    // All idle: the lowest latency wins, and between equal latencies the smaller id.
    assert_eq!(acquire(&s, &fleet, &req(None)).unwrap().proxy_id, "ns/b");
    assert_eq!(acquire(&s, &fleet, &req(None)).unwrap().proxy_id, "ns/c");
    // b and c have one lease each: a (idle) wins despite its latency.
    let g = acquire(&s, &fleet, &req(None)).unwrap();
    assert_eq!((g.proxy_id.as_str(), g.active_leases), ("ns/a", 1));
    assert_eq!(s.active_leases(&["ns/a", "ns/b", "ns/c", "ns/none"]), [1, 1, 1, 0]);
    assert_eq!(s.active_total(), 3);
}

#[test]
fn capacity_zero_and_unhealthy_proxies_are_never_leased_and_counted_once() {
    let (s, _) = store();
    let mut sick = proxy("ns/sick", 1, 5);
    sick.healthy = false;
    let mut sick_and_full = proxy("ns/sick-full", 1, 0);
    sick_and_full.healthy = false;
    let fleet = [sick, sick_and_full, proxy("ns/zero", 1, 0), proxy("ns/one", 1, 1)];
    assert_eq!(acquire(&s, &fleet, &req(None)).unwrap().proxy_id, "ns/one");
    assert_eq!(
        acquire(&s, &fleet, &req(None)),
        Err(NoMatch {
            considered: 4,
            at_capacity: 2,
            in_cooldown: 0,
            unhealthy: 2
        })
    );
    assert_eq!(
        acquire(&s, &[], &req(None)),
        Err(NoMatch::default()),
        "nothing matched the selector"
    );
}

#[test]
fn release_frees_capacity_at_once_and_is_idempotent() {
    let (s, _) = store();
    let fleet = [proxy("ns/a", 1, 1)];
    let g = acquire(&s, &fleet, &req(None)).unwrap();
    assert!(acquire(&s, &fleet, &req(None)).is_err());
    s.release(&g.lease_id);
    s.release(&g.lease_id);
    s.release("NEVERISSUED");
    assert_eq!(s.active_total(), 0);
    assert!(acquire(&s, &fleet, &req(None)).is_ok());
    assert_eq!(s.active_total(), 1, "a double release freed nothing extra");
}

#[test]
fn expiry_frees_capacity_whenever_the_sweep_runs() {
    let (s, clock) = store();
    let fleet = [proxy("ns/a", 1, 1)];
    let g = acquire(&s, &fleet, &req(None)).unwrap();
    assert_eq!(g.expires_at, start() + Duration::from_secs(300));
    clock.advance(Duration::from_secs(299));
    assert!(acquire(&s, &fleet, &req(None)).is_err());
    clock.advance(Duration::from_secs(1));
    assert_eq!(s.active_total(), 0, "expired at expiresAt, no sweep needed");
    assert!(acquire(&s, &fleet, &req(None)).is_ok());
}

#[test]
fn a_targeted_cooldown_blocks_only_that_target() {
    let (s, clock) = store();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(&s, &fleet, &req(Some("example.com"))).unwrap();
    s.report(&g.lease_id, ReportResult::RateLimited, None).unwrap();
    let refused = acquire(&s, &fleet, &req(Some("example.com"))).unwrap_err();
    assert_eq!((refused.considered, refused.in_cooldown), (1, 1));
    assert!(acquire(&s, &fleet, &req(Some("other.org"))).is_ok(), "another target");
    assert!(acquire(&s, &fleet, &req(None)).is_ok(), "no target");
    clock.advance(COOLDOWN);
    assert!(
        acquire(&s, &fleet, &req(Some("example.com"))).is_ok(),
        "the window is over"
    );
}

#[test]
fn the_reports_target_wins_over_the_leases() {
    let (s, _) = store();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(&s, &fleet, &req(Some("example.com"))).unwrap();
    s.report(&g.lease_id, ReportResult::Banned, Some("shop.example"))
        .unwrap();
    assert!(s.cooling("ns/a", Some("shop.example")));
    assert!(!s.cooling("ns/a", Some("example.com")));
}

#[test]
fn a_global_cooldown_blocks_every_request() {
    let (s, _) = store();
    let fleet = [proxy("ns/a", 1, 5), proxy("ns/b", 9, 5)];
    let g = acquire(&s, &fleet, &req(None)).unwrap();
    assert_eq!(g.proxy_id, "ns/a");
    s.report(&g.lease_id, ReportResult::Banned, Some("")).unwrap();
    for target in [None, Some("example.com"), Some("")] {
        assert_eq!(
            acquire(&s, &fleet, &req(target)).unwrap().proxy_id,
            "ns/b",
            "{target:?}"
        );
    }
}

#[test]
fn an_ok_report_records_nothing() {
    let (s, _) = store();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(&s, &fleet, &req(Some("example.com"))).unwrap();
    s.report(&g.lease_id, ReportResult::Ok, None).unwrap();
    assert!(!s.cooling("ns/a", Some("example.com")));
}

#[test]
fn overlapping_cooldowns_keep_the_later_end() {
    let (s, clock) = store();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(&s, &fleet, &req(Some("t"))).unwrap();
    s.report(&g.lease_id, ReportResult::RateLimited, None).unwrap();
    clock.advance(Duration::from_secs(600));
    s.report(&g.lease_id, ReportResult::RateLimited, None).unwrap();
    clock.advance(Duration::from_secs(600));
    assert!(
        s.cooling("ns/a", Some("t")),
        "the second report's window runs to 1500 s"
    );
    clock.advance(Duration::from_secs(300));
    assert!(!s.cooling("ns/a", Some("t")));
}

#[test]
fn an_expired_or_released_lease_stays_reportable_for_one_window() {
    let (s, clock) = store();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(&s, &fleet, &req(Some("t"))).unwrap();
    s.release(&g.lease_id);
    clock.advance(Duration::from_secs(300) + COOLDOWN - Duration::from_secs(1));
    s.sweep();
    assert_eq!(
        s.report(&g.lease_id, ReportResult::RateLimited, None),
        Ok(()),
        "a late report lands"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        s.report(&g.lease_id, ReportResult::Ok, None),
        Err(UnknownLease),
        "aged out, even unswept"
    );
    s.sweep();
    assert_eq!(s.report(&g.lease_id, ReportResult::Ok, None), Err(UnknownLease));
    assert_eq!(s.report("NEVERISSUED", ReportResult::Ok, None), Err(UnknownLease));
}

#[test]
fn the_sweep_forgets_ended_cooldowns_and_old_leases_only() {
    let (s, clock) = store();
    let fleet = [proxy("ns/a", 1, 5)];
    let old = acquire(&s, &fleet, &req(Some("t"))).unwrap();
    s.report(&old.lease_id, ReportResult::RateLimited, None).unwrap();
    clock.advance(COOLDOWN);
    let young = acquire(&s, &fleet, &req(Some("t"))).unwrap();
    s.sweep();
    assert!(
        s.report(&old.lease_id, ReportResult::Ok, None).is_ok(),
        "within its retention"
    );
    assert!(s.report(&young.lease_id, ReportResult::Ok, None).is_ok());
    clock.advance(Duration::from_secs(300));
    s.sweep();
    assert_eq!(s.report(&old.lease_id, ReportResult::Ok, None), Err(UnknownLease));
    assert!(s.report(&young.lease_id, ReportResult::Ok, None).is_ok());
}

#[test]
fn sixty_four_threads_never_exceed_any_capacity() {
    let (s, _) = store();
    let s = Arc::new(s);
    let fleet: Vec<P> = (0..8).map(|i| proxy(&format!("ns/p{i}"), i, 3)).collect();
    let ids: Vec<&str> = fleet.iter().map(|c| c.id.as_str()).collect();
    std::thread::scope(|scope| {
        for t in 0..64 {
            let (s, fleet, ids) = (s.clone(), &fleet, &ids);
            scope.spawn(move || {
                for round in 0..200 {
                    let target = (round % 3 == 0).then(|| format!("site{}", t % 4));
                    if let Ok(g) = acquire(&s, fleet, &req(target.as_deref())) {
                        assert!(g.active_leases <= 3, "{g:?}");
                        for n in s.active_leases(ids) {
                            assert!(n <= 3, "a proxy over capacity: {n}");
                        }
                        s.release(&g.lease_id);
                    }
                }
            });
        }
    });
    assert_eq!(s.active_total(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(Option<u8>),
    Release(usize),
    Report(usize, bool, Option<u8>),
    Advance(u16),
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::option::of(0u8..3).prop_map(Op::Acquire),
        2 => any::<usize>().prop_map(Op::Release),
        2 => (any::<usize>(), any::<bool>(), proptest::option::of(0u8..3)).prop_map(|(i, b, t)| Op::Report(i, b, t)),
        1 => (0u16..1200).prop_map(Op::Advance),
        1 => Just(Op::Sweep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn invariants_hold_for_any_sequence(ops in proptest::collection::vec(op(), 1..80)) {
        let (s, clock) = store();
        let fleet: Vec<P> = (0..4).map(|i| proxy(&format!("ns/p{i}"), i64::from(i), i % 3)).collect();
        let ids: Vec<&str> = fleet.iter().map(|c| c.id.as_str()).collect();
        let mut granted: Vec<String> = Vec::new();
        let target = |t: Option<u8>| t.map(|t| format!("site{t}"));
        for op in ops {
            match op {
                Op::Acquire(t) => {
                    let t = target(t);
                    // Which proxies may not be granted: full ones, and those cooling for t.
                    let before = s.active_leases(&ids);
                    let cooling: Vec<bool> = ids.iter().map(|p| s.cooling(p, t.as_deref())).collect();
                    if let Ok(g) = acquire(&s, &fleet, &req(t.as_deref())) {
                        let i = ids.iter().position(|p| *p == g.proxy_id).unwrap();
                        prop_assert!(before[i] < fleet[i].max_leases as usize, "granted a full proxy");
                        prop_assert!(!cooling[i], "granted a proxy cooling for {t:?}");
                        granted.push(g.lease_id);
                    }
                }
                Op::Release(i) if !granted.is_empty() => {
                    let id = &granted[i % granted.len()];
                    s.release(id);
                    let after = s.active_total();
                    s.release(id);
                    prop_assert_eq!(s.active_total(), after, "a second release changed something");
                }
                Op::Report(i, banned, t) if !granted.is_empty() => {
                    let id = &granted[i % granted.len()];
                    let result = if banned { ReportResult::Banned } else { ReportResult::RateLimited };
                    let _ = s.report(id, result, target(t).as_deref());
                }
                Op::Advance(secs) => clock.advance(Duration::from_secs(secs.into())),
                Op::Sweep => s.sweep(),
                _ => {}
            }
            for (n, c) in s.active_leases(&ids).into_iter().zip(&fleet) {
                prop_assert!(n <= c.max_leases.max(0) as usize, "{} over capacity", c.id);
            }
        }
    }
}
