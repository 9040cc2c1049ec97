//! The pool controller's decision, row by row (docs/pools.md): each row is a pool's members and
//! what it asks for, and the steps the decision must answer, in order.

use std::time::Duration;

use egress_controller::pool::decide::{DRAIN_SETTLE, Desired, Plan, Step, plan};
use egress_controller::pool::member::{Member, Role};
use egress_controller::pool::remediation::MaxUnhealthy;

const MIN: Duration = Duration::from_secs(60);

fn desired(replicas: u32, standby: u32) -> Desired {
    Desired {
        replicas,
        standby,
        max_age: None,
        drain_timeout: 10 * MIN,
        max_surge: 1,
        max_unavailable: 0,
        paused: false,
        max_unhealthy: MaxUnhealthy::Percent(40),
        startup_grace: 5 * MIN,
    }
}

/// A Ready member of the current template, ten minutes old, with no lease.
fn member(name: &str, role: Role) -> Member {
    Member {
        name: name.into(),
        role,
        current: true,
        age: 10 * MIN,
        ready: true,
        failed: false,
        exit_refused: false,
        leases: 0,
        draining_for: Duration::ZERO,
    }
}

fn active(name: &str) -> Member {
    member(name, Role::Active)
}

fn standby(name: &str) -> Member {
    member(name, Role::Standby)
}

fn steps(p: &Plan) -> Vec<Step> {
    p.steps.clone()
}

fn promote(n: &str) -> Step {
    Step::Promote(n.into())
}
fn drain(n: &str) -> Step {
    Step::Drain(n.into())
}
fn delete(n: &str) -> Step {
    Step::Delete(n.into())
}

#[test]
fn an_empty_pool_makes_its_actives_and_standbys() {
    let p = plan(&desired(2, 1), &[], true);
    assert_eq!(
        steps(&p),
        [
            Step::Create(Role::Active),
            Step::Create(Role::Active),
            Step::Create(Role::Standby)
        ]
    );
    assert_eq!(p.recheck, None);
}

#[test]
fn a_pool_as_asked_does_nothing() {
    let p = plan(&desired(2, 1), &[active("a"), active("b"), standby("s")], true);
    assert_eq!(steps(&p), []);
}

#[test]
fn a_failed_member_is_drained_and_a_ready_standby_promoted_in_the_same_pass() {
    let failed = Member {
        failed: true,
        leases: 2,
        ..active("a")
    };
    let p = plan(&desired(2, 1), &[failed, active("b"), standby("s")], true);
    // The promotion needs no backend call; the new standby is made behind it.
    assert_eq!(steps(&p), [drain("a"), promote("s"), Step::Create(Role::Standby)]);
}

#[test]
fn with_no_ready_standby_a_failed_member_is_replaced_by_a_create() {
    let booting = Member {
        ready: false,
        ..standby("s")
    };
    let failed = Member {
        failed: true,
        ..active("a")
    };
    let p = plan(&desired(1, 1), &[failed, booting], true);
    assert_eq!(steps(&p), [drain("a"), Step::Create(Role::Active)]);
}

#[test]
fn a_failed_standby_is_deleted_and_made_again() {
    let failed = Member {
        failed: true,
        ..standby("s")
    };
    let p = plan(&desired(1, 1), &[active("a"), failed], true);
    assert_eq!(steps(&p), [delete("s"), Step::Create(Role::Standby)]);
}

#[test]
fn a_draining_member_goes_when_its_leases_end_or_its_time_is_up() {
    let holding = Member {
        role: Role::Draining,
        leases: 1,
        draining_for: 4 * MIN,
        ..active("d1")
    };
    let empty = Member {
        role: Role::Draining,
        leases: 0,
        draining_for: Duration::from_secs(5),
        ..active("d2")
    };
    let overdue = Member {
        role: Role::Draining,
        leases: 3,
        draining_for: 10 * MIN,
        ..active("d3")
    };
    let p = plan(&desired(1, 0), &[active("a"), holding.clone(), empty, overdue], true);
    assert_eq!(steps(&p), [delete("d2"), delete("d3")]);
    assert_eq!(p.recheck, Some(6 * MIN), "when d1's drain times out");
    // Just drained, and no lease: it waits until every replica can have seen it draining.
    let fresh = Member {
        role: Role::Draining,
        leases: 0,
        draining_for: Duration::from_secs(1),
        ..active("d4")
    };
    let p = plan(&desired(1, 0), &[active("a"), holding, fresh], true);
    assert_eq!(steps(&p), []);
    assert_eq!(p.recheck, Some(DRAIN_SETTLE - Duration::from_secs(1)));
}

#[test]
fn scaling_down_drains_members_that_are_not_ready_first_then_the_least_leased() {
    let booting = Member {
        ready: false,
        ..active("c")
    };
    let busy = Member {
        leases: 4,
        ..active("a")
    };
    let idle = Member {
        leases: 1,
        ..active("b")
    };
    let p = plan(&desired(1, 0), &[busy, idle, booting], true);
    assert_eq!(steps(&p), [drain("c"), drain("b")]);
}

#[test]
fn scaling_down_standbys_deletes_them() {
    let p = plan(&desired(1, 0), &[active("a"), standby("s")], true);
    assert_eq!(steps(&p), [delete("s")]);
}

