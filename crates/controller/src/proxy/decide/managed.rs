//! The decision for a Managed Proxy, in the order of a pass (spec/core.md §3.3 to §3.6): the
//! finalizer, a latched error, the provider, the cloud-init text, the spec hash and what the
//! recorded instance is (adopted, replaced, observed or gone), then the create with its
//! credentials and its budget.

use std::ops::ControlFlow;

use egress_api::{ConditionStatus, CredentialsType, Proxy, ProxyStatus, conditions, reasons};
use egress_provider::{ErrorClass, Instance, InstanceState, ProviderId, ProxyCredentials};

use super::ending::{finish, generation, has_finalizer, provider_failure, set_provisioned, unavailable};
use super::facts::{Facts, Input, ProviderFailure};
use super::observe::{WAITING_TO_RUN, booting, lost_pool_member, observed, pool_member, replace};
use super::outcome::{Action, Next, Requeue};
use super::timings::Timings;
use crate::create_budget::Deferral;
use crate::proxy::credentials::Prepared;
use crate::proxy::secret::SecretProblem;
use crate::proxy::spec_hash::{self, spec_hash};
use crate::proxy::status::{InstanceView, apply_verdict, latched};

/// The Managed path, its steps in the order of a pass. Each step either ends the pass here
/// (`Break`) or hands what it found to the next (`Continue`).
pub(super) fn managed_path(input: &Input<'_>, facts: &Facts, timings: &Timings, status: ProxyStatus) -> Next {
    // 1 to 3: the finalizer, a latched error, the provider.
    let status = match admitted(input, facts, timings, status) {
        ControlFlow::Continue(status) => status,
        ControlFlow::Break(next) => return next,
    };
    // 4. Cloud-init.
    let (status, text) = match cloud_init_text(input, facts, timings, status) {
        ControlFlow::Continue(found) => found,
        ControlFlow::Break(next) => return next,
    };
    // 5. What the instance should be built from.
    let hash = spec_hash(&input.proxy.spec, &text);
    let annotation = recorded_hash(input.proxy, facts);
    // 7 and 8: the recorded instance, if any; when it is gone (its credentials are not kept),
    // the create path builds the next one.
    let (status, vanished) = match recorded_instance(input, facts, timings, status, &hash, annotation.as_deref()) {
        ControlFlow::Continue(gone) => gone,
        ControlFlow::Break(next) => return next,
    };
    // 6. No instance recorded: make sure the annotation describes what is built, then create.
    if annotation.as_deref() != Some(hash.as_str()) {
        return Next::Do(Action::WriteSpecHash(hash));
    }
    create_path(input, facts, timings, status, text, vanished)
}

/// Steps 1 to 3: the finalizer first, in a pass of its own; a latched permanent error waits for
/// a spec change; the provider must be configured.
fn admitted(
    input: &Input<'_>,
    facts: &Facts,
    timings: &Timings,
    mut status: ProxyStatus,
) -> ControlFlow<Next, ProxyStatus> {
    let proxy = input.proxy;
    // 1. The finalizer first, in a pass of its own.
    if !has_finalizer(proxy) {
        if !facts.finalizer_added {
            return ControlFlow::Break(Next::Do(Action::AddFinalizer));
        }
        return ControlFlow::Break(finish(
            input,
            status,
            InstanceView::Unobserved,
            Requeue::After(timings.requeue_now),
        ));
    }
    // 2. A latched permanent error waits for a spec change.
    if latched(&status, generation(proxy)) {
        return ControlFlow::Break(finish(input, status, InstanceView::Unobserved, Requeue::Never));
    }
    // 3. The provider must be configured. Not a latch: the providers config is read at start,
    // and every Proxy is reconciled again after a restart that adds the entry.
    if !input.provider_configured {
        let configured = if input.configured_providers.is_empty() {
            "none is configured".to_owned()
        } else {
            format!("configured: {}", input.configured_providers.join(", "))
        };
        let message = format!(
            "provider \"{}\" is not configured ({configured}); add the entry to the providers config and restart the manager",
            proxy.spec.provider
        );
        set_provisioned(
            input,
            &mut status,
            ConditionStatus::False,
            reasons::PROVIDER_NOT_CONFIGURED,
            &message,
        );
        return ControlFlow::Break(finish(input, status, InstanceView::Unobserved, Requeue::Never));
    }
    ControlFlow::Continue(status)
}

