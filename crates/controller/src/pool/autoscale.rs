//! The pool autoscaler's decision, as pure functions (docs/pools.md#autoscale): how many
//! members a pool with `spec.autoscale` wants, from its lease load and the lease requests that
//! found no proxy for it, and when a lower number takes effect.
//!
//! - **Utilisation.** `ceil(leases × 100 / (maxLeases × targetUtilization))`: the members that
//!   carry the pool's active leases at the target share of their capacity.
//! - **Refusals.** Requests refused (`409 no_match`) with a selector naming the pool mean demand
//!   the pool had no room for: each `maxLeases` of them wants one member more than the pool
//!   has. Only those made while the pool has every member it asked for Ready count (the
//!   controller counts from the look that found it so, and from its last raise): capacity on
//!   its way is waited for, so the same shortage is not paid for twice. A pool at zero has all
//!   of its none, so its first refusal wakes it.
//! - **Bounds.** One step up at most doubles the pool (or adds 4, if more); the answer is
//!   clamped to `[min, max]`.
//! - **Up at once, down late.** A higher number is taken at once. A lower one waits until every
//!   recommendation for `scaleDownDelay` was lower than the current number, then takes the
//!   highest of them, so a dip shorter than the delay removes nothing. A raise ends any run,
//!   so it holds for at least the delay (a pool woken from zero has no lease until its member
//!   is Ready and the client comes back).

use std::time::{Duration, Instant};

use egress_api::PoolAutoscale;

/// `targetUtilization` when the pool does not say.
pub const DEFAULT_TARGET_UTILIZATION: u32 = 70;
/// `scaleDownDelay` when the pool does not say.
pub const DEFAULT_SCALE_DOWN_DELAY: Duration = Duration::from_secs(300);
/// Members one step up may add at least (beyond doubling).
const MIN_STEP_UP: u32 = 4;

/// `spec.autoscale` with its defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub min: u32,
    pub max: u32,
    /// Percent, 1 to 100.
    pub target_utilization: u32,
    pub scale_down_delay: Duration,
}

impl Policy {
    /// # Errors
    ///
    /// A `scaleDownDelay` the schema let through that Go's parser refuses, as `field: why`.
    pub fn from_spec(spec: &PoolAutoscale) -> Result<Self, String> {
        let count = |n: i32| u32::try_from(n).unwrap_or(0);
        let scale_down_delay = spec
            .scale_down_delay
            .as_deref()
            .map(egress_go_decode::parse_duration)
            .transpose()
            .map_err(|e| format!("spec.autoscale.scaleDownDelay: {e}"))?
            .unwrap_or(DEFAULT_SCALE_DOWN_DELAY);
        Ok(Self {
            min: count(spec.min),
            max: count(spec.max).max(count(spec.min)),
            target_utilization: spec
                .target_utilization
                .map_or(DEFAULT_TARGET_UTILIZATION, count)
                .clamp(1, 100),
            scale_down_delay,
        })
    }
}

/// What the pool carries now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Active leases on its members (draining ones included: that demand moves to the others).
    pub leases: u64,
    /// A member's lease capacity (the template's `maxLeases`).
    pub per_member: u32,
    /// Requests refused with a selector naming the pool, within the window the controller
    /// reads, made since it last grew and since it had all its members Ready.
    pub refusals: u64,
    /// Every member it asked for is active and Ready.
    pub complete: bool,
}

/// The number of members `load` wants, from `current`, before any delay.
pub fn recommend(policy: &Policy, current: u32, load: &Load) -> u32 {
    let per_member = u64::from(load.per_member);
    let by_load = if per_member == 0 {
        0
    } else {
        (load.leases * 100).div_ceil(per_member * u64::from(policy.target_utilization))
    };
    let by_refusals = if load.complete && load.refusals > 0 {
        u64::from(current) + load.refusals.div_ceil(per_member.max(1))
    } else {
        0
    };
    let mut wanted = by_load.max(by_refusals);
    if wanted > u64::from(current) {
        let step = u64::from(current.saturating_mul(2).max(current.saturating_add(MIN_STEP_UP)));
        wanted = wanted.min(step);
    }
    u32::try_from(wanted).unwrap_or(u32::MAX).clamp(policy.min, policy.max)
}

/// A run of recommendations below the current number: since when, and the highest of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowSince {
    pub since: Instant,
    pub highest: u32,
}

/// What the pool is set to now, and the low run to remember for the next look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scaled {
    pub replicas: u32,
    pub low: Option<LowSince>,
}