#[test]
fn a_template_change_swaps_a_ready_current_standby_for_an_outdated_member() {
    let old = Member {
        current: false,
        leases: 2,
        ..active("a")
    };
    let p = plan(&desired(1, 1), &[old, standby("s")], true);
    // Capacity never drops: the swap, then a new standby behind it.
    assert_eq!(steps(&p), [promote("s"), drain("a"), Step::Create(Role::Standby)]);
}

#[test]
fn with_no_spare_standby_a_rollout_surges_and_waits_for_it() {
    let old = |n: &str| Member {
        current: false,
        ..active(n)
    };
    // maxSurge 1, maxUnavailable 0: one extra standby, nothing drained yet.
    let p = plan(&desired(2, 0), &[old("a"), old("b")], true);
    assert_eq!(steps(&p), [Step::Create(Role::Standby)]);
    // The surge standby is booting: nothing more.
    let booting = Member {
        ready: false,
        ..standby("s")
    };
    let p = plan(&desired(2, 0), &[old("a"), old("b"), booting], true);
    assert_eq!(steps(&p), []);
    // Ready: swapped for the oldest outdated member; the next surge is made.
    let older = Member {
        age: 20 * MIN,
        ..old("b")
    };
    let p = plan(&desired(2, 0), &[old("a"), older, standby("s")], true);
    assert_eq!(steps(&p), [promote("s"), drain("b"), Step::Create(Role::Standby)]);
}

#[test]
fn max_unavailable_lets_a_rollout_drain_before_the_replacement_is_ready() {
    let old = |n: &str| Member {
        current: false,
        ..active(n)
    };
    let d = Desired {
        max_unavailable: 1,
        max_surge: 0,
        ..desired(3, 0)
    };
    let p = plan(&d, &[old("a"), old("b"), old("c")], true);
    assert_eq!(steps(&p), [drain("a"), Step::Create(Role::Active)]);
}

#[test]
fn max_age_rotates_members_as_a_template_change_does_and_says_when_to_look_again() {
    let d = Desired {
        max_age: Some(60 * MIN),
        ..desired(1, 1)
    };
    let aged = Member {
        age: 61 * MIN,
        ..active("a")
    };
    let young = Member {
        age: 5 * MIN,
        ..standby("s")
    };
    let p = plan(&d, &[aged, young], true);
    assert_eq!(steps(&p), [promote("s"), drain("a"), Step::Create(Role::Standby)]);
    assert_eq!(p.recheck, Some(55 * MIN), "when the standby comes of age");
}

#[test]
fn a_paused_pool_rolls_nothing_but_still_replaces_a_failed_member() {
    let d = Desired {
        paused: true,
        max_age: Some(MIN),
        ..desired(1, 1)
    };
    let old = Member {
        current: false,
        ..active("a")
    };
    assert_eq!(steps(&plan(&d, &[old.clone(), standby("s")], true)), []);
    let failed = Member { failed: true, ..old };
    assert_eq!(
        steps(&plan(&d, &[failed, standby("s")], true)),
        [drain("a"), promote("s"), Step::Create(Role::Standby)]
    );
}

#[test]
fn an_outdated_standby_goes_once_a_current_one_is_ready() {
    let stale = Member {
        current: false,
        ..standby("old")
    };
    let booting = Member {
        ready: false,
        ..standby("new")
    };
    // The new one is not Ready yet: the stale one stays, as the only spare.
    assert_eq!(
        steps(&plan(&desired(1, 1), &[active("a"), stale.clone(), booting], true)),
        []
    );
    assert_eq!(
        steps(&plan(&desired(1, 1), &[active("a"), stale, standby("new")], true)),
        [delete("old")]
    );
}

fn failed(m: Member) -> Member {
    Member {
        failed: true,
        ready: false,
        ..m
    }
}

#[test]
fn while_replacement_is_held_failed_members_keep_their_place_and_nothing_is_made() {
    let members = [failed(active("a")), active("b"), failed(standby("s"))];
    assert_eq!(steps(&plan(&desired(2, 1), &members, false)), []);
    // Allowed, the same pool replaces both.
    assert_eq!(
        steps(&plan(&desired(2, 1), &members, true)),
        [
            drain("a"),
            delete("s"),
            Step::Create(Role::Active),
            Step::Create(Role::Standby)
        ]
    );
}

#[test]
fn while_replacement_is_held_the_pool_does_not_grow_but_promotes_and_shrinks() {
    // Scaling up: a Ready standby is promoted (one label write), nothing is made.
    assert_eq!(
        steps(&plan(&desired(3, 1), &[active("a"), active("b"), standby("s")], false)),
        [promote("s")]
    );
    // Scaling down: the failed member goes first.
    assert_eq!(
        steps(&plan(&desired(1, 0), &[active("a"), failed(active("b"))], false)),
        [drain("b")]
    );
    // Deleting the pool (nothing asked for): every member goes.
    let gone = Desired {
        paused: true,
        ..desired(0, 0)
    };
    assert_eq!(
        steps(&plan(&gone, &[failed(active("a")), failed(standby("s"))], false)),
        [drain("a"), delete("s")]
    );
}

#[test]
fn while_replacement_is_held_a_rollout_only_swaps_for_ready_standbys() {
    let old = |n: &str| Member {
        current: false,
        ..active(n)
    };
    // No spare: the outdated failed member would be drained and made again; held, it stays.
    assert_eq!(steps(&plan(&desired(1, 0), &[failed(old("a"))], false)), []);
    // A Ready standby of the current template: the swap needs no new member.
    assert_eq!(
        steps(&plan(&desired(1, 1), &[old("a"), standby("s")], false)),
        [promote("s"), drain("a")]
    );
}
