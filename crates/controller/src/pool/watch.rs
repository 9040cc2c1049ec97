//! What the pool's leader sees of its members' health from pass to pass
//! (docs/pools.md#when-failures-are-widespread): each member judged with what it remembers of
//! it, the failed creations counted into the pool's backoff, and the gate that says whether
//! failed members may be replaced, with an Event when it changes. The rules are
//! [`crate::pool::remediation`]'s; this is their memory.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use egress_api::{ConditionStatus, Proxy, ProxyPool, ProxyPoolStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::events::Event;
use crate::pool::decide::Desired;
use crate::pool::member::Member;
use crate::pool::remediation::{self, Backoff, Gate, Observed, Watch, share};
use crate::pool::view::{Look, health, member, remediation_condition, set_remediation};

/// What this leader has seen of one pool's members' health, and announced of it.
#[derive(Debug, Default)]
struct HealthWatch {
    watch: Watch,
    /// The reason of the `RemediationAllowed` condition last announced with an Event.
    announced: Option<String>,
}

impl HealthWatch {
    /// A pool this leader has not looked at yet: its backoff and announced condition as its
    /// status has them, so a new leader neither forgets a backoff nor announces it again.
    fn from_status(status: Option<&ProxyPoolStatus>) -> Self {
        let Some(status) = status else {
            return Self::default();
        };
        let announced = status
            .conditions
            .iter()
            .find(|c| c.type_ == remediation::CONDITION)
            .map(|c| c.reason.clone());
        let backoff = Backoff {
            failed_creations: u32::try_from(status.failed_creations).unwrap_or(0),
            not_before: status.next_replacement_time.as_ref().map(|t| t.0),
        };
        Self {
            // Stopped, or recovering from it: the new leader's hold starts when it finds the
            // failure over.
            watch: Watch::resuming(
                backoff,
                matches!(announced.as_deref(), Some("TooManyUnhealthy" | "Recovering")),
            ),
            announced,
        }
    }
}

/// Every pool's [`HealthWatch`] this leader keeps, by pool UID.
#[derive(Debug, Default)]
pub(crate) struct HealthWatches(Mutex<HashMap<String, HealthWatch>>);

/// A pass's members as judged, and what their health changed.
pub(crate) struct Watched<'a> {
    pub(crate) members: Vec<(&'a Proxy, Member)>,
    pub(crate) backoff: Backoff,
    /// When the soonest member failing within its grace comes to be judged.
    pub(crate) next_judgement: Option<Duration>,
    /// A Warning naming the members this pass found never Ready within their grace.
    pub(crate) events: Vec<Event>,
}