/// Applies `recommendation` to `current` at `now`: up (or back within `max`) at once, down only
/// after [`Policy::scale_down_delay`] of lower recommendations, to the highest of them.
pub fn scale(policy: &Policy, current: u32, recommendation: u32, low: Option<LowSince>, now: Instant) -> Scaled {
    if current > policy.max {
        return Scaled {
            replicas: policy.max,
            low: None,
        };
    }
    if recommendation >= current {
        return Scaled {
            replicas: recommendation,
            low: None,
        };
    }
    let low = low.map_or(
        LowSince {
            since: now,
            highest: recommendation,
        },
        |l| LowSince {
            since: l.since,
            highest: l.highest.max(recommendation),
        },
    );
    if now.saturating_duration_since(low.since) >= policy.scale_down_delay {
        Scaled {
            replicas: low.highest,
            low: None,
        }
    } else {
        Scaled {
            replicas: current,
            low: Some(low),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(min: u32, max: u32) -> Policy {
        Policy {
            min,
            max,
            target_utilization: 70,
            scale_down_delay: Duration::from_secs(300),
        }
    }

    fn load(leases: u64, refusals: u64, complete: bool) -> Load {
        Load {
            leases,
            per_member: 5,
            refusals,
            complete,
        }
    }

    #[test]
    fn recommendations() {
        // (what, policy, current, load, wanted)
        let rows: &[(&str, Policy, u32, Load, u32)] = &[
            ("idle: the minimum", policy(1, 10), 3, load(0, 0, true), 1),
            ("idle, min 0: zero", policy(0, 10), 3, load(0, 0, true), 0),
            ("at target: as is", policy(1, 10), 2, load(7, 0, true), 2),
            ("just over target: one more", policy(1, 10), 2, load(8, 0, true), 3),
            ("full: 100/70 of it", policy(1, 10), 4, load(20, 0, true), 6),
            ("full, small max: the max", policy(1, 5), 4, load(20, 0, true), 5),
            (
                "a huge load: doubling at most",
                policy(1, 100),
                4,
                load(1000, 0, true),
                8,
            ),
            (
                "a huge load, small pool: +4 at most",
                policy(1, 100),
                1,
                load(1000, 0, true),
                5,
            ),
            (
                "refusals: a member per maxLeases of them",
                policy(1, 10),
                2,
                load(10, 11, true),
                5,
            ),
            (
                "refusals while incomplete: load only",
                policy(1, 10),
                2,
                load(10, 11, false),
                3,
            ),
            ("at zero, one refusal wakes it", policy(0, 10), 0, load(0, 1, true), 1),
            (
                "at zero, many refusals: +4 at most",
                policy(0, 10),
                0,
                load(0, 100, true),
                4,
            ),
            ("refusals at the max: the max", policy(1, 3), 3, load(0, 50, true), 3),
            ("below the min: the min", policy(2, 10), 0, load(0, 0, true), 2),
        ];
        for (what, policy, current, load, wanted) in rows {
            assert_eq!(recommend(policy, *current, load), *wanted, "{what}");
        }
    }

    #[test]
    fn no_capacity_per_member_means_refusals_count_one_each() {
        let l = Load {
            leases: 3,
            per_member: 0,
            refusals: 2,
            complete: true,
        };
        assert_eq!(recommend(&policy(0, 10), 1, &l), 3);
    }

    #[test]
    fn up_is_at_once_and_down_waits_for_the_delay_then_takes_the_highest_low() {
        let p = policy(0, 10);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Up: at once, and it forgets any low run.
        let low = Some(LowSince { since: t0, highest: 2 });
        assert_eq!(scale(&p, 3, 5, low, at(10)), Scaled { replicas: 5, low: None });
        // Down: the run starts, and holds the current number.
        let s = scale(&p, 5, 2, None, at(0));
        assert_eq!(
            s,
            Scaled {
                replicas: 5,
                low: Some(LowSince {
                    since: at(0),
                    highest: 2
                })
            }
        );
        let s = scale(&p, 5, 3, s.low, at(100));
        assert_eq!(s.replicas, 5);
        let s = scale(&p, 5, 1, s.low, at(299));
        assert_eq!(
            s,
            Scaled {
                replicas: 5,
                low: Some(LowSince {
                    since: at(0),
                    highest: 3
                })
            }
        );
        // The delay has passed: the highest low recommendation.
        assert_eq!(scale(&p, 5, 1, s.low, at(300)), Scaled { replicas: 3, low: None });
        // A recommendation back at the current number ends the run.
        let s = scale(&p, 5, 2, None, at(0));
        let s = scale(&p, 5, 5, s.low, at(200));
        assert_eq!(s, Scaled { replicas: 5, low: None });
        let s = scale(&p, 5, 2, s.low, at(400));
        assert_eq!(s.replicas, 5, "a new run starts: {s:?}");
        // Above the max (the max was lowered): down to it at once.
        assert_eq!(
            scale(&policy(0, 4), 9, 1, None, at(0)),
            Scaled { replicas: 4, low: None }
        );
    }

    #[test]
    fn the_policy_fills_in_its_defaults() {
        let spec = PoolAutoscale {
            min: 0,
            max: 3,
            target_utilization: None,
            scale_down_delay: None,
        };
        assert_eq!(
            Policy::from_spec(&spec),
            Ok(Policy {
                min: 0,
                max: 3,
                target_utilization: DEFAULT_TARGET_UTILIZATION,
                scale_down_delay: DEFAULT_SCALE_DOWN_DELAY,
            })
        );
        let spec = PoolAutoscale {
            scale_down_delay: Some("30s".into()),
            target_utilization: Some(50),
            ..spec
        };
        let p = Policy::from_spec(&spec).unwrap();
        assert_eq!(
            (p.target_utilization, p.scale_down_delay),
            (50, Duration::from_secs(30))
        );
        let bad = PoolAutoscale {
            scale_down_delay: Some("99999999999h".into()),
            ..spec
        };
        assert!(
            Policy::from_spec(&bad)
                .unwrap_err()
                .starts_with("spec.autoscale.scaleDownDelay")
        );
    }
}
