//! Conditions with the standard semantics (`meta.SetStatusCondition`), for every status the
//! operator writes: a Proxy's, a ProxyPool's, a ProviderHealth's. Pure.

use egress_api::{Condition, ConditionStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Sets a condition as `meta.SetStatusCondition` does: `lastTransitionTime` moves only when the
/// status changes; reason, message and observedGeneration always follow.
pub fn set_condition(
    list: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    match list.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.status = status;
                c.last_transition_time = now.clone();
            }
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = generation;
        }
        None => list.push(Condition {
            type_: type_.into(),
            status,
            observed_generation: generation,
            last_transition_time: now.clone(),
            reason: reason.into(),
            message: message.into(),
        }),
    }
}

pub fn remove_condition(list: &mut Vec<Condition>, type_: &str) {
    list.retain(|c| c.type_ != type_);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let mut list = Vec::new();
        set_condition(&mut list, "Healthy", ConditionStatus::True, "A", "m", Some(1), &at(1));
        set_condition(&mut list, "Healthy", ConditionStatus::True, "B", "n", Some(2), &at(2));
        assert_eq!(
            (list[0].last_transition_time.clone(), list[0].reason.as_str()),
            (at(1), "B")
        );
        set_condition(&mut list, "Healthy", ConditionStatus::False, "C", "o", Some(2), &at(3));
        assert_eq!(list[0].last_transition_time, at(3));
        assert_eq!(list.len(), 1);
    }
}