/// Step 4: the cloud-init text, once read. An unusable Secret is shown on the Proxy and looked
/// at again at the drift poll; one the API server could not give is retried, and nothing
/// changes meanwhile.
fn cloud_init_text(
    input: &Input<'_>,
    facts: &Facts,
    timings: &Timings,
    mut status: ProxyStatus,
) -> ControlFlow<Next, (ProxyStatus, Vec<u8>)> {
    match cloud_init(input, facts) {
        Err(action) => ControlFlow::Break(Next::Do(action)),
        Ok(Err(SecretProblem::Unusable(why))) => {
            set_provisioned(
                input,
                &mut status,
                ConditionStatus::False,
                reasons::CLOUD_INIT_ERROR,
                &why,
            );
            ControlFlow::Break(finish(
                input,
                status,
                InstanceView::Unobserved,
                Requeue::After(timings.drift_poll),
            ))
        }
        // The API server could not answer: retry, and change nothing meanwhile.
        Ok(Err(SecretProblem::Unavailable(why))) => ControlFlow::Break(unavailable(input, &why)),
        Ok(Ok(text)) => ControlFlow::Continue((status, text)),
    }
}

/// The spec hash the recorded instance was built from: the one this pass wrote, else the
/// annotation's.
pub(super) fn recorded_hash(proxy: &Proxy, facts: &Facts) -> Option<String> {
    facts.spec_hash_written.clone().or_else(|| {
        proxy
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(egress_api::ANNOTATION_SPEC_HASH))
            .cloned()
    })
}

/// Steps 5, 7 and 8 for the instance the status records, `hash` being the current spec's and
/// `annotation` the one it was built from: adopted as it is, replaced after a spec change, or
/// observed. `Continue` when none is recorded, or when the recorded one is gone: then with the
/// status cleared of it, and its id.
fn recorded_instance(
    input: &Input<'_>,
    facts: &Facts,
    timings: &Timings,
    mut status: ProxyStatus,
    hash: &str,
    annotation: Option<&str>,
) -> ControlFlow<Next, (ProxyStatus, Option<ProviderId>)> {
    if status.provider_id.is_empty() {
        return ControlFlow::Continue((status, None));
    }
    let proxy = input.proxy;
    let id = ProviderId::new(status.provider_id.clone());
    let next = match annotation {
        // An instance without a recorded hash is adopted as it is.
        None => Next::Do(Action::WriteSpecHash(hash.to_owned())),
        // Another operator's hash over a spec it had reconciled: adopt, replace nothing.
        Some(recorded) if recorded != hash && adoptable(proxy, recorded, hash) => Next::Do(Action::AdoptInstance {
            hash: hash.to_owned(),
            previous: recorded.to_owned(),
        }),
        // 7. The spec changed: replace.
        Some(recorded) if recorded != hash => match &facts.get {
            None => Next::Do(Action::Get(id)),
            // The old instance is gone: record the new hash; the next step then finds the
            // hash current and the instance gone, and creates.
            Some(Err(f)) if f.class == ErrorClass::NotFound => Next::Do(Action::WriteSpecHash(hash.to_owned())),
            Some(Err(f)) => provider_failure(input, timings, status, InstanceView::Unobserved, f),
            Some(Ok(_)) => replace(
                input,
                facts,
                timings,
                status,
                id,
                "replacing the instance after a spec change",
            ),
        },
        // 8. Observe the instance.
        Some(_) => match &facts.get {
            None => Next::Do(Action::Get(id)),
            Some(Err(f)) if f.class == ErrorClass::NotFound => {
                if pool_member(proxy) {
                    return ControlFlow::Break(lost_pool_member(input, timings, status, "the instance is gone"));
                }
                // It vanished (or, in a replacement, the old one is gone): build it again.
                status.provider_id.clear();
                status.ip.clear();
                return ControlFlow::Continue((status, Some(id)));
            }
            Some(Err(f)) => provider_failure(input, timings, status, InstanceView::Unobserved, f),
            Some(Ok(instance)) => match installation_mark(input, facts, &status, instance) {
                Some(mark) => Next::Do(mark),
                None => observed(input, facts, timings, status, instance),
            },
        },
    };
    ControlFlow::Break(next)
}

/// Step 6, the create of the next instance from the cloud-init `text`, `vanished` being the
/// recorded one this pass saw gone: Generated credentials first (new ones for a new instance,
/// written before it is made), then the provider entry's create budget, then the create.
fn create_path(
    input: &Input<'_>,
    facts: &Facts,
    timings: &Timings,
    status: ProxyStatus,
    text: Vec<u8>,
    vanished: Option<ProviderId>,
) -> Next {
    let generated = input.proxy.spec.credentials_type() == CredentialsType::Generated;
    let (status, credentials) = if generated {
        match credentials_for_create(input, facts, timings, status, vanished) {
            ControlFlow::Continue((status, credentials)) => (status, Some(credentials)),
            ControlFlow::Break(next) => return next,
        }
    } else {
        (status, None)
    };
    if let Some(deferral) = &facts.create_deferred {
        return create_deferred(input, status, deferral);
    }
    match &facts.create {
        None => Next::Do(Action::Create {
            cloud_init: text,
            credentials,
        }),
        Some(Err(f)) => provider_failure(input, timings, status, InstanceView::Unobserved, f),
        Some(Ok(id)) => created(input, facts, timings, status, id, generated),
    }
}

