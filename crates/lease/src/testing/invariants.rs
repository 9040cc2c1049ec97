//! The suite's property test: random sequences of acquires (some with a pool selector),
//! releases, reports, time and sweeps, against a model of the rules.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;

use super::{COOLDOWN, P, acquire_selected, proxy, release, report, req, sweep, total};
use crate::{LeaseStore, ManualClock, NoMatch, ReportResult};

#[derive(Debug, Clone)]
pub enum Op {
    /// An acquire for a target (of three), and a pool (of two) as its selector.
    Acquire(Option<u8>, Option<u8>),
    Release(usize),
    Report(usize, bool, Option<u8>),
    Advance(u16),
    Sweep,
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (proptest::option::of(0u8..3), proptest::option::of(0u8..2)).prop_map(|(t, pool)| Op::Acquire(t, pool)),
        2 => any::<usize>().prop_map(Op::Release),
        2 => (any::<usize>(), any::<bool>(), proptest::option::of(0u8..3)).prop_map(|(i, b, t)| Op::Report(i, b, t)),
        1 => (0u16..1200).prop_map(Op::Advance),
        1 => Just(Op::Sweep),
    ]
}

/// A lease as the test remembers it, to know what the store must decide.
struct Known {
    id: String,
    proxy: usize,
    target: Option<String>,
    expires: SystemTime,
    released: bool,
}

/// The active leases of each of the `n` proxies by the model: granted, not released, not expired.
fn model_active(granted: &[Known], n: usize, now: SystemTime) -> Vec<usize> {
    (0..n)
        .map(|i| {
            granted
                .iter()
                .filter(|l| l.proxy == i && !l.released && l.expires > now)
                .count()
        })
        .collect()
}

/// The model's choice among the proxies of `fleet` that `selected`: the best eligible one (its
/// active leases, latency, id and index), and the counts of a refusal.
fn model_choice<'a>(
    fleet: &'a [P],
    active: &[usize],
    selected: impl Fn(&P) -> bool,
    cooling: impl Fn(usize) -> bool,
) -> (NoMatch, Option<(usize, i64, &'a str, usize)>) {
    let mut refused = NoMatch::default();
    let mut best: Option<(usize, i64, &str, usize)> = None;
    for (i, p) in fleet.iter().enumerate().filter(|(_, p)| selected(p)) {
        refused.considered += 1;
        if !p.healthy {
            refused.unhealthy += 1;
        } else if active[i] >= p.max_leases.max(0) as usize {
            refused.at_capacity += 1;
        } else if cooling(i) {
            refused.in_cooldown += 1;
        } else if best.is_none_or(|(a, l, id, _)| (active[i], p.latency_millis, p.id.as_str()) < (a, l, id)) {
            best = Some((active[i], p.latency_millis, &p.id, i));
        }
    }
    (refused, best)
}

/// What the model knows when an acquire is asked.
struct Model<'a> {
    fleet: &'a [P],
    active: &'a [usize],
    /// (proxy, target or None for global, end).
    cooldowns: &'a [(usize, Option<String>, SystemTime)],
    now: SystemTime,
    pools_apart: bool,
}

/// An acquire of the sequence: its target and the pool its selector names.
struct Asked {
    target: Option<String>,
    pool: Option<String>,
}

