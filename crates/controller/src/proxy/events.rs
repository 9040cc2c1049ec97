//! Kubernetes Events on a Proxy, for `kubectl describe`: what a person wants to know, derived
//! purely from what a pass changed. Emitted on transitions only, so a steady Proxy emits none.

use egress_api::{Phase, ProxyStatus, conditions, reasons};

use crate::events::Event;
use crate::proxy::decide::{Marked, Note, Requeue, WAITING_TO_RUN};

fn provisioned(status: &ProxyStatus) -> Option<(&str, &str)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::PROVISIONED)
        .map(|c| (c.reason.as_str(), c.message.as_str()))
}

/// The events of one pass, from the status before and after it, its note and its end.
pub fn derive(
    before: &ProxyStatus,
    after: &ProxyStatus,
    note: Option<&Note>,
    requeue: &Requeue,
    deleting: bool,
) -> Vec<Event> {
    let mut events = Vec::new();
    if !after.provider_id.is_empty() && after.provider_id != before.provider_id {
        events.push(Event::normal(
            "Created",
            format!("created instance {}", after.provider_id),
        ));
    }
    events.extend(provisioned_changed(before, after));
    events.extend(phase_changed(before, after));
    events.extend(note.map(noted));
    if deleting && let Requeue::Error(message) = requeue {
        events.push(Event::warning("CleanupFailed", message.clone()));
    }
    events
}

/// The event of a change of the `Provisioned` condition, if it is one a person wants to know.
fn provisioned_changed(before: &ProxyStatus, after: &ProxyStatus) -> Option<Event> {
    let (was, now) = (provisioned(before), provisioned(after));
    if now == was {
        return None;
    }
    let (reason, message) = now?;
    let warning = |reason, message: &str| Some(Event::warning(reason, message.to_string()));
    match reason {
        r if r == reasons::QUOTA_EXCEEDED && was.map(|w| w.0) != Some(r) => {
            Some(Event::warning("QuotaExceeded", format!("waiting for quota: {message}")))
        }
        // Once when the wait starts: its message counts down from pass to pass.
        r if r == reasons::CREATE_BUDGET && was.map(|w| w.0) != Some(r) => {
            Some(Event::normal("CreateDelayed", message.to_string()))
        }
        r if r == reasons::PERMANENT_ERROR => warning("Failed", message),
        r if r == reasons::CLOUD_INIT_ERROR => warning("CloudInitError", message),
        r if r == reasons::CREDENTIALS_ERROR => warning("CredentialsError", message),
        r if r == reasons::DESTINATION_REFUSED => warning("DestinationRefused", message),
        r if r == reasons::EXTERNAL_NOT_ALLOWED => warning("ExternalNotAllowed", message),
        r if r == reasons::PROVIDER_NOT_CONFIGURED => warning("ProviderNotConfigured", message),
        r if r == reasons::PROVISIONING && message != WAITING_TO_RUN => {
            Some(Event::normal("Replacing", message.to_string()))
        }
        _ => None,
    }
}

/// The event of a change of phase into Ready or Unhealthy.
fn phase_changed(before: &ProxyStatus, after: &ProxyStatus) -> Option<Event> {
    if after.phase == before.phase {
        return None;
    }
    match after.phase {
        Some(Phase::Ready) => Some(Event::normal(
            "Ready",
            format!("the proxy at {} carries traffic", after.ip),
        )),
        Some(Phase::Unhealthy) => {
            let refused = after
                .conditions
                .iter()
                .any(|c| c.type_ == conditions::HEALTHY && c.reason == reasons::PROXY_AUTH_REQUIRED);
            let note = if refused {
                "the proxy refused the probe's credentials (407)"
            } else {
                "the proxy failed its health probes"
            };
            Some(Event::warning("Unhealthy", note.into()))
        }
        _ => None,
    }
}

/// The event of a pass's note.
fn noted(note: &Note) -> Event {
    match note {
        Note::SkipCleanup { provider_id } => Event::normal(
            "SkipCleanup",
            format!("skip-cleanup annotation set; instance {provider_id} was abandoned, not deleted"),
        ),
        Note::UnreachableButCleaned { provider_id, .. } => Event::normal(
            "CleanedUp",
            format!("instance {provider_id} was unreachable but its delete succeeded"),
        ),
        Note::LeftToItsOwner { provider_id, owner } => Event::warning(
            "LeftToItsOwner",
            format!("instance {provider_id} is marked as Proxy UID {owner}'s; it was left in place, not deleted"),
        ),
        Note::Adopted { provider_id, .. } => Event::normal(
            "Adopted",
            format!(
                "adopted instance {provider_id}: its spec-hash annotation was written by another operator (kept in {}); not replaced",
                egress_api::ANNOTATION_PREVIOUS_SPEC_HASH
            ),
        ),
    }
}

