//! When a pool may replace its failed members (docs/pools.md#when-failures-are-widespread), as
//! pure functions: a new member's startup grace, the share of failed members against
//! `maxUnhealthy`, and the backoff that failed creations in a row put on the next replacement.
//!
//! Replacing a member fixes a failure that is the member's. When most members fail at once the
//! cause is elsewhere (the probe target, the network, the provider), and replacing them only
//! creates and deletes instances in a loop. So a pool replaces failed members only while they
//! are few, judges a new member only after its grace, and slows down when the members it makes
//! never become Ready.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::pool::member::{Member, Role};

/// `maxUnhealthy` when the pool does not say: Cluster API's MachineHealthCheck documents 40 %
/// as the usual setting, and it keeps a pool of 5 + 1 replacing up to 2 members at once.
pub const DEFAULT_MAX_UNHEALTHY: MaxUnhealthy = MaxUnhealthy::Percent(40);
/// `startupGrace` when the pool does not say: long enough for a VM's cloud-init to install and
/// start its proxy (Compute Engine's managed instance groups use the same default delay
/// before they judge a new instance).
pub const DEFAULT_STARTUP_GRACE: Duration = Duration::from_secs(5 * 60);
/// The wait after the first failed creation; each further one in a row doubles it.
pub const BACKOFF_BASE: Duration = Duration::from_secs(30);
/// The longest wait between two replacements, however many creations failed.
pub const BACKOFF_CAP: Duration = Duration::from_secs(15 * 60);

/// `maxUnhealthy`: a count, or a percentage of the members that are not draining.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxUnhealthy {
    Count(u32),
    Percent(u32),
}

impl MaxUnhealthy {
    /// The spec's value (`2` or `"40%"`), or why it is not one.
    ///
    /// # Errors
    /// A negative count, or text that is not a whole percentage from 0 to 100.
    pub fn parse(value: &egress_api::IntOrString) -> Result<Self, String> {
        use egress_api::IntOrString;
        match value {
            IntOrString::Int(n) => u32::try_from(*n)
                .map(Self::Count)
                .map_err(|_| format!("spec.maxUnhealthy: {n} is below 0")),
            IntOrString::String(text) => text
                .strip_suffix('%')
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| *n <= 100)
                .map(Self::Percent)
                .ok_or_else(|| {
                    format!("spec.maxUnhealthy: {text:?} is neither a count nor a percentage from 0% to 100%")
                }),
        }
    }

    /// The most failed members replaced among `members`. A percentage is rounded down but
    /// gives at least 1 (0 % excepted), so a small pool still replaces a lone failure.
    pub fn allowed(self, members: usize) -> usize {
        match self {
            Self::Count(n) => n as usize,
            Self::Percent(0) => 0,
            Self::Percent(p) => (members * p as usize / 100).max(1),
        }
    }
}

impl std::fmt::Display for MaxUnhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// A member's health as the pool judges it, from what its Proxy shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judged {
    /// Replaced if the pool may: lost, failed for good, or failing its probes once proven or
    /// past its grace.
    pub failed: bool,
    /// Failing its probes but still within its grace: not failed yet.
    pub in_grace: bool,
}

/// What a member's Proxy shows, as [`judge`] needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Health {
    /// Its instance is lost, or it failed for good: no grace helps.
    pub broken: bool,
    /// Its phase is `Unhealthy`: it is failing its probes.
    pub failing_probes: bool,
    /// It has been Ready since the pool (this leader) has watched it.
    pub proven: bool,
    /// How long its instance has run (since `Provisioned` turned True).
    pub running_for: Duration,
}

/// Whether a member has failed: a member failing its probes is judged only once it has been
/// Ready, or once its grace has passed since its instance first ran.
pub fn judge(health: Health, grace: Duration) -> Judged {
    let judged_now = health.proven || health.running_for >= grace;
    Judged {
        failed: health.broken || (health.failing_probes && judged_now),
        in_grace: health.failing_probes && !judged_now && !health.broken,
    }
}

/// The failed members against `maxUnhealthy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// Members that are not draining and have failed.
    pub failed: usize,
    /// Members that are not draining.
    pub members: usize,
    /// The most failed members that are replaced.
    pub allowed: usize,
}