/// Asks `s` for `asked` and checks the answer against the model: the grant (remembered) is
/// the model's choice, a refusal has the model's counts.
async fn check_acquire(s: &dyn LeaseStore, m: &Model<'_>, asked: Asked) -> Result<Option<Known>, TestCaseError> {
    let t = asked.target;
    let cooling = |i: usize| {
        m.cooldowns
            .iter()
            .any(|(p, ct, end)| *p == i && *end > m.now && (ct.is_none() || *ct == t))
    };
    let selector: Vec<(&str, &str)> = asked.pool.iter().map(|p| ("pool", p.as_str())).collect();
    let (refused, best) = model_choice(m.fleet, m.active, |p| p.matches(&selector), cooling);
    let granted_now = acquire_selected(s, m.fleet, &selector, &req(t.as_deref())).await;
    // A store that keeps pools apart chooses within the pool it tried.
    let best = match (&granted_now, m.pools_apart) {
        (Ok(g), true) => {
            let pool = m.fleet.iter().find(|p| p.id == g.proxy_id).and_then(P::pool);
            model_choice(m.fleet, m.active, |p| p.matches(&selector) && p.pool() == pool, cooling).1
        }
        _ => best,
    };
    match (granted_now, best) {
        (Ok(g), Some((a, _, id, i))) => {
            prop_assert_eq!(
                (g.proxy_id.as_str(), g.active_leases),
                (id, a + 1),
                "not the model's choice"
            );
            Ok(Some(Known {
                id: g.lease_id,
                proxy: i,
                target: t,
                expires: g.expires_at,
                released: false,
            }))
        }
        (Err(n), None) => {
            prop_assert_eq!(n, refused, "not the model's counts");
            Ok(None)
        }
        (got, want) => Err(TestCaseError::fail(format!("got {got:?}, the model chose {want:?}"))),
    }
}

/// Runs `ops` on a fresh store against a model of the rules kept here: every acquire grants
/// exactly the proxy the model chooses (fewest active leases, then latency, then id, among the
/// healthy ones with room that do not cool down for the request; with `pools_apart`, among
/// those of the granted proxy's pool), or refuses with the model's counts; every proxy's
/// active leases are the model's; reports are accepted exactly within the retention.
pub async fn invariants_hold(
    s: Arc<dyn LeaseStore>,
    clock: ManualClock,
    ops: Vec<Op>,
    pools_apart: bool,
) -> Result<(), TestCaseError> {
    let s = s.as_ref();
    // Capacities 0, 1, 2, 0 and an unhealthy one; latencies tie for p1 and p4; two pools.
    let fleet: Vec<P> = (0..5)
        .map(|i| P {
            healthy: i != 4,
            ..proxy(&format!("ns/p{i}"), i64::from(i % 4), i % 3).with("pool", &format!("pool-{}", i % 2))
        })
        .collect();
    let ids: Vec<crate::ProxyRef<'_>> = fleet.iter().map(P::placed).collect();
    let mut granted: Vec<Known> = Vec::new();
    // (proxy, target or None for global, end).
    let mut cooldowns: Vec<(usize, Option<String>, SystemTime)> = Vec::new();
    let site = |t: Option<u8>| t.map(|t| format!("site{t}"));
    for op in ops {
        let now = crate::Clock::now(&clock);
        let active = model_active(&granted, fleet.len(), now);
        match op {
            Op::Acquire(t, pool) => {
                let asked = Asked {
                    target: site(t),
                    pool: pool.map(|n| format!("pool-{n}")),
                };
                let model = Model {
                    fleet: &fleet,
                    active: &active,
                    cooldowns: &cooldowns,
                    now,
                    pools_apart,
                };
                granted.extend(check_acquire(s, &model, asked).await?);
            }
            Op::Release(i) if !granted.is_empty() => {
                let i = i % granted.len();
                let id = granted[i].id.clone();
                release(s, &id).await;
                granted[i].released = true;
                let after = total(s).await;
                release(s, &id).await;
                prop_assert_eq!(total(s).await, after, "a second release changed something");
            }
            Op::Report(i, banned, t) if !granted.is_empty() => {
                let lease = &granted[i % granted.len()];
                let result = if banned {
                    ReportResult::Banned
                } else {
                    ReportResult::RateLimited
                };
                let reported = report(s, &lease.id, result, site(t).as_deref()).await;
                let retained = lease.expires + COOLDOWN > now;
                prop_assert_eq!(reported.is_ok(), retained, "reportable exactly within the retention");
                if retained {
                    let resolved = site(t).or_else(|| lease.target.clone());
                    cooldowns.push((lease.proxy, resolved, now + COOLDOWN));
                }
            }
            Op::Advance(secs) => clock.advance(Duration::from_secs(secs.into())),
            Op::Sweep => sweep(s).await,
            _ => {}
        }
        let model = model_active(&granted, fleet.len(), crate::Clock::now(&clock));
        prop_assert_eq!(s.active_leases(&ids).await.unwrap(), model, "active leases");
    }
    Ok(())
}
