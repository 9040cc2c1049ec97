//! The decision for a recorded instance the provider answered for: running with an address (and,
//! for Generated credentials, a Secret that still serves it), booting, without an address for
//! too long, or stopped; and the replacement of an instance that cannot go on, or the report of a
//! pool member's loss (its pool replaces it).

use std::time::Duration;

use egress_api::{ConditionStatus, CredentialsType, Proxy, ProxyStatus, conditions, reasons};
use egress_provider::{Instance, InstanceState, ProviderId};

use super::ending::{finish, provider_failure, set_provisioned, unavailable};
use super::facts::{Facts, Input};
use super::outcome::{Action, Next, Requeue};
use super::timings::Timings;
use crate::proxy::credentials::Serving;
use crate::proxy::secret::SecretProblem;
use crate::proxy::status::InstanceView;

/// The message on `Provisioned=False` while an instance boots.
pub const WAITING_TO_RUN: &str = "waiting for the instance to run";

/// The instance exists but is not running yet: no address, `Provisioned=False`, poll again soon.
pub(super) fn booting(input: &Input<'_>, timings: &Timings, mut status: ProxyStatus) -> Next {
    status.ip.clear();
    set_provisioned(
        input,
        &mut status,
        ConditionStatus::False,
        reasons::PROVISIONING,
        WAITING_TO_RUN,
    );
    finish(
        input,
        status,
        InstanceView::Booting,
        Requeue::After(timings.provisioning_poll),
    )
}

/// The instance reports no address. One that had an address shown (Provisioned=True) keeps
/// it, unchanged, for [`Timings::address_grace`] from the first pass that found it missing: a
/// guest-agent restart must not take a healthy proxy out of service. After that, or for an
/// instance that never had one, it is booting, until it has gone [`Timings::address_budget`]
/// without an address: then it is replaced, the budget named on the Proxy and in a
/// `Replacing` event.
pub(super) fn no_address(input: &Input<'_>, facts: &Facts, timings: &Timings, status: ProxyStatus) -> Next {
    let had_address = !status.ip.is_empty()
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::PROVISIONED && c.status == ConditionStatus::True);
    let missing_for = input.address_missing_since.as_ref().map_or(Duration::ZERO, |since| {
        input.now.0.duration_since(since.0).unsigned_abs()
    });
    if let Some(budget) = timings.address_budget
        && missing_for >= budget
    {
        if pool_member(input.proxy) {
            let why = format!(
                "the instance has had no address for {}s (the provisioning timeout)",
                budget.as_secs()
            );
            return lost_pool_member(input, timings, status, &why);
        }
        let id = ProviderId::new(status.provider_id.clone());
        let why = format!(
            "the instance has had no address for {}s (the provisioning timeout); replacing it",
            budget.as_secs()
        );
        return replace(input, facts, timings, status, id, &why);
    }
    if had_address && missing_for < timings.address_grace {
        return finish(
            input,
            status,
            InstanceView::Running,
            Requeue::After(timings.provisioning_poll),
        );
    }
    booting(input, timings, status)
}

/// Whether the Proxy is a member of a ProxyPool: it carries the pool label and a ProxyPool is
/// its controller (a label alone, which anyone can write on a Proxy of their own, is not enough
/// to stop its instance from being rebuilt).
pub(super) fn pool_member(proxy: &Proxy) -> bool {
    proxy.pool().is_some()
}

/// A pool member whose instance is lost is not rebuilt here (docs/pools.md): its pool promotes a
/// standby and deletes the member, so one failure makes one create (the pool's new standby).
/// The loss is reported and the recorded id kept, so no later pass creates either; the member's
/// delete removes what is left of the instance.
pub(super) fn lost_pool_member(input: &Input<'_>, timings: &Timings, mut status: ProxyStatus, what: &str) -> Next {
    status.ip.clear();
    set_provisioned(
        input,
        &mut status,
        ConditionStatus::False,
        reasons::INSTANCE_LOST,
        &format!("{what}; the pool replaces this member"),
    );
    finish(
        input,
        status,
        InstanceView::Unobserved,
        Requeue::After(timings.drift_poll),
    )
}