/// The event of a pass that marked the Proxy's instance with the operator's installation: from
/// then on this installation's orphan GC may collect the instance once its Proxy is gone.
pub fn installation_marked(marked: &Marked) -> Event {
    Event::normal(
        "InstallationMarked",
        format!(
            "marked instance {} with installation {}: its orphan GC may collect it once the Proxy is gone",
            marked.provider_id, marked.installation
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::set_condition;
    use egress_api::ConditionStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn with(reason: &str, message: &str, phase: Option<Phase>) -> ProxyStatus {
        let mut s = ProxyStatus {
            phase,
            ..Default::default()
        };
        let t = Time(k8s_openapi::jiff::Timestamp::from_second(0).unwrap());
        set_condition(
            &mut s.conditions,
            conditions::PROVISIONED,
            ConditionStatus::False,
            reason,
            message,
            Some(1),
            &t,
        );
        s
    }

    fn reasons_of(events: &[Event]) -> Vec<&'static str> {
        events.iter().map(|e| e.reason).collect()
    }

    /// The reasons of the events of a pass outside deletion from `before` to `after`, with no note.
    fn said(before: &ProxyStatus, after: &ProxyStatus) -> Vec<&'static str> {
        reasons_of(&derive(before, after, None, &Requeue::Never, false))
    }

    #[test]
    fn transitions_make_events_and_steady_state_none() {
        let empty = ProxyStatus::default();
        let created = ProxyStatus {
            provider_id: "id".into(),
            ..with(
                reasons::PROVISIONING,
                crate::proxy::decide::WAITING_TO_RUN,
                Some(Phase::Provisioning),
            )
        };
        assert_eq!(said(&empty, &created), ["Created"]);
        assert!(
            derive(&created, &created, None, &Requeue::Never, false).is_empty(),
            "nothing changed, nothing said"
        );
        let ready = ProxyStatus {
            phase: Some(Phase::Ready),
            ip: "10.0.0.1".into(),
            ..created.clone()
        };
        assert_eq!(said(&created, &ready), ["Ready"]);
        let sick = ProxyStatus {
            phase: Some(Phase::Unhealthy),
            ..ready.clone()
        };
        let e = derive(&ready, &sick, None, &Requeue::Never, false);
        assert_eq!((reasons_of(&e), e[0].warning), (vec!["Unhealthy"], true));
        let quota = with(reasons::QUOTA_EXCEEDED, "no CPUs", Some(Phase::Pending));
        assert_eq!(said(&empty, &quota), ["QuotaExceeded"]);
        let replacing = with(
            reasons::PROVISIONING,
            "replacing the instance after a spec change",
            Some(Phase::Provisioning),
        );
        assert_eq!(said(&ready, &replacing), ["Replacing"]);
        let failed = with(reasons::PERMANENT_ERROR, "no such image", Some(Phase::Failed));
        assert_eq!(said(&empty, &failed), ["Failed"]);
        let cloud = with(reasons::CLOUD_INIT_ERROR, "Secret missing", Some(Phase::Pending));
        assert_eq!(said(&empty, &cloud), ["CloudInitError"]);
        let credentials = with(reasons::CREDENTIALS_ERROR, "Secret taken", Some(Phase::Pending));
        assert_eq!(said(&empty, &credentials), ["CredentialsError"]);
        let mut refused = ProxyStatus {
            phase: Some(Phase::Unhealthy),
            ..Default::default()
        };
        let t = Time(k8s_openapi::jiff::Timestamp::from_second(0).unwrap());
        set_condition(
            &mut refused.conditions,
            conditions::HEALTHY,
            ConditionStatus::False,
            reasons::PROXY_AUTH_REQUIRED,
            "refused",
            Some(1),
            &t,
        );
        let events = derive(&empty, &refused, None, &Requeue::Never, false);
        assert_eq!(reasons_of(&events), ["Unhealthy"]);
        assert!(events[0].note.contains("credentials"), "{:?}", events[0]);
        let delayed = with(
            reasons::CREATE_BUDGET,
            "waiting for provider entry \"mem\"'s create budget (3 per minute); about 20s",
            Some(Phase::Pending),
        );
        let e = derive(&empty, &delayed, None, &Requeue::Never, false);
        assert_eq!((reasons_of(&e), e[0].warning), (vec!["CreateDelayed"], false));
        assert!(e[0].note.contains("create budget"), "{:?}", e[0]);
        let later = with(
            reasons::CREATE_BUDGET,
            "waiting for provider entry \"mem\"'s create budget (3 per minute); about 7s",
            Some(Phase::Pending),
        );
        assert!(
            derive(&delayed, &later, None, &Requeue::Never, false).is_empty(),
            "one event per wait, not one per pass"
        );
        let missing = with(
            reasons::PROVIDER_NOT_CONFIGURED,
            "provider \"x\" is not configured",
            Some(Phase::Failed),
        );
        assert_eq!(said(&empty, &missing), ["ProviderNotConfigured"]);
    }

    #[test]
    fn a_marked_instance_is_a_normal_event_naming_it_and_the_installation() {
        let e = installation_marked(&Marked {
            provider_id: "zones/zone-a/instances/proxy-x".into(),
            installation: "blue".into(),
        });
        assert_eq!((e.warning, e.reason), (false, "InstallationMarked"));
        assert!(
            e.note.contains("zones/zone-a/instances/proxy-x") && e.note.contains("installation blue"),
            "{}",
            e.note
        );
    }

    #[test]
    fn deletion_events() {
        let s = ProxyStatus::default();
        let skip = Note::SkipCleanup {
            provider_id: "id".into(),
        };
        assert_eq!(
            reasons_of(&derive(&s, &s, Some(&skip), &Requeue::Never, true)),
            ["SkipCleanup"]
        );
        let failed = derive(&s, &s, None, &Requeue::Error("denied".into()), true);
        assert_eq!(
            (reasons_of(&failed), failed[0].note.as_str()),
            (vec!["CleanupFailed"], "denied")
        );
        assert!(
            derive(&s, &s, None, &Requeue::Error("timeout".into()), false).is_empty(),
            "transient errors outside deletion are logged, not evented"
        );
    }
}