/// The Generated credentials for the create, or what stands between the Proxy and them: an
/// action, a provider failure, an instance to replace first, or a Secret problem.
fn credentials_for_create(
    input: &Input<'_>,
    facts: &Facts,
    timings: &Timings,
    mut status: ProxyStatus,
    vanished: Option<ProviderId>,
) -> ControlFlow<Next, (ProxyStatus, ProxyCredentials)> {
    let next = match generated_credentials(facts, vanished) {
        Ok(credentials) => return ControlFlow::Continue((status, credentials)),
        Err(Pending::Do(action)) => Next::Do(action),
        Err(Pending::Provider(f)) => provider_failure(input, timings, status, InstanceView::Unobserved, &f),
        Err(Pending::Replace(instance)) => replace(
            input,
            facts,
            timings,
            status,
            instance,
            "the credentials Secret was edited and no longer holds the instance's credentials; replacing the instance so it gets new ones",
        ),
        Err(Pending::Problem(SecretProblem::Unusable(why))) => {
            set_provisioned(
                input,
                &mut status,
                ConditionStatus::False,
                reasons::CREDENTIALS_ERROR,
                &why,
            );
            finish(
                input,
                status,
                InstanceView::Unobserved,
                Requeue::After(timings.drift_poll),
            )
        }
        Err(Pending::Problem(SecretProblem::Unavailable(why))) => unavailable(input, &why),
    };
    ControlFlow::Break(next)
}

/// The provider created instance `id`: the Proxy records it and it boots, once Generated
/// credentials are bound to it.
fn created(
    input: &Input<'_>,
    facts: &Facts,
    timings: &Timings,
    mut status: ProxyStatus,
    id: &ProviderId,
    generated: bool,
) -> Next {
    if generated {
        match &facts.credentials_bound {
            None => return Next::Do(Action::BindCredentials(id.clone())),
            // Not recorded: the next pass creates again (the provider answers with this
            // instance) and reuses the same credentials, then records them; or, when
            // the status still names this id (a replacement on a provider whose ids
            // come from the name), the check of the running instance records them.
            Some(Err(SecretProblem::Unavailable(why) | SecretProblem::Unusable(why))) => {
                return unavailable(input, why);
            }
            Some(Ok(())) => {}
        }
    }
    status.provider_id = id.as_str().to_string();
    booting(input, timings, status)
}

/// The create waits for the provider entry's create budget: nothing was asked of the provider,
/// and the Proxy shows the wait and comes back when a token is due. Whatever was prepared for
/// the create (credentials written to their Secret, the spec hash) stays: the next pass finds it
/// and reuses it.
fn create_deferred(input: &Input<'_>, mut status: ProxyStatus, deferral: &Deferral) -> Next {
    let message = format!(
        "waiting for provider entry \"{}\"'s create budget ({} per minute); about {}s",
        input.proxy.spec.provider,
        deferral.per_minute,
        deferral.wait.as_secs() + u64::from(deferral.wait.subsec_nanos() > 0),
    );
    set_provisioned(
        input,
        &mut status,
        ConditionStatus::False,
        reasons::CREATE_BUDGET,
        &message,
    );
    if status.ip.is_empty() {
        // No instance, nothing probed: no health verdict either.
        apply_verdict(&mut status, None, generation(input.proxy), &input.now);
    }
    finish(input, status, InstanceView::Unobserved, Requeue::After(deferral.wait))
}

/// What stands between a Generated Proxy and the credentials of its next create.
enum Pending {
    Do(Action),
    Problem(SecretProblem),
    Provider(ProviderFailure),
    /// The instance the Secret names exists, but its credentials are lost: delete it first.
    Replace(ProviderId),
}