/// Step 8 with an answer from `Get`.
pub(super) fn observed(
    input: &Input<'_>,
    facts: &Facts,
    timings: &Timings,
    mut status: ProxyStatus,
    instance: &Instance,
) -> Next {
    match instance.state {
        InstanceState::Provisioning => no_address(input, facts, timings, status),
        InstanceState::Running => match instance.ip {
            Some(ip) => {
                if let Some(next) = credentials_serve(input, facts, timings, &mut status) {
                    return next;
                }
                status.ip = ip.to_string();
                set_provisioned(
                    input,
                    &mut status,
                    ConditionStatus::True,
                    reasons::RUNNING,
                    "the instance is running",
                );
                finish(input, status, InstanceView::Running, Requeue::After(timings.drift_poll))
            }
            // A provider must not say Running without an address; treat it as one without.
            None => no_address(input, facts, timings, status),
        },
        // Stopped, terminated or unknown: delete it (keeping its id) until Get says NotFound.
        InstanceState::Stopped | InstanceState::Terminated if pool_member(input.proxy) => {
            lost_pool_member(input, timings, status, "the instance stopped")
        }
        InstanceState::Stopped | InstanceState::Terminated => {
            // The id as recorded in the status, which is what Delete is promised.
            let id = ProviderId::new(status.provider_id.clone());
            replace(input, facts, timings, status, id, "the instance stopped; replacing it")
        }
    }
}

/// A running Generated instance is trusted only while its Secret holds the credentials it was
/// made with. A Secret deleted or edited by hand leaves an instance nobody can use: it is
/// replaced (deleted, keeping its id, until Get says NotFound), and the new one gets new ones.
/// `Some`: the pass goes no further than this.
fn credentials_serve(input: &Input<'_>, facts: &Facts, timings: &Timings, status: &mut ProxyStatus) -> Option<Next> {
    if input.proxy.spec.credentials_type() != CredentialsType::Generated || input.credentials_cached {
        return None;
    }
    let id = ProviderId::new(status.provider_id.clone());
    match &facts.credentials_checked {
        None => Some(Next::Do(Action::CheckCredentials(id))),
        Some(Ok(Serving::Yes)) => None,
        // Minted for the create that made this instance; the bind after it did not land.
        Some(Ok(Serving::Unbound)) => match &facts.credentials_bound {
            None => Some(Next::Do(Action::BindCredentials(id))),
            Some(Ok(())) => None,
            Some(Err(SecretProblem::Unavailable(why) | SecretProblem::Unusable(why))) => Some(unavailable(input, why)),
        },
        Some(Err(SecretProblem::Unavailable(why) | SecretProblem::Unusable(why))) => Some(unavailable(input, why)),
        Some(Ok(Serving::No)) => Some(replace(
            input,
            facts,
            timings,
            status.clone(),
            id,
            "the credentials Secret no longer holds this instance's credentials (deleted or edited); replacing the instance so it gets new ones",
        )),
    }
}

/// Replaces instance `id`, saying `why` on `Provisioned=False/Provisioning`: `Delete` on every
/// pass (the id kept) until `Get` says NotFound, then the create path builds the next one.
pub(super) fn replace(
    input: &Input<'_>,
    facts: &Facts,
    timings: &Timings,
    mut status: ProxyStatus,
    id: ProviderId,
    why: &str,
) -> Next {
    status.ip.clear();
    set_provisioned(input, &mut status, ConditionStatus::False, reasons::PROVISIONING, why);
    match &facts.delete {
        None => Next::Do(Action::Delete(id)),
        Some(Err(f)) => provider_failure(input, timings, status, InstanceView::Booting, f),
        Some(Ok(())) => finish(
            input,
            status,
            InstanceView::Booting,
            Requeue::After(timings.deletion_poll),
        ),
    }
}