impl Share {
    /// Whether too many have failed for any to be replaced.
    pub fn exceeded(&self) -> bool {
        self.failed > self.allowed
    }
}

/// The pool's failed share.
pub fn share(max: MaxUnhealthy, members: &[Member]) -> Share {
    let live: Vec<&Member> = members.iter().filter(|m| m.role != Role::Draining).collect();
    Share {
        failed: live.iter().filter(|m| m.failed).count(),
        members: live.len(),
        allowed: max.allowed(live.len()),
    }
}

/// How long the next replacement waits after `failed_creations` failed creations in a row:
/// [`BACKOFF_BASE`] doubled for each after the first, at most [`BACKOFF_CAP`]; none before any.
pub fn delay(failed_creations: u32) -> Duration {
    if failed_creations == 0 {
        return Duration::ZERO;
    }
    let doublings = (failed_creations - 1).min(16);
    BACKOFF_BASE.saturating_mul(1 << doublings).min(BACKOFF_CAP)
}

/// The pool's failed creations in a row and the replacement they hold back (kept in its
/// status, so a new leader goes on from them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    pub failed_creations: u32,
    /// No member is made before this.
    pub not_before: Option<Timestamp>,
}

impl Backoff {
    /// The backoff after a pass that saw `newly_failed` members fail without ever being Ready
    /// and `newly_ready` members become Ready, at `now`. A member that becomes Ready ends the
    /// run; each new failed creation lengthens the wait, counted from now.
    #[must_use]
    pub fn after(self, newly_failed: u32, newly_ready: bool, now: Timestamp) -> Self {
        if newly_ready {
            return Self::default();
        }
        if newly_failed == 0 {
            return self;
        }
        let failed_creations = self.failed_creations.saturating_add(newly_failed);
        let wait = delay(failed_creations);
        Self {
            failed_creations,
            not_before: now.checked_add(wait).ok().or(Some(now)),
        }
    }

    /// How long replacements still wait at `now` (none when they need not).
    pub fn remaining(&self, now: Timestamp) -> Option<Duration> {
        wait_until(self.not_before, now)
    }
}

/// How long from `now` until `until`, none when it has passed.
fn wait_until(until: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    Duration::try_from(now.duration_until(until?))
        .ok()
        .filter(|d| !d.is_zero())
}

/// What a pool's controller remembers of its members' health between passes: which have been
/// Ready (a proven member's failing probes count at once), which failed creations it counted
/// (each counts once), and the backoff they make.
#[derive(Clone, Debug, Default)]
pub struct Watch {
    proven: std::collections::HashSet<String>,
    counted: std::collections::HashSet<String>,
    backoff: Backoff,
    /// Set by the first [`Watch::observe`]: what is seen then happened before this watch.
    looked: bool,
    /// The last gate found too many members failed.
    stopped: bool,
    /// Until when members recover from a widespread failure that ended.
    recovered_by: Option<Timestamp>,
}

/// One member as [`Watch::observe`] needs it.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    pub name: &'a str,
    pub ready: bool,
    /// Failed (judged) without ever having been Ready, or with its exit refused (a failed
    /// creation unless it was once offered), and not draining.
    pub failed_creation: bool,
}

impl<'a> Observed<'a> {
    /// The member `m` as judged, with what its Proxy showed (`h`).
    pub fn of(m: &'a Member, h: &Health) -> Self {
        Self {
            name: &m.name,
            ready: m.ready,
            failed_creation: m.failed && (!h.proven || m.exit_refused) && m.role != Role::Draining,
        }
    }
}

impl Watch {
    /// A watch that goes on from `backoff`, and from a widespread failure when `stopped` (a new
    /// leader's, from the pool's status).
    pub fn resuming(backoff: Backoff, stopped: bool) -> Self {
        Self {
            backoff,
            stopped,
            ..Self::default()
        }
    }

    /// The gate for a pass with this `share`: when a widespread failure ends, the members it hit
    /// get `grace` more to recover, as new members get it to start.
    pub fn gate(&mut self, share: Share, grace: Duration, now: Timestamp) -> Gate {
        let stopped = share.exceeded();
        if std::mem::replace(&mut self.stopped, stopped) && !stopped {
            self.recovered_by = now.checked_add(grace).ok();
        }
        Gate::of(share, self.recovered_by, &self.backoff, now)
    }

