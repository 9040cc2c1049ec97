//! The pool controller's decision for one ProxyPool, as a pure function (docs/pools.md): given
//! what the pool asks for and what its members are, the steps that bring the members closer.
//! Every step is a write to the API server (a new member Proxy, a role label, a delete); none is
//! a backend call, so promoting a standby is as fast as one label write.
//!
//! The rules, in the order they apply:
//!
//! 1. A draining member is deleted once it holds no lease (and has drained for at least
//!    [`DRAIN_SETTLE`]) or has drained for `drainTimeout`.
//! 2. A failed member (not Healthy past its thresholds, or its instance lost) is drained if
//!    active (its leases end on their own), deleted if standby (it has none).
//! 3. Too few active members: Ready standbys are promoted at once, those of the current
//!    template first; what is still missing is created.
//! 4. Too many: the surplus is drained, members that are not Ready first.
//! 5. Rollout and rotation (not while paused): an outdated active member (another template, or
//!    older than `maxAge`) is swapped for a Ready standby of the current template; with none,
//!    up to `maxSurge` extra standbys are made for the swap, and up to `maxUnavailable` outdated
//!    members may be drained before their replacement is Ready.
//! 6. Standbys: made up to `standby` (plus the surge in use); outdated ones are deleted once
//!    enough current ones are Ready; a surplus is deleted.
//!
//! The leasable count never drops below `replicas - maxUnavailable` because of a rollout, and no
//! rule but a failure or the drain timeout ends a member that holds a lease.
//!
//! While the pool may not replace failed members (too many have failed at once, or failed
//! creations in a row hold it back: [`crate::pool::remediation`]), failed members keep their
//! place and role, and no member is made: rule 2 and every create wait, and so does a rollout's
//! drain that would need one. Promotions, scale-down, deletes and drain ends go on.

use std::time::Duration;

use crate::pool::member::{Member, Role};

/// How long a draining member waits, even with no lease, before it is deleted: long enough for
/// every replica serving leases to see it is draining (the leader publishes a change of what is
/// offered within 100 ms; a replica reads that view on its next acquire), so no replica whose
/// copy still shows it active can grant a lease on a member about to go.
pub const DRAIN_SETTLE: Duration = Duration::from_secs(3);

/// What the pool asks for, with every default applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desired {
    pub replicas: u32,
    pub standby: u32,
    pub max_age: Option<Duration>,
    pub drain_timeout: Duration,
    pub max_surge: u32,
    pub max_unavailable: u32,
    pub paused: bool,
    /// The most failed members replaced at once.
    pub max_unhealthy: crate::pool::remediation::MaxUnhealthy,
    /// How long a new member's failing probes do not count against it.
    pub startup_grace: Duration,
}

/// One write the controller performs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A new member Proxy in this role, from the current template.
    Create(Role),
    /// A standby becomes active (its role label).
    Promote(String),
    /// An active member stops getting leases (its role label).
    Drain(String),
    /// The member Proxy is deleted.
    Delete(String),
}

/// The steps of one pass and when to look again at the latest (a drain that may time out, a
/// member that comes of age).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub recheck: Option<Duration>,
}

impl Plan {
    /// Looks again after `after` at the latest.
    pub fn recheck_in(&mut self, after: Duration) {
        self.recheck = Some(self.recheck.map_or(after, |r| r.min(after)));
    }
}

