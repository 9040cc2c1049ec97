//! How a pass ends, the same on every path: the outcome with the health verdict and the phase
//! filled in, the `Provisioned` condition the paths set, and the two endings every path shares
//! (a provider call that failed, an API server that did not answer).

use egress_api::{ConditionStatus, FINALIZER, Mode, Proxy, ProxyStatus, conditions, reasons};
use egress_provider::ErrorClass;

use super::facts::{Input, ProviderFailure};
use super::outcome::{Next, Outcome, Requeue};
use super::timings::Timings;
use crate::conditions::set_condition;
use crate::proxy::status::{InstanceView, apply_exit, apply_verdict, last_verdict, latched, phase, provider_missing};

pub(super) fn has_finalizer(proxy: &Proxy) -> bool {
    proxy
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

pub(super) fn generation(proxy: &Proxy) -> Option<i64> {
    proxy.metadata.generation
}

/// Ends the pass, with the health verdict and the phase filled in.
pub(super) fn finish(input: &Input<'_>, status: ProxyStatus, instance: InstanceView, requeue: Requeue) -> Next {
    Next::Done(outcome(input, status, instance, requeue))
}

/// Fills the health verdict and the phase.
pub(super) fn outcome(input: &Input<'_>, mut status: ProxyStatus, instance: InstanceView, requeue: Requeue) -> Outcome {
    let proxy = input.proxy;
    let mode = proxy.spec.mode;
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    // A verdict belongs to something that can be probed: a running instance or an External proxy.
    // Until the health engine has one (just after it starts, on a new leader), the last verdict
    // written stands: no flap of every Proxy's status at each failover.
    let verdict = match (mode, instance) {
        (Mode::External, _) | (_, InstanceView::Running) => input.verdict.or_else(|| last_verdict(&status)),
        _ => None,
    };
    // The Healthy condition follows what this pass saw; a pass that did not look at the
    // instance (a latch, a quota wait) leaves it alone.
    if !deleting && (mode == Mode::External || instance != InstanceView::Unobserved) {
        apply_verdict(&mut status, verdict, generation(proxy), &input.now);
        apply_exit(&mut status, &input.exit, generation(proxy), &input.now);
    }
    // A latched error, or a provider the config lacks: nothing can be provisioned.
    let blocked = latched(&status, generation(proxy)) || provider_missing(&status);
    status.phase = Some(phase(deleting, blocked, mode, instance, verdict));
    Outcome {
        status,
        requeue,
        note: None,
        marked: None,
    }
}

pub(super) fn set_provisioned(
    input: &Input<'_>,
    status: &mut ProxyStatus,
    value: ConditionStatus,
    reason: &str,
    message: &str,
) {
    set_condition(
        &mut status.conditions,
        conditions::PROVISIONED,
        value,
        reason,
        message,
        generation(input.proxy),
        &input.now,
    );
}

/// `providerFailure` (spec/core.md §3.8).
pub(super) fn provider_failure(
    input: &Input<'_>,
    timings: &Timings,
    mut status: ProxyStatus,
    instance: InstanceView,
    failure: &ProviderFailure,
) -> Next {
    match failure.class {
        ErrorClass::QuotaExceeded => {
            set_provisioned(
                input,
                &mut status,
                ConditionStatus::False,
                reasons::QUOTA_EXCEEDED,
                &failure.message,
            );
            if status.ip.is_empty() {
                // No address, nothing probed: no health verdict either.
                apply_verdict(&mut status, None, generation(input.proxy), &input.now);
            }
            finish(
                input,
                status,
                InstanceView::Unobserved,
                Requeue::After(timings.quota_retry),
            )
        }
        ErrorClass::Permanent => {
            set_provisioned(
                input,
                &mut status,
                ConditionStatus::False,
                reasons::PERMANENT_ERROR,
                &failure.message,
            );
            finish(input, status, instance, Requeue::Never)
        }
        // A transient error leaves the status exactly as fetched, even where this pass had
        // already changed it: a Ready proxy stays Ready.
        ErrorClass::Transient | ErrorClass::NotFound => Next::Done(Outcome {
            status: input.proxy.status.clone().unwrap_or_default(),
            requeue: Requeue::Error(failure.message.clone()),
            note: None,
            marked: None,
        }),
    }
}

/// The API server could not answer: retry with backoff, the status left exactly as fetched.
pub(super) fn unavailable(input: &Input<'_>, why: &str) -> Next {
    Next::Done(Outcome {
        status: input.proxy.status.clone().unwrap_or_default(),
        requeue: Requeue::Error(why.to_owned()),
        note: None,
        marked: None,
    })
}