    /// Whether `name` has been seen Ready.
    pub fn proven(&self, name: &str) -> bool {
        self.proven.contains(name)
    }

    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// Notes a pass's `members` at `now`: a member newly Ready ends the backoff's run; each
    /// newly failed creation lengthens it. Returns the names of those, sorted. On its first
    /// look a watch counts nothing: what it finds then happened before it (and was counted, if
    /// at all, by the leader before).
    pub fn observe(&mut self, members: &[Observed<'_>], now: Timestamp) -> Vec<String> {
        let first = !std::mem::replace(&mut self.looked, true);
        let mut newly_ready = false;
        let mut never_ready = Vec::new();
        for m in members {
            if m.ready && self.proven.insert(m.name.to_owned()) {
                newly_ready |= !first;
            }
            // A member once offered and refused later (another Proxy came to share its exit)
            // was no failed creation: replacing it is no reason to wait.
            let once_offered = self.proven.contains(m.name);
            if m.failed_creation && !once_offered && self.counted.insert(m.name.to_owned()) && !first {
                never_ready.push(m.name.to_owned());
            }
        }
        let names: std::collections::HashSet<&str> = members.iter().map(|m| m.name).collect();
        self.proven.retain(|n| names.contains(n.as_str()));
        self.counted.retain(|n| names.contains(n.as_str()));
        let count = u32::try_from(never_ready.len()).unwrap_or(u32::MAX);
        self.backoff = self.backoff.after(count, newly_ready, now);
        never_ready.sort();
        never_ready
    }
}

/// Whether the pool may replace failed members and grow in this pass, and why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Allowed(Share),
    /// More members have failed than `maxUnhealthy` allows.
    TooManyUnhealthy(Share),
    /// A widespread failure ended lately: the members it hit recover for this long more before
    /// any is replaced (they pass their probes one after another, and the last few would
    /// otherwise be replaced as the share drops under `maxUnhealthy`).
    Recovering {
        share: Share,
        wait: Duration,
    },
    /// Failed creations in a row hold the next one back for this long.
    BackingOff {
        share: Share,
        wait: Duration,
    },
}

impl Gate {
    /// The gate for a pass: the share first (a widespread failure holds for as long as it
    /// lasts), then the recovery after one (until `recovered_by`), then the backoff.
    pub fn of(share: Share, recovered_by: Option<Timestamp>, backoff: &Backoff, now: Timestamp) -> Self {
        if share.exceeded() {
            return Self::TooManyUnhealthy(share);
        }
        if let Some(wait) = wait_until(recovered_by, now) {
            return Self::Recovering { share, wait };
        }
        match backoff.remaining(now) {
            Some(wait) => Self::BackingOff { share, wait },
            None => Self::Allowed(share),
        }
    }

    /// How long until the gate may open by itself (a recovery or a backoff ending).
    pub fn wait(&self) -> Option<Duration> {
        match self {
            Self::Recovering { wait, .. } | Self::BackingOff { wait, .. } => Some(*wait),
            Self::Allowed(_) | Self::TooManyUnhealthy(_) => None,
        }
    }

    /// Whether the plan may make members and replace failed ones.
    pub fn allows(&self) -> bool {
        matches!(self, Self::Allowed(_))
    }

    pub fn share(&self) -> Share {
        match self {
            Self::Allowed(s)
            | Self::TooManyUnhealthy(s)
            | Self::Recovering { share: s, .. }
            | Self::BackingOff { share: s, .. } => *s,
        }
    }
}

/// When the soonest member failing its probes within its grace comes to be judged.
pub fn next_judgement(members: &[Health], grace: Duration) -> Option<Duration> {
    members
        .iter()
        .filter(|h| judge(**h, grace).in_grace)
        .map(|h| grace.saturating_sub(h.running_for))
        .min()
}

/// The condition type that says whether failed members are replaced.
pub const CONDITION: &str = "RemediationAllowed";