/// The credentials for the create of a Generated Proxy. `vanished` is the instance this pass
/// saw gone. A Secret bound to an instance nobody saw gone (the status write after a create was
/// lost, or a new leader took over) keeps its credentials while the provider still has that
/// instance: the create adopts it, and it was made with them. If the Secret no longer holds
/// them intact, that instance is replaced first. An instance the provider refuses to look up
/// (Permanent: an id edited by hand, another entry's) counts as gone.
fn generated_credentials(facts: &Facts, vanished: Option<ProviderId>) -> Result<ProxyCredentials, Pending> {
    match &facts.credentials {
        None => Err(Pending::Do(Action::PrepareCredentials { gone: vanished })),
        Some(Err(problem)) => Err(Pending::Problem(problem.clone())),
        Some(Ok(Prepared::Ready(c))) => Ok(c.clone()),
        Some(Ok(Prepared::Bound { instance, credentials })) => match &facts.bound_instance {
            None => Err(Pending::Do(Action::GetBound(instance.clone()))),
            Some((asked, answer)) if asked == instance => match (answer, credentials) {
                (Ok(_), Some(credentials)) => Ok(credentials.clone()),
                (Ok(_), None) => Err(Pending::Replace(instance.clone())),
                (Err(f), _) if matches!(f.class, ErrorClass::NotFound | ErrorClass::Permanent) => {
                    Err(Pending::Do(Action::PrepareCredentials {
                        gone: Some(instance.clone()),
                    }))
                }
                (Err(f), _) => Err(Pending::Provider(f.clone())),
            },
            // Read again, the Secret names yet another instance: start over in the next pass.
            Some(_) => Err(Pending::Problem(SecretProblem::Unavailable(
                "the credentials Secret changed during the pass; reading it again".into(),
            ))),
        },
    }
}

/// The installation mark for the Proxy's recorded instance, as found by this pass's `Get`, when
/// it needs one (issue 51): the operator runs with an installation, the instance runs and
/// carries no installation mark, and this pass has not asked yet. Only an instance without a
/// mark is this installation's to mark: one carrying another installation's mark is that
/// installation's, and is never changed. One that does not run yet waits for a later pass (a
/// create of this operator wrote the mark already, and a provider may not read it back before
/// the instance exists). A failure is not this pass's concern: the next pass asks again.
fn installation_mark(input: &Input<'_>, facts: &Facts, status: &ProxyStatus, instance: &Instance) -> Option<Action> {
    let installation = input.installation?;
    let unmarked = instance.installation.as_deref().is_none_or(str::is_empty);
    let asked = facts.marked.is_some();
    (unmarked && !asked && instance.state == InstanceState::Running).then(|| Action::MarkInstallation {
        // The id as recorded in the status, which is what the provider is promised.
        id: ProviderId::new(status.provider_id.clone()),
        installation: installation.to_owned(),
    })
}

/// Whether the status shows that the instance it records was built from the current spec: its
/// `Provisioned` condition says the instance runs (True), or boots after its create (False,
/// `Provisioning`, "waiting for the instance to run"), and was set at `metadata.generation`. A
/// condition without `observedGeneration` cannot say which spec it saw, so then only a spec never
/// edited (generation 1) counts. Any other state (a replacement under way, a stopped instance,
/// an error) does not: the instance may be older than the spec.
pub fn built_from_current_spec(proxy: &Proxy) -> bool {
    let Some(generation) = proxy.metadata.generation else {
        return false;
    };
    let Some(provisioned) = proxy
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == conditions::PROVISIONED)
    else {
        return false;
    };
    let settled = match provisioned.status {
        ConditionStatus::True => true,
        ConditionStatus::False => provisioned.reason == reasons::PROVISIONING && provisioned.message == WAITING_TO_RUN,
        ConditionStatus::Unknown => false,
    };
    settled
        && provisioned
            .observed_generation
            .map_or(generation == 1, |observed| observed == generation)
}

/// Whether the instance recorded under `recorded` is adopted rather than replaced, `hash` being
/// the current spec's: the value is not one this operator writes (another operator's, or this
/// one's before its hashes carried a version), and either it is this operator's pre-version
/// value of this very spec, or the status shows the instance was built from the current spec
/// ([`built_from_current_spec`]). A spec edited since (during the switch, say), or a replacement
/// the other operator had begun, is replaced, as the other operator would have done.
pub fn adoptable(proxy: &Proxy, recorded: &str, hash: &str) -> bool {
    if spec_hash::is_own(recorded) {
        return false;
    }
    hash.strip_prefix(spec_hash::VERSION_PREFIX) == Some(recorded) || built_from_current_spec(proxy)
}

/// The cloud-init text, once known: inline text is at hand, a Secret needs a read.
pub(super) fn cloud_init(input: &Input<'_>, facts: &Facts) -> Result<Result<Vec<u8>, SecretProblem>, Action> {
    let both = || {
        SecretProblem::Unusable("exactly one of spec.cloudInit.inline and spec.cloudInit.secretRef must be set".into())
    };
    match &input.proxy.spec.cloud_init {
        None => Ok(Ok(Vec::new())),
        Some(ci) => match (&ci.inline, &ci.secret_ref) {
            (Some(text), None) => Ok(Ok(text.clone().into_bytes())),
            (None, Some(secret)) => match &facts.secret {
                None => Err(Action::ReadSecret(secret.clone())),
                Some(result) => Ok(result.clone()),
            },
            (None, None) => Ok(Ok(Vec::new())),
            (Some(_), Some(_)) => Ok(Err(both())),
        },
    }
}