/// The steps that bring `members` towards `desired`. With `may_replace` false, failed members
/// stay as they are and nothing is made.
pub fn plan(desired: &Desired, members: &[Member], may_replace: bool) -> Plan {
    let mut plan = Plan::default();
    // A failed member the pool may not replace is kept where it is, as any other member.
    let replaced = |m: &Member| m.failed && may_replace;
    let outdated = |m: &Member| !desired.paused && (!m.current || desired.max_age.is_some_and(|a| m.age >= a));

    // 1 and 2: members on their way out.
    for m in members {
        match m.role {
            Role::Draining
                if m.draining_for >= desired.drain_timeout || (m.leases == 0 && m.draining_for >= DRAIN_SETTLE) =>
            {
                plan.steps.push(Step::Delete(m.name.clone()));
            }
            Role::Draining if m.leases == 0 => plan.recheck_in(DRAIN_SETTLE - m.draining_for),
            Role::Draining => plan.recheck_in(desired.drain_timeout - m.draining_for),
            Role::Active if replaced(m) => plan.steps.push(Step::Drain(m.name.clone())),
            Role::Standby if replaced(m) => plan.steps.push(Step::Delete(m.name.clone())),
            Role::Active | Role::Standby => {}
        }
    }
    let mut actives: Vec<&Member> = members
        .iter()
        .filter(|m| m.role == Role::Active && !replaced(m))
        .collect();
    let mut standbys: Vec<&Member> = members
        .iter()
        .filter(|m| m.role == Role::Standby && !replaced(m))
        .collect();
    // Best standby to promote first: Ready, then of the current template, then the youngest.
    standbys.sort_by_key(|m| (!m.ready, outdated(m), m.age));
    let replicas = desired.replicas as usize;

    // 3: too few active members.
    while actives.len() < replicas && standbys.first().is_some_and(|s| s.ready) {
        let s = standbys.remove(0);
        plan.steps.push(Step::Promote(s.name.clone()));
        actives.push(s);
    }
    if may_replace {
        for _ in actives.len()..replicas {
            plan.steps.push(Step::Create(Role::Active));
        }
    }

    // 4: too many. Not Ready first, then outdated, then the fewest leases, then the oldest.
    actives.sort_by_key(|m| (m.ready, !outdated(m), m.leases, std::cmp::Reverse(m.age)));
    while actives.len() > replicas {
        let m = actives.remove(0);
        plan.steps.push(Step::Drain(m.name.clone()));
    }

    // 5: rollout and rotation.
    let unswapped = roll(&mut plan, desired, &actives, &mut standbys, &outdated, may_replace);

    // 6: standbys.
    keep_standbys(&mut plan, desired, &standbys, unswapped, &outdated, may_replace);

    // Rotation: look again when the youngest member still in date comes of age.
    if let Some(max_age) = desired.max_age.filter(|_| !desired.paused) {
        let next = members
            .iter()
            .filter(|m| m.role != Role::Draining && m.age < max_age)
            .map(|m| max_age - m.age)
            .min();
        if let Some(next) = next {
            plan.recheck_in(next);
        }
    }
    plan
}

/// Rule 6: current standbys up to `standby` plus the surge `unswapped` outdated members need
/// (made only when `may_replace`), a surplus deleted, not Ready first, then the oldest, and
/// outdated ones deleted once enough current ones are Ready.
fn keep_standbys(
    plan: &mut Plan,
    desired: &Desired,
    standbys: &[&Member],
    unswapped: usize,
    outdated: &impl Fn(&Member) -> bool,
    may_replace: bool,
) {
    let current: Vec<&Member> = standbys.iter().copied().filter(|m| !outdated(m)).collect();
    let stale: Vec<&Member> = standbys.iter().copied().filter(|m| outdated(m)).collect();
    let surge = unswapped.min(desired.max_surge as usize);
    let wanted = desired.standby as usize + surge;
    if may_replace {
        for _ in current.len()..wanted {
            plan.steps.push(Step::Create(Role::Standby));
        }
    }
    let mut current = current;
    // Surplus: not Ready first, then the oldest.
    current.sort_by_key(|m| (m.ready, std::cmp::Reverse(m.age)));
    while current.len() > wanted {
        let m = current.remove(0);
        plan.steps.push(Step::Delete(m.name.clone()));
    }
    let ready_current = current.iter().filter(|m| m.ready).count();
    if ready_current >= desired.standby as usize {
        for m in stale {
            plan.steps.push(Step::Delete(m.name.clone()));
        }
    }
}

/// Rule 5, rollout and rotation of the `actives` that are `outdated`, the ones not Ready first,
/// then the oldest: each is swapped for a Ready standby of the current template (taken from
/// `standbys`), or drained and made again while that leaves `replicas - maxUnavailable`
/// leasable. Returns how many wait for a surge standby.
fn roll<'a>(
    plan: &mut Plan,
    desired: &Desired,
    actives: &[&'a Member],
    standbys: &mut Vec<&'a Member>,
    outdated: &impl Fn(&Member) -> bool,
    may_replace: bool,
) -> usize {
    let mut to_replace: Vec<&Member> = actives.iter().copied().filter(|m| outdated(m)).collect();
    to_replace.sort_by_key(|m| (m.ready, std::cmp::Reverse(m.age)));
    let mut ready_actives = actives.iter().filter(|m| m.ready).count();
    let floor = (desired.replicas as usize).saturating_sub(desired.max_unavailable as usize);
    let mut unswapped = 0;
    for old in to_replace {
        let spare = standbys.iter().position(|s| s.ready && !outdated(s));
        if let Some(i) = spare {
            let new = standbys.remove(i);
            plan.steps.push(Step::Promote(new.name.clone()));
            plan.steps.push(Step::Drain(old.name.clone()));
        } else if may_replace && (!old.ready || ready_actives > floor) {
            // Draining it leaves at least the floor leasable; its replacement is made now.
            ready_actives -= usize::from(old.ready);
            plan.steps.push(Step::Drain(old.name.clone()));
            plan.steps.push(Step::Create(Role::Active));
        } else {
            unswapped += 1;
        }
    }
    unswapped
}