impl HealthWatches {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, HealthWatch>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Judges the pool's `live` members (with their `leases`) with what this leader remembers
    /// of them, and notes the pass in its [`Watch`]: the failed creations it counts lengthen the
    /// pool's backoff, and a member that becomes Ready ends it.
    pub(crate) fn judge<'a>(
        &self,
        pool: &ProxyPool,
        live: &[&'a Proxy],
        leases: &[usize],
        look: &Look<'_>,
    ) -> Watched<'a> {
        let uid = pool.uid().unwrap_or_default();
        let mut watches = self.lock();
        let watch = &mut watches
            .entry(uid)
            .or_insert_with(|| HealthWatch::from_status(pool.status.as_ref()))
            .watch;
        let mut members = Vec::with_capacity(live.len());
        let mut healths = Vec::with_capacity(live.len());
        for (p, n) in live.iter().zip(leases) {
            let Some(membership) = p.pool() else { continue };
            let proven = watch.proven(&p.name_any());
            healths.push(health(p, proven, look.now));
            let m = member(p, membership.role, u32::try_from(*n).unwrap_or(u32::MAX), proven, look);
            members.push((*p, m));
        }
        let observed: Vec<Observed<'_>> = members
            .iter()
            .zip(&healths)
            .map(|((_, m), h)| Observed::of(m, h))
            .collect();
        let never_ready = watch.observe(&observed, look.now);
        let backoff = watch.backoff();
        let mut events = Vec::new();
        if !never_ready.is_empty() {
            events.push(Event::warning(
                "MemberNeverReady",
                format!(
                    "{} never became Ready within startupGrace {}s, or came up with a refused exit; {} failed creations in a row: the next member is made after {}s",
                    never_ready.join(", "),
                    look.grace.as_secs(),
                    backoff.failed_creations,
                    remediation::delay(backoff.failed_creations).as_secs()
                ),
            ));
        }
        Watched {
            members,
            backoff,
            next_judgement: remediation::next_judgement(&healths, look.grace),
            events,
        }
    }

    /// Whether the pass may replace failed members and make new ones: the gate, written into
    /// `status` (`RemediationAllowed` and the counts), with its Event when it changed.
    /// `probe_target` is what fetching the probe target directly found, if it says anything.
    pub(crate) fn gate(
        &self,
        pool: &ProxyPool,
        desired: &Desired,
        members: &[(&Proxy, Member)],
        probe_target: Option<String>,
        now: Timestamp,
        status: &mut ProxyPoolStatus,
    ) -> (Gate, Option<Event>) {
        let uid = pool.uid().unwrap_or_default();
        let list: Vec<Member> = members.iter().map(|(_, m)| m.clone()).collect();
        let share = share(desired.max_unhealthy, &list);
        let (gate, backoff) = {
            let mut watches = self.lock();
            let watch = &mut watches.entry(uid.clone()).or_default().watch;
            (watch.gate(share, desired.startup_grace, now), watch.backoff())
        };
        let condition = remediation_condition(&gate, desired, &backoff, probe_target);
        let event = self.gate_event(&uid, &gate, &condition);
        set_remediation(
            status,
            &gate,
            &condition,
            &backoff,
            pool.metadata.generation,
            &Time(now),
        );
        (gate, event)
    }

    /// The Event of a change of the `RemediationAllowed` condition, once per change: a Warning
    /// when too many members have failed for any to be replaced, a Normal one when that and the
    /// recovery after it end. (A backoff is announced by its `MemberNeverReady` Warning.)
    fn gate_event(
        &self,
        uid: &str,
        gate: &Gate,
        (_, reason, message): &(ConditionStatus, &'static str, String),
    ) -> Option<Event> {
        let message = message.clone();
        let mut watches = self.lock();
        let watch = watches.get_mut(uid)?;
        let before = watch.announced.replace((*reason).to_owned());
        // Stopped, and not yet announced as resumed (a recovery after it included).
        let was_stopped = matches!(before.as_deref(), Some("TooManyUnhealthy" | "Recovering"));
        match gate {
            Gate::TooManyUnhealthy(_) if !was_stopped => Some(Event::warning("RemediationStopped", message)),
            Gate::Allowed(_) if was_stopped => Some(Event::normal("RemediationResumed", message)),
            _ => None,
        }
    }

    /// Forgets the pool `uid` (it is gone).
    pub(crate) fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::Condition;

    /// A status whose `RemediationAllowed` condition has `reason`.
    fn status_with(reason: &str) -> ProxyPoolStatus {
        ProxyPoolStatus {
            conditions: vec![Condition {
                type_: remediation::CONDITION.into(),
                status: ConditionStatus::False,
                observed_generation: None,
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                reason: reason.into(),
                message: String::new(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_new_leader_holds_a_recovery_it_finds_stopped_or_under_way() {
        let grace = Duration::from_secs(60);
        let within = remediation::Share {
            failed: 1,
            members: 6,
            allowed: 2,
        };
        let now = Timestamp::UNIX_EPOCH;
        for (reason, holds) in [("TooManyUnhealthy", true), ("Recovering", true), ("BackingOff", false)] {
            let mut watch = HealthWatch::from_status(Some(&status_with(reason))).watch;
            let gate = watch.gate(within, grace, now);
            assert_eq!(gate.wait().is_some(), holds, "{reason}: {gate:?}");
            assert_eq!(
                HealthWatch::from_status(Some(&status_with(reason)))
                    .announced
                    .as_deref(),
                Some(reason)
            );
        }
    }
}