/// The `RemediationAllowed` condition for `gate`: its status, reason and message.
pub fn condition(
    gate: &Gate,
    max: MaxUnhealthy,
    backoff: &Backoff,
    grace: Duration,
) -> (egress_api::ConditionStatus, &'static str, String) {
    use egress_api::ConditionStatus::{False, True};
    let s = gate.share();
    match gate {
        Gate::Allowed(_) => (
            True,
            "WithinMaxUnhealthy",
            format!(
                "{} of {} members failed; up to {} are replaced (maxUnhealthy {max})",
                s.failed, s.members, s.allowed
            ),
        ),
        Gate::TooManyUnhealthy(_) => (
            False,
            "TooManyUnhealthy",
            format!(
                "{} of {} members failed, more than maxUnhealthy {max} allows ({}): failed members are kept and no member is made until enough recover",
                s.failed, s.members, s.allowed
            ),
        ),
        Gate::Recovering { wait, .. } => (
            False,
            "Recovering",
            format!(
                "{} of {} members failed; after a widespread failure, members have startupGrace {}s to recover before any is replaced",
                s.failed,
                s.members,
                grace.as_secs().max(wait.as_secs())
            ),
        ),
        Gate::BackingOff { .. } => (
            False,
            "BackingOff",
            format!(
                "{} members in a row never became Ready within startupGrace {}s; no member is made before {}",
                backoff.failed_creations,
                grace.as_secs(),
                backoff.not_before.map(|t| t.to_string()).unwrap_or_default()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::IntOrString;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn max_unhealthy_reads_counts_and_percentages() {
        let parse = |v: IntOrString| MaxUnhealthy::parse(&v);
        assert_eq!(parse(IntOrString::Int(2)), Ok(MaxUnhealthy::Count(2)));
        assert_eq!(parse(IntOrString::String("40%".into())), Ok(MaxUnhealthy::Percent(40)));
        assert_eq!(
            parse(IntOrString::String("100%".into())),
            Ok(MaxUnhealthy::Percent(100))
        );
        for bad in ["101%", "40", "-1%", "%", "4 0%"] {
            assert!(parse(IntOrString::String(bad.into())).is_err(), "{bad}");
        }
        assert_eq!(
            parse(IntOrString::Int(-1)).unwrap_err(),
            "spec.maxUnhealthy: -1 is below 0"
        );
    }

    #[test]
    fn a_percentage_rounds_down_but_replaces_a_lone_failure() {
        // (maxUnhealthy, members not draining, failed members replaced at most)
        let rows = [
            (MaxUnhealthy::Percent(40), 6, 2),
            (MaxUnhealthy::Percent(40), 5, 2),
            (MaxUnhealthy::Percent(40), 2, 1),
            (MaxUnhealthy::Percent(40), 1, 1),
            (MaxUnhealthy::Percent(40), 0, 1),
            (MaxUnhealthy::Percent(100), 7, 7),
            (MaxUnhealthy::Percent(0), 7, 0),
            (MaxUnhealthy::Count(3), 7, 3),
            (MaxUnhealthy::Count(0), 7, 0),
        ];
        for (max, members, allowed) in rows {
            assert_eq!(max.allowed(members), allowed, "{max} of {members}");
        }
    }

    #[test]
    fn a_member_failing_its_probes_is_judged_once_proven_or_past_its_grace() {
        let grace = 5 * MIN;
        let health = |broken, failing_probes, proven, running_for| Health {
            broken,
            failing_probes,
            proven,
            running_for,
        };
        // (what it shows, judged failed, in its grace)
        let rows = [
            (health(false, false, false, MIN), false, false),
            (health(false, true, false, MIN), false, true),
            (health(false, true, false, grace), true, false),
            (health(false, true, true, MIN), true, false),
            (health(true, false, false, Duration::ZERO), true, false),
            (health(true, true, false, MIN), true, false),
        ];
        for (h, failed, in_grace) in rows {
            assert_eq!(judge(h, grace), Judged { failed, in_grace }, "{h:?}");
        }
    }

    #[test]
    fn the_backoff_doubles_from_the_second_failure_and_stops_at_its_cap() {
        let secs = |n: u32| delay(n).as_secs();
        assert_eq!(
            (0..=7).map(secs).collect::<Vec<_>>(),
            [0, 30, 60, 120, 240, 480, 900, 900]
        );
        assert_eq!(delay(u32::MAX), BACKOFF_CAP);
    }

    #[test]
    fn failed_creations_hold_replacements_until_a_member_becomes_ready() {
        let t0 = Timestamp::UNIX_EPOCH;
        let at = |secs: i64| Timestamp::from_second(secs).unwrap();
        let b = Backoff::default().after(0, false, t0);
        assert_eq!(b, Backoff::default());
        let b = b.after(1, false, t0);
        assert_eq!((b.failed_creations, b.not_before), (1, Some(at(30))));
        assert_eq!(b.remaining(at(10)), Some(Duration::from_secs(20)));
        assert_eq!(b.remaining(at(30)), None);
        // Counted from the later failure, and longer.
        let b = b.after(1, false, at(100));
        assert_eq!((b.failed_creations, b.not_before), (2, Some(at(160))));
        // A pass that sees nothing new keeps it.
        assert_eq!(b.after(0, false, at(120)), b);
        // A member that becomes Ready ends the run.
        assert_eq!(b.after(1, true, at(120)), Backoff::default());
    }

    #[test]
    fn members_in_their_grace_are_looked_at_again_when_it_ends() {
        let grace = 5 * MIN;
        let health = |failing_probes, running_for| Health {
            broken: false,
            failing_probes,
            proven: false,
            running_for,
        };
        let members = [
            health(true, 2 * MIN),
            health(true, MIN),
            health(false, 4 * MIN),
            health(true, 9 * MIN),
        ];
        assert_eq!(next_judgement(&members, grace), Some(3 * MIN));
        assert_eq!(next_judgement(&members[2..], grace), None);
    }

    #[test]
    fn the_condition_gives_the_counts_and_the_time_of_the_next_member() {
        use egress_api::ConditionStatus;
        let now = Timestamp::UNIX_EPOCH;
        let share = Share {
            failed: 6,
            members: 6,
            allowed: 2,
        };
        let max = MaxUnhealthy::Percent(40);
        let none = Backoff::default();
        let (status, reason, message) = condition(&Gate::of(share, None, &none, now), max, &none, MIN);
        assert_eq!((status, reason), (ConditionStatus::False, "TooManyUnhealthy"));
        assert_eq!(
            message,
            "6 of 6 members failed, more than maxUnhealthy 40% allows (2): failed members are kept and no member is made until enough recover"
        );
        let few = Share { failed: 1, ..share };
        let (status, reason, message) = condition(&Gate::of(few, None, &none, now), max, &none, MIN);
        assert_eq!((status, reason), (ConditionStatus::True, "WithinMaxUnhealthy"));
        assert_eq!(
            message,
            "1 of 6 members failed; up to 2 are replaced (maxUnhealthy 40%)"
        );
        let waiting = none.after(2, false, now);
        let (status, reason, message) = condition(&Gate::of(few, None, &waiting, now), max, &waiting, MIN);
        assert_eq!((status, reason), (ConditionStatus::False, "BackingOff"));
        assert_eq!(
            message,
            "2 members in a row never became Ready within startupGrace 60s; no member is made before 1970-01-01T00:01:00Z"
        );
    }

    #[test]
    fn a_watch_counts_each_failed_creation_once_and_a_new_ready_member_resets_it() {
        let at = |secs: i64| Timestamp::from_second(secs).unwrap();
        let seen = |name, ready, failed_creation| Observed {
            name,
            ready,
            failed_creation,
        };
        // A new leader finds one member failed and one Ready: neither counts.
        let mut w = Watch::resuming(Backoff::default(), false);
        let counted = w.observe(&[seen("old", false, true), seen("ok", true, false)], at(0));
        assert_eq!((counted.len(), w.backoff().failed_creations), (0, 0));
        assert!(w.proven("ok"));
        // A new member fails without being Ready: one, and only once.
        assert_eq!(
            w.observe(&[seen("ok", true, false), seen("new", false, true)], at(10)),
            ["new"]
        );
        assert_eq!(
            w.observe(&[seen("ok", true, false), seen("new", false, true)], at(20)),
            Vec::<String>::new()
        );
        assert_eq!(w.backoff().failed_creations, 1);
        assert_eq!(w.backoff().not_before, Some(at(10 + 30)));
        // Two more at once.
        let counted = w.observe(&[seen("a", false, true), seen("b", false, true)], at(50));
        assert_eq!(
            (counted, w.backoff().failed_creations),
            (vec!["a".to_owned(), "b".to_owned()], 3)
        );
        // Members that are gone are forgotten; one that turns Ready ends the run.
        assert!(!w.proven("ok"));
        w.observe(&[seen("c", true, false)], at(60));
        assert_eq!(w.backoff(), Backoff::default());
    }

    #[test]
    fn a_refused_exit_is_a_failed_creation_unless_the_member_was_offered_before() {
        let at = |secs: i64| Timestamp::from_second(secs).unwrap();
        let m = |name: &str, ready, exit_refused| Member {
            name: name.into(),
            role: Role::Active,
            current: true,
            age: MIN,
            ready,
            failed: exit_refused,
            exit_refused,
            leases: 0,
            draining_for: Duration::ZERO,
        };
        // Running and passing its probes (so proven to its health), but never offered.
        let proven = Health {
            broken: false,
            failing_probes: false,
            proven: true,
            running_for: MIN,
        };
        let mut w = Watch::default();
        w.observe(&[], at(0));
        let (fresh, veteran) = (m("fresh", false, true), m("veteran", true, false));
        w.observe(&[Observed::of(&veteran, &proven)], at(5));
        let counted = w.observe(
            &[Observed::of(&fresh, &proven), Observed::of(&veteran, &proven)],
            at(10),
        );
        assert_eq!((counted, w.backoff().failed_creations), (vec!["fresh".to_owned()], 1));
        // The veteran, offered before, is refused later: replaced, but no failed creation.
        let refused = m("veteran", false, true);
        let counted = w.observe(
            &[Observed::of(&fresh, &proven), Observed::of(&refused, &proven)],
            at(20),
        );
        assert_eq!((counted.len(), w.backoff().failed_creations), (0, 1));
    }

    #[test]
    fn members_hit_by_a_widespread_failure_get_a_grace_to_recover_when_it_ends() {
        let at = |secs: i64| Timestamp::from_second(secs).unwrap();
        let share = |failed| Share {
            failed,
            members: 6,
            allowed: 2,
        };
        let grace = Duration::from_secs(60);
        let mut w = Watch::default();
        assert_eq!(w.gate(share(1), grace, at(0)), Gate::Allowed(share(1)));
        assert_eq!(w.gate(share(6), grace, at(10)), Gate::TooManyUnhealthy(share(6)));
        // Four recover: the last two would be replaced at once, but they recover too.
        assert_eq!(
            w.gate(share(2), grace, at(20)),
            Gate::Recovering {
                share: share(2),
                wait: grace
            }
        );
        assert!(!w.gate(share(1), grace, at(79)).allows());
        assert_eq!(w.gate(share(1), grace, at(80)), Gate::Allowed(share(1)));
        // A new leader that finds the pool stopped does the same.
        let mut w = Watch::resuming(Backoff::default(), true);
        assert_eq!(w.gate(share(0), grace, at(0)).wait(), Some(grace));
    }

    #[test]
    fn the_gate_holds_on_a_widespread_failure_first_then_on_the_backoff() {
        let now = Timestamp::UNIX_EPOCH;
        let few = Share {
            failed: 1,
            members: 6,
            allowed: 2,
        };
        let many = Share { failed: 3, ..few };
        let waiting = Backoff::default().after(1, false, now);
        assert_eq!(Gate::of(few, None, &Backoff::default(), now), Gate::Allowed(few));
        assert_eq!(Gate::of(many, None, &waiting, now), Gate::TooManyUnhealthy(many));
        assert_eq!(
            Gate::of(few, None, &waiting, now),
            Gate::BackingOff {
                share: few,
                wait: BACKOFF_BASE
            }
        );
        assert!(Gate::of(few, None, &Backoff::default(), now).allows());
        assert!(!Gate::of(few, None, &waiting, now).allows());
    }
}
