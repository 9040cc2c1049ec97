//! A Proxy's status building blocks: the permanent-error latch, the health verdict (and the
//! last one a status records), and phase derivation (spec/core.md §1.7, §3.11). All pure.

use std::time::Duration;

use egress_api::{ConditionStatus, Mode, Phase, ProxyStatus, conditions, reasons};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::conditions::{remove_condition, set_condition};
use crate::proxy::exit_findings::ExitFinding;

/// The health engine's verdict for one Proxy, the one type of it the workspace has: unhealthy
/// with `auth_refused` gets the reason `ProxyAuthRequired`.
pub use egress_health::Verdict;

/// A verdict's latency as `status.latencyMillis` records it: whole milliseconds.
pub fn latency_millis(verdict: &Verdict) -> i64 {
    i64::try_from(verdict.latency.as_millis()).unwrap_or(i64::MAX)
}

/// Whether a permanent error is latched for this generation: `Provisioned=False` with reason
/// `PermanentError` recorded for the current `metadata.generation`.
pub fn latched(status: &ProxyStatus, generation: Option<i64>) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == conditions::PROVISIONED
            && c.status == ConditionStatus::False
            && c.reason == reasons::PERMANENT_ERROR
            && c.observed_generation == generation
    })
}

/// Whether the Proxy waits for its provider to be configured (a restart with the entry).
pub fn provider_missing(status: &ProxyStatus) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == conditions::PROVISIONED
            && c.status == ConditionStatus::False
            && c.reason == reasons::PROVIDER_NOT_CONFIGURED
    })
}

/// What this pass learned about the instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceView {
    /// Not observed in this pass (quota wait, cloud-init error, a latch...).
    Unobserved,
    /// Being created, booting, without an address, or being replaced.
    Booting,
    /// Running with an IP.
    Running,
}

/// The phase, first match wins (spec/core.md §3.11).
pub fn phase(deleting: bool, latched: bool, mode: Mode, instance: InstanceView, verdict: Option<Verdict>) -> Phase {
    if deleting {
        return Phase::Deleting;
    }
    if latched {
        return Phase::Failed;
    }
    let by_verdict = |v: Option<Verdict>, none: Phase| match v {
        None => none,
        Some(v) if v.healthy => Phase::Ready,
        Some(_) => Phase::Unhealthy,
    };
    match (mode, instance) {
        (Mode::Managed, InstanceView::Booting) => Phase::Provisioning,
        (Mode::Managed, InstanceView::Running) => by_verdict(verdict, Phase::Running),
        (Mode::Managed, InstanceView::Unobserved) => Phase::Pending,
        (Mode::External, _) => by_verdict(verdict, Phase::Pending),
    }
}

/// The `Healthy` condition and the latency from the verdict; without a verdict both go (the
/// HEALTHY column is empty until the first probe result).
pub fn apply_verdict(status: &mut ProxyStatus, verdict: Option<Verdict>, generation: Option<i64>, now: &Time) {
    match verdict {
        Some(v) => {
            let (s, reason, message) = if v.healthy {
                (
                    ConditionStatus::True,
                    reasons::PROBE_SUCCEEDED,
                    "the proxy carried the probe",
                )
            } else if v.auth_refused {
                (
                    ConditionStatus::False,
                    reasons::PROXY_AUTH_REQUIRED,
                    "the proxy refused the probe's credentials (407)",
                )
            } else {
                (
                    ConditionStatus::False,
                    reasons::PROBE_FAILED,
                    "the proxy failed its probes",
                )
            };
            set_condition(
                &mut status.conditions,
                conditions::HEALTHY,
                s,
                reason,
                message,
                generation,
                now,
            );
            status.latency_millis = Some(latency_millis(&v));
        }
        None => {
            remove_condition(&mut status.conditions, conditions::HEALTHY);
            status.latency_millis = None;
        }
    }
}

/// The `ExitVerified` condition and `status.exit` from what the exit checks found: set from a
/// finding, removed when the checks are off, left as recorded until the first finding.
pub fn apply_exit(status: &mut ProxyStatus, finding: &ExitFinding, generation: Option<i64>, now: &Time) {
    match finding {
        ExitFinding::Off => {
            remove_condition(&mut status.conditions, conditions::EXIT_VERIFIED);
            status.exit = None;
        }
        ExitFinding::NotYet => {}
        ExitFinding::Found { verdict, exit } => {
            set_condition(
                &mut status.conditions,
                conditions::EXIT_VERIFIED,
                verdict.status,
                verdict.reason,
                &verdict.message,
                generation,
                now,
            );
            status.exit.clone_from(exit);
        }
    }
}

