//! The decision for an External Proxy: the address its spec names, probed and leased unless it
//! is refused (docs/controller.md#external-proxies-and-internal-destinations).

use egress_api::{ConditionStatus, ProxyStatus, conditions, reasons};

use super::ending::{generation, outcome, set_provisioned};
use super::facts::Input;
use super::outcome::{Outcome, Requeue};
use crate::conditions::remove_condition;
use crate::proxy::status::{InstanceView, apply_verdict};

/// The External path (spec/core.md §3.10): nothing to provision; the endpoint is the address,
/// unless the Proxy is refused for where it is or points, or for whose credentials it uses.
pub(super) fn external_path(input: &Input<'_>, mut status: ProxyStatus) -> Outcome {
    let spec = &input.proxy.spec;
    let Some(endpoint) = &spec.endpoint else {
        // Only an object that bypassed admission gets here (CEL requires the endpoint).
        let message = "spec.endpoint is required for an External proxy";
        set_provisioned(
            input,
            &mut status,
            ConditionStatus::False,
            reasons::PERMANENT_ERROR,
            message,
        );
        return outcome(input, status, InstanceView::Unobserved, Requeue::Never);
    };
    status.ip = endpoint.host.clone();
    // Refused for where it is or points, or for whose credentials it uses: neither probed nor
    // leased, so no verdict stands, not even the last one. A change of the flags (after a
    // restart) or of the Secret (it enqueues the Proxy) lifts it.
    let refusal = input
        .external_refused
        .as_ref()
        .map(|r| (r.reason(), r.message().to_owned()))
        .or_else(|| {
            input
                .credentials_refused
                .as_ref()
                .map(|r| (reasons::CREDENTIALS_ERROR, r.to_string()))
        });
    if let Some((reason, message)) = refusal {
        set_provisioned(input, &mut status, ConditionStatus::False, reason, &message);
        apply_verdict(&mut status, None, generation(input.proxy), &input.now);
        status.phase = Some(egress_api::Phase::Failed);
        return Outcome {
            status,
            requeue: Requeue::Never,
            note: None,
            marked: None,
        };
    }
    let refused_before = status.conditions.iter().any(|c| {
        c.type_ == conditions::PROVISIONED
            && [
                reasons::CREDENTIALS_ERROR,
                reasons::DESTINATION_REFUSED,
                reasons::EXTERNAL_NOT_ALLOWED,
            ]
            .contains(&c.reason.as_str())
    });
    if refused_before {
        // Accepted now: back to what an External Proxy shows.
        remove_condition(&mut status.conditions, conditions::PROVISIONED);
    }
    // Health events drive External proxies; no periodic requeue.
    outcome(input, status, InstanceView::Unobserved, Requeue::Never)
}