/// The verdict the status records (its `Healthy` condition and latency), if any.
pub fn last_verdict(status: &ProxyStatus) -> Option<Verdict> {
    let healthy_condition = status.conditions.iter().find(|c| c.type_ == conditions::HEALTHY)?;
    let healthy = match healthy_condition.status {
        ConditionStatus::True => true,
        ConditionStatus::False => false,
        ConditionStatus::Unknown => return None,
    };
    Some(Verdict {
        healthy,
        latency: Duration::from_millis(status.latency_millis.and_then(|m| u64::try_from(m).ok()).unwrap_or(0)),
        auth_refused: !healthy && healthy_condition.reason == reasons::PROXY_AUTH_REQUIRED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn the_latch_holds_for_its_generation_only() {
        let mut status = ProxyStatus::default();
        set_condition(
            &mut status.conditions,
            conditions::PROVISIONED,
            ConditionStatus::False,
            reasons::PERMANENT_ERROR,
            "bad",
            Some(3),
            &at(0),
        );
        assert!(latched(&status, Some(3)));
        assert!(!latched(&status, Some(4)));
        set_condition(
            &mut status.conditions,
            conditions::PROVISIONED,
            ConditionStatus::False,
            reasons::QUOTA_EXCEEDED,
            "wait",
            Some(3),
            &at(0),
        );
        assert!(!latched(&status, Some(3)), "a quota wait is never a latch");
    }

    #[test]
    fn an_exit_finding_sets_the_condition_none_yet_keeps_it_and_checks_off_remove_it() {
        use crate::proxy::exit::{ExitFacts, judge};
        let ip: std::net::IpAddr = "203.0.113.7".parse().unwrap();
        let verdict = judge(&ExitFacts {
            seen: Ok(ip),
            sharing: 2,
            own: None,
            country: None,
            expected: &[],
        });
        let exit = egress_api::ExitStatus {
            address: ip.to_string(),
            observed_at: "2026-12-07T00:00:00Z".into(),
            ..Default::default()
        };
        let mut status = ProxyStatus::default();
        let found = ExitFinding::Found {
            verdict,
            exit: Some(Box::new(exit.clone())),
        };
        apply_exit(&mut status, &found, Some(1), &at(0));
        let condition = |s: &ProxyStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == conditions::EXIT_VERIFIED)
                .cloned()
        };
        assert_eq!(condition(&status).unwrap().reason, reasons::EXIT_SHARED);
        assert_eq!(status.exit.as_deref(), Some(&exit));
        apply_exit(&mut status, &ExitFinding::NotYet, Some(1), &at(1));
        assert_eq!(condition(&status).unwrap().reason, reasons::EXIT_SHARED, "kept");
        assert_eq!(status.exit.as_deref(), Some(&exit));
        apply_exit(&mut status, &ExitFinding::Off, Some(1), &at(2));
        assert!(condition(&status).is_none());
        assert!(status.exit.is_none());
    }

    #[test]
    fn phases_first_match_wins() {
        use InstanceView::*;
        let ok = Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(1),
            auth_refused: false,
        });
        let bad = Some(Verdict {
            healthy: false,
            latency: std::time::Duration::from_millis(1),
            auth_refused: false,
        });
        let rows = [
            (true, true, Mode::Managed, Running, ok, Phase::Deleting),
            (false, true, Mode::Managed, Running, ok, Phase::Failed),
            (false, false, Mode::Managed, Booting, ok, Phase::Provisioning),
            (false, false, Mode::Managed, Running, None, Phase::Running),
            (false, false, Mode::Managed, Running, ok, Phase::Ready),
            (false, false, Mode::Managed, Running, bad, Phase::Unhealthy),
            (false, false, Mode::Managed, Unobserved, None, Phase::Pending),
            (false, false, Mode::External, Unobserved, None, Phase::Pending),
            (false, false, Mode::External, Unobserved, ok, Phase::Ready),
            (false, false, Mode::External, Unobserved, bad, Phase::Unhealthy),
        ];
        for (deleting, latch, mode, instance, verdict, want) in rows {
            assert_eq!(
                phase(deleting, latch, mode, instance, verdict),
                want,
                "{deleting} {latch} {mode:?} {instance:?} {verdict:?}"
            );
        }
    }
}
