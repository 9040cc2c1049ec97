//! The reconciler's decision for one Proxy, as a pure function (spec/core.md §3).
//!
//! A pass is a loop: [`next`] looks at the Proxy as fetched and at the [`Facts`] gathered so
//! far in this pass, and answers either an [`Action`] to perform (a metadata write, a secret
//! read, a provider call) or the end of the pass ([`Outcome`]: the status to flush and when to
//! come back). The caller performs the action, records its result in the facts and asks again.
//! Each call replays the rules from the top, so the order of the rules is the order of the
//! code below, and every branch can be tested without I/O.
//!
//! A pass performs each kind of provider call at most once (the instance the credentials Secret
//! names is asked about apart from the recorded one, and credentials are prepared at most twice),
//! so the loop ends after a handful of steps; the caller still bounds it.
//!
//! Long file: the decision is one pure function over one set of facts; its rules read in the order
//! of a pass.

use std::time::Duration;

use egress_api::{
    ConditionStatus, CredentialsType, FINALIZER, Mode, Proxy, ProxyStatus, SecretRef, conditions, reasons,
};
use egress_provider::{ErrorClass, Instance, InstanceState, ProviderId, ProxyCredentials};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::conditions::{remove_condition, set_condition};
use crate::create_budget::Deferral;
use crate::proxy::credentials::{Prepared, Refusal, Serving};
use crate::proxy::secret::SecretProblem;
use crate::proxy::spec_hash::spec_hash;
use crate::proxy::status::{InstanceView, Verdict, apply_verdict, last_verdict, latched, phase, provider_missing};

/// The reconciler's waits (spec/core.md §3.2). Tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// While an instance is being created or booting.
    pub provisioning_poll: Duration,
    /// While waiting for an instance to disappear.
    pub deletion_poll: Duration,
    /// Steady-state recheck of a running instance.
    pub drift_poll: Duration,
    /// A short follow-up, after adding the finalizer.
    pub requeue_now: Duration,
    /// After a quota error.
    pub quota_retry: Duration,
    /// The most one pass's provider calls may take together (spec/kvm.md item 55, decided): the
    /// pass's context carries this deadline, so a call or a lock wait that would outlive it
    /// returns Transient and the Proxy is requeued with backoff, freeing its worker. Longer than
    /// any provider's longest single operation (a kvm image transfer, 20 minutes, then the start).
    pub pass_deadline: Duration,
    /// How long a running instance may report no address (a guest-agent restart, say) before
    /// the Proxy shows it booting again (spec/kvm.md item 54): until then its last address and
    /// `Provisioned=True` stay, and it is polled at the provisioning period.
    pub address_grace: Duration,
    /// How long an instance may go without an address before it is replaced (`None`: never,
    /// as in the Go operator). Counted from the first pass that found it without one, so it
    /// covers a guest that never gets an address (no DHCP on its network, an image that never
    /// brings its network up) and one that lost its address for longer than the grace.
    pub address_budget: Option<Duration>,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            provisioning_poll: Duration::from_secs(10),
            deletion_poll: Duration::from_secs(10),
            drift_poll: Duration::from_secs(120),
            requeue_now: Duration::from_secs(1),
            quota_retry: Duration::from_secs(300),
            pass_deadline: Duration::from_secs(25 * 60),
            address_grace: Duration::from_secs(30),
            address_budget: Some(DEFAULT_ADDRESS_BUDGET),
        }
    }
}

/// [`Timings::address_budget`] unless `--provisioning-timeout` says otherwise: long enough for
/// a software-emulated guest's boot many times over, short enough that a guest that will never
/// get an address does not hold a Proxy's place for good.
pub const DEFAULT_ADDRESS_BUDGET: Duration = Duration::from_secs(15 * 60);

/// A failed provider call, as the decision needs it: its class and its (already redacted) text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderFailure {
    pub class: ErrorClass,
    pub message: String,
}

/// What is known about the Proxy before the pass starts.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// The Proxy as fetched (the base the status patch is computed against).
    pub proxy: &'a Proxy,
    /// Whether `spec.provider` names a configured provider.
    pub provider_configured: bool,
    /// The configured providers' names, for the message when `spec.provider` is not one.
    pub configured_providers: &'a [String],
    /// The health engine's verdict for this Proxy, if it has one.
    pub verdict: Option<Verdict>,
    /// Whether the credential cache already shows the Generated Proxy's Secret serving the
    /// instance its status records; when it does not, the running instance's Secret is read
    /// from the API server before the instance is trusted.
    pub credentials_cached: bool,
    /// Why the user's credentials Secret of an External Proxy may not serve it (it does not
    /// name the Proxy, say), as the credential cache decides; `None` when it may, or when the
    /// cache does not have it.
    pub credentials_refused: Option<Refusal>,
    /// Since when the passes before this one have found the Proxy's instance without an
    /// address (kept in memory by the reconciler); `None` when the last one found it with one.
    pub address_missing_since: Option<Time>,
    /// Why an External Proxy is refused: its namespace, or an internal destination
    /// ([`crate::proxy::destinations::ExternalRules::refusal`]); `None` when it is not.
    pub external_refused: Option<crate::proxy::destinations::Refused>,
    /// The installation the operator runs as, if any: the Proxy's running instance that carries
    /// no installation mark is marked as this one's ([`Action::MarkInstallation`]).
    pub installation: Option<&'a str>,
    pub now: Time,
}

/// What this pass has done and learned so far. Its `Debug` shows the cloud-init size only.
#[derive(Clone, Default)]
pub struct Facts {
    pub finalizer_added: bool,
    pub finalizer_removed: bool,
    /// The spec hash written into the annotation in this pass.
    pub spec_hash_written: Option<String>,
    /// The other operator's spec hash this pass adopted the instance from.
    pub adopted_from: Option<String>,
    /// The cloud-init text from the Secret, or why it could not be read.
    pub secret: Option<Result<Vec<u8>, SecretProblem>>,
    pub get: Option<Result<Instance, ProviderFailure>>,
    pub create: Option<Result<ProviderId, ProviderFailure>>,
    pub delete: Option<Result<(), ProviderFailure>>,
    /// The credentials for the create (Generated), or why there are none.
    pub credentials: Option<Result<Prepared, SecretProblem>>,
    /// The instance the credentials Secret names, as the provider answered for it.
    pub bound_instance: Option<(ProviderId, Result<Instance, ProviderFailure>)>,
    /// Whether the created instance was recorded on the credentials Secret.
    pub credentials_bound: Option<Result<(), SecretProblem>>,
    /// What the credentials Secret is to the running instance.
    pub credentials_checked: Option<Result<Serving, SecretProblem>>,
    /// The create was not made: the provider entry's create budget had no room.
    pub create_deferred: Option<Deferral>,
    /// What the provider answered to marking the instance with the installation.
    pub marked: Option<Result<(), ProviderFailure>>,
}

/// The next thing to do. Its `Debug` shows the cloud-init size only: it may hold secrets.
#[derive(Clone, PartialEq, Eq)]
pub enum Action {
    AddFinalizer,
    RemoveFinalizer,
    /// Write this value into the `crawl.example.com/spec-hash` annotation.
    WriteSpecHash(String),
    /// Adopt the recorded instance: write `hash` into the spec-hash annotation and keep the
    /// other operator's value in `crawl.example.com/previous-spec-hash`.
    AdoptInstance {
        hash: String,
        previous: String,
    },
    /// Read the cloud-init Secret (labelled Secrets only).
    ReadSecret(SecretRef),
    Get(ProviderId),
    /// Read or write the credentials Secret of a Generated Proxy for the next create; `gone` is
    /// the instance this pass saw gone, whose credentials must not be reused.
    PrepareCredentials {
        gone: Option<ProviderId>,
    },
    /// Ask the provider for the instance the credentials Secret names.
    GetBound(ProviderId),
    /// Record on the credentials Secret the instance made with them.
    BindCredentials(ProviderId),
    /// Read the credentials Secret: does it still serve this running instance?
    CheckCredentials(ProviderId),
    /// Create the instance from the spec with this cloud-init and these credentials, if the
    /// provider entry's create budget has room (else the create is deferred).
    Create {
        cloud_init: Vec<u8>,
        credentials: Option<ProxyCredentials>,
    },
    Delete(ProviderId),
    /// Write the installation mark on the instance, which carries none: so this installation's
    /// orphan GC may collect it once its Proxy is gone.
    MarkInstallation {
        id: ProviderId,
        installation: String,
    },
}

impl std::fmt::Debug for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AddFinalizer => f.write_str("AddFinalizer"),
            Self::RemoveFinalizer => f.write_str("RemoveFinalizer"),
            Self::WriteSpecHash(h) => f.debug_tuple("WriteSpecHash").field(h).finish(),
            Self::AdoptInstance { hash, previous } => f
                .debug_struct("AdoptInstance")
                .field("hash", hash)
                .field("previous", previous)
                .finish(),
            Self::ReadSecret(r) => f.debug_tuple("ReadSecret").field(r).finish(),
            Self::Get(id) => f.debug_tuple("Get").field(id).finish(),
            Self::PrepareCredentials { gone } => f.debug_struct("PrepareCredentials").field("gone", gone).finish(),
            Self::GetBound(id) => f.debug_tuple("GetBound").field(id).finish(),
            Self::BindCredentials(id) => f.debug_tuple("BindCredentials").field(id).finish(),
            Self::CheckCredentials(id) => f.debug_tuple("CheckCredentials").field(id).finish(),
            Self::Create {
                cloud_init,
                credentials,
            } => write!(
                f,
                "Create {{ cloud_init: <{} bytes>, credentials: {credentials:?} }}",
                cloud_init.len()
            ),
            Self::Delete(id) => f.debug_tuple("Delete").field(id).finish(),
            Self::MarkInstallation { id, installation } => f
                .debug_struct("MarkInstallation")
                .field("id", id)
                .field("installation", installation)
                .finish(),
        }
    }
}

impl std::fmt::Debug for Facts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = self.secret.as_ref().map(|r| match r {
            Ok(text) => format!("Ok(<{} bytes>)", text.len()),
            Err(e) => format!("Err({e:?})"),
        });
        f.debug_struct("Facts")
            .field("finalizer_added", &self.finalizer_added)
            .field("finalizer_removed", &self.finalizer_removed)
            .field("spec_hash_written", &self.spec_hash_written)
            .field("secret", &secret)
            .field("get", &self.get)
            .field("create", &self.create)
            .field("delete", &self.delete)
            .field("credentials", &self.credentials)
            .field("bound_instance", &self.bound_instance)
            .field("credentials_bound", &self.credentials_bound)
            .field("credentials_checked", &self.credentials_checked)
            .field("create_deferred", &self.create_deferred)
            .field("marked", &self.marked)
            .finish()
    }
}

/// When the Proxy is reconciled again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    After(Duration),
    /// Only when something changes (a watch event, a health event, the periodic resync).
    Never,
    /// A failure for the workqueue's exponential backoff.
    Error(String),
}

/// Something a person wants to know about, logged (and later recorded as an Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Deletion released the Proxy without provider cleanup because of the annotation.
    SkipCleanup { provider_id: String },
    /// `Get` failed permanently during deletion, but `Delete` succeeded.
    UnreachableButCleaned { provider_id: String, get_error: String },
    /// The instance was adopted from another operator's spec hash, not replaced.
    Adopted { provider_id: String, previous: String },
    /// Deletion released the Proxy without deleting its recorded instance: the instance's own
    /// mark names another Proxy (review M2).
    LeftToItsOwner { provider_id: String, owner: String },
}

/// The end of a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The status to flush (written only if it differs from the fetched one).
    pub status: ProxyStatus,
    pub requeue: Requeue,
    pub note: Option<Note>,
    /// The instance this pass marked with the installation, if it did (an event says so).
    pub marked: Option<Marked>,
}

/// An instance a pass marked with the operator's installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marked {
    pub provider_id: String,
    pub installation: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Do(Action),
    Done(Outcome),
}

/// Whether this step of the pass belongs to a replacement (an instance is recorded and the spec
/// hash it was built from differs from the spec's): the `reconcile.replaceInstance` span.
pub fn replacing(input: &Input<'_>, facts: &Facts) -> bool {
    let proxy = input.proxy;
    if proxy.metadata.deletion_timestamp.is_some() || proxy.spec.mode != Mode::Managed {
        return false;
    }
    if proxy.status.as_ref().is_none_or(|s| s.provider_id.is_empty()) {
        return false;
    }
    let Ok(Ok(text)) = cloud_init(input, facts) else {
        return false;
    };
    let hash = spec_hash(&proxy.spec, &text);
    let recorded = facts.spec_hash_written.clone().or_else(|| {
        proxy
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(egress_api::ANNOTATION_SPEC_HASH))
            .cloned()
    });
    recorded.is_some_and(|r| r != hash && !adoptable(proxy, &r, &hash))
}

/// The message on `Provisioned=False` while an instance boots.
pub const WAITING_TO_RUN: &str = "waiting for the instance to run";

/// Review M2: the Proxy UID an instance's own mark names, when it is not this Proxy's. A
/// provider that records no UID (an empty one) names nobody.
pub fn foreign_owner<'i>(proxy: &Proxy, instance: &'i Instance) -> Option<&'i str> {
    let ours = proxy.metadata.uid.as_deref().unwrap_or_default();
    let theirs = instance.uid.as_str();
    (!theirs.is_empty() && !ours.is_empty() && !theirs.eq_ignore_ascii_case(ours)).then_some(theirs)
}

/// `facts` with every instance another Proxy's mark names read as a Permanent failure of its
/// lookup: such an instance is neither used, adopted, replaced nor deleted.
fn owned_facts(proxy: &Proxy, facts: &Facts) -> Facts {
    let refuse = |answer: &Result<Instance, ProviderFailure>| match answer {
        Ok(instance) => match foreign_owner(proxy, instance) {
            Some(owner) => Err(ProviderFailure {
                class: ErrorClass::Permanent,
                message: format!(
                    "instance {} is marked as Proxy UID {owner}'s, not this Proxy's ({}); it is neither used \
                     nor deleted",
                    instance.id.as_str(),
                    proxy.metadata.uid.as_deref().unwrap_or_default()
                ),
            }),
            None => Ok(instance.clone()),
        },
        Err(f) => Err(f.clone()),
    };
    let mut owned = facts.clone();
    owned.get = facts.get.as_ref().map(refuse);
    owned.bound_instance = facts
        .bound_instance
        .as_ref()
        .map(|(id, answer)| (id.clone(), refuse(answer)));
    owned
}

/// The decision for one step of a pass.
pub fn next(input: &Input<'_>, facts: &Facts, timings: &Timings) -> Next {
    let proxy = input.proxy;
    let status = proxy.status.clone().unwrap_or_default();
    if proxy.metadata.deletion_timestamp.is_some() {
        return delete_path(input, facts, timings, status);
    }
    let facts = &owned_facts(proxy, facts);
    match proxy.spec.mode {
        Mode::External => Next::Done(external_path(input, status)),
        Mode::Managed => said(input, facts, managed_path(input, facts, timings, status)),
    }
}

/// The end of a managed pass with what it did on the way that its status does not show, so
/// its events say it whatever it went on to find: an adoption (its note) and an installation
/// mark written.
fn said(input: &Input<'_>, facts: &Facts, next: Next) -> Next {
    let Next::Done(mut outcome) = next else {
        return next;
    };
    let recorded = || {
        input
            .proxy
            .status
            .as_ref()
            .map(|s| s.provider_id.clone())
            .unwrap_or_default()
    };
    if let (Some(previous), None) = (&facts.adopted_from, &outcome.note) {
        outcome.note = Some(Note::Adopted {
            provider_id: recorded(),
            previous: previous.clone(),
        });
    }
    if let (Some(Ok(())), Some(installation)) = (&facts.marked, input.installation) {
        outcome.marked = Some(Marked {
            provider_id: recorded(),
            installation: installation.to_owned(),
        });
    }
    Next::Done(outcome)
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
    if crate::proxy::spec_hash::is_own(recorded) {
        return false;
    }
    hash.strip_prefix(crate::proxy::spec_hash::VERSION_PREFIX) == Some(recorded) || built_from_current_spec(proxy)
}

fn has_finalizer(proxy: &Proxy) -> bool {
    proxy
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

fn generation(proxy: &Proxy) -> Option<i64> {
    proxy.metadata.generation
}

/// Ends the pass, with the health verdict and the phase filled in.
fn finish(input: &Input<'_>, status: ProxyStatus, instance: InstanceView, requeue: Requeue) -> Next {
    Next::Done(outcome(input, status, instance, requeue))
}

/// Fills the health verdict and the phase.
fn outcome(input: &Input<'_>, mut status: ProxyStatus, instance: InstanceView, requeue: Requeue) -> Outcome {
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

fn set_provisioned(input: &Input<'_>, status: &mut ProxyStatus, value: ConditionStatus, reason: &str, message: &str) {
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

fn external_path(input: &Input<'_>, mut status: ProxyStatus) -> Outcome {
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

/// The cloud-init text, once known: inline text is at hand, a Secret needs a read.
fn cloud_init(input: &Input<'_>, facts: &Facts) -> Result<Result<Vec<u8>, SecretProblem>, Action> {
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

/// `providerFailure` (spec/core.md §3.8).
fn provider_failure(
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

fn managed_path(input: &Input<'_>, facts: &Facts, timings: &Timings, mut status: ProxyStatus) -> Next {
    let proxy = input.proxy;
    // 1. The finalizer first, in a pass of its own.
    if !has_finalizer(proxy) {
        if !facts.finalizer_added {
            return Next::Do(Action::AddFinalizer);
        }
        return finish(
            input,
            status,
            InstanceView::Unobserved,
            Requeue::After(timings.requeue_now),
        );
    }
    // 2. A latched permanent error waits for a spec change.
    if latched(&status, generation(proxy)) {
        return finish(input, status, InstanceView::Unobserved, Requeue::Never);
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
        return finish(input, status, InstanceView::Unobserved, Requeue::Never);
    }
    // 4. Cloud-init.
    let text = match cloud_init(input, facts) {
        Err(action) => return Next::Do(action),
        Ok(Err(SecretProblem::Unusable(why))) => {
            set_provisioned(
                input,
                &mut status,
                ConditionStatus::False,
                reasons::CLOUD_INIT_ERROR,
                &why,
            );
            return finish(
                input,
                status,
                InstanceView::Unobserved,
                Requeue::After(timings.drift_poll),
            );
        }
        // The API server could not answer: retry, and change nothing meanwhile.
        Ok(Err(SecretProblem::Unavailable(why))) => {
            let status = input.proxy.status.clone().unwrap_or_default();
            return Next::Done(Outcome {
                status,
                requeue: Requeue::Error(why),
                note: None,
                marked: None,
            });
        }
        Ok(Ok(text)) => text,
    };
    // 5. What the instance should be built from.
    let hash = spec_hash(&proxy.spec, &text);
    let annotation = facts.spec_hash_written.clone().or_else(|| {
        proxy
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(egress_api::ANNOTATION_SPEC_HASH))
            .cloned()
    });
    // The recorded instance, when this pass saw it gone: its credentials are not kept.
    let mut vanished = None;
    if !status.provider_id.is_empty() {
        let id = ProviderId::new(status.provider_id.clone());
        match annotation.as_deref() {
            // An instance without a recorded hash is adopted as it is.
            None => return Next::Do(Action::WriteSpecHash(hash)),
            // Another operator's hash over a spec it had reconciled: adopt, replace nothing.
            Some(recorded) if recorded != hash && adoptable(proxy, recorded, &hash) => {
                return Next::Do(Action::AdoptInstance {
                    hash,
                    previous: recorded.to_owned(),
                });
            }
            // 7. The spec changed: replace.
            Some(recorded) if recorded != hash => match &facts.get {
                None => return Next::Do(Action::Get(id)),
                // The old instance is gone: record the new hash; the next step then finds the
                // hash current and the instance gone, and creates.
                Some(Err(f)) if f.class == ErrorClass::NotFound => return Next::Do(Action::WriteSpecHash(hash)),
                Some(Err(f)) => return provider_failure(input, timings, status, InstanceView::Unobserved, f),
                Some(Ok(_)) => {
                    return replace(
                        input,
                        facts,
                        timings,
                        status,
                        id,
                        "replacing the instance after a spec change",
                    );
                }
            },
            // 8. Observe the instance.
            Some(_) => match &facts.get {
                None => return Next::Do(Action::Get(id)),
                Some(Err(f)) if f.class == ErrorClass::NotFound => {
                    if pool_member(proxy) {
                        return lost_pool_member(input, timings, status, "the instance is gone");
                    }
                    // It vanished (or, in a replacement, the old one is gone): build it again.
                }
                Some(Err(f)) => return provider_failure(input, timings, status, InstanceView::Unobserved, f),
                Some(Ok(instance)) => {
                    if let Some(mark) = installation_mark(input, facts, &status, instance) {
                        return Next::Do(mark);
                    }
                    return observed(input, facts, timings, status, instance);
                }
            },
        }
        // The recorded instance is gone.
        status.provider_id.clear();
        status.ip.clear();
        vanished = Some(id);
    }
    // 6. No instance recorded: make sure the annotation describes what is built, then create.
    if annotation.as_deref() != Some(hash.as_str()) {
        return Next::Do(Action::WriteSpecHash(hash));
    }
    // Generated credentials: new ones for a new instance, written before it is made.
    let generated = proxy.spec.credentials_type() == CredentialsType::Generated;
    let credentials = if generated {
        match generated_credentials(facts, vanished) {
            Ok(c) => Some(c),
            Err(Pending::Do(action)) => return Next::Do(action),
            Err(Pending::Provider(f)) => {
                return provider_failure(input, timings, status, InstanceView::Unobserved, &f);
            }
            Err(Pending::Replace(instance)) => {
                return replace(
                    input,
                    facts,
                    timings,
                    status,
                    instance,
                    "the credentials Secret was edited and no longer holds the instance's credentials; replacing the instance so it gets new ones",
                );
            }
            Err(Pending::Problem(SecretProblem::Unusable(why))) => {
                set_provisioned(
                    input,
                    &mut status,
                    ConditionStatus::False,
                    reasons::CREDENTIALS_ERROR,
                    &why,
                );
                return finish(
                    input,
                    status,
                    InstanceView::Unobserved,
                    Requeue::After(timings.drift_poll),
                );
            }
            Err(Pending::Problem(SecretProblem::Unavailable(why))) => return unavailable(input, &why),
        }
    } else {
        None
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
        Some(Ok(id)) => {
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
    }
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

/// The API server could not answer: retry with backoff, the status left exactly as fetched.
fn unavailable(input: &Input<'_>, why: &str) -> Next {
    Next::Done(Outcome {
        status: input.proxy.status.clone().unwrap_or_default(),
        requeue: Requeue::Error(why.to_owned()),
        note: None,
        marked: None,
    })
}

/// The instance exists but is not running yet: no address, `Provisioned=False`, poll again soon.
fn booting(input: &Input<'_>, timings: &Timings, mut status: ProxyStatus) -> Next {
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
fn no_address(input: &Input<'_>, facts: &Facts, timings: &Timings, status: ProxyStatus) -> Next {
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
fn pool_member(proxy: &Proxy) -> bool {
    proxy.pool().is_some()
}

/// A pool member whose instance is lost is not rebuilt here (docs/pools.md): its pool promotes a
/// standby and deletes the member, so one failure makes one create (the pool's new standby).
/// The loss is reported and the recorded id kept, so no later pass creates either; the member's
/// delete removes what is left of the instance.
fn lost_pool_member(input: &Input<'_>, timings: &Timings, mut status: ProxyStatus, what: &str) -> Next {
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
fn observed(input: &Input<'_>, facts: &Facts, timings: &Timings, mut status: ProxyStatus, instance: &Instance) -> Next {
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
fn replace(
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

/// `deletionFailure` (spec/core.md §3.8): never gives up.
fn deletion_failure(timings: &Timings, status: ProxyStatus, message: String, class: ErrorClass) -> Outcome {
    let requeue = match class {
        ErrorClass::QuotaExceeded => Requeue::After(timings.quota_retry),
        _ => Requeue::Error(message),
    };
    Outcome {
        status,
        requeue,
        note: None,
        marked: None,
    }
}

fn delete_path(input: &Input<'_>, facts: &Facts, timings: &Timings, mut status: ProxyStatus) -> Next {
    let proxy = input.proxy;
    status.phase = Some(egress_api::Phase::Deleting);
    let done = |status: ProxyStatus, requeue: Requeue, note: Option<Note>| {
        Next::Done(Outcome {
            status,
            requeue,
            note,
            marked: None,
        })
    };
    let release = |status: ProxyStatus, note: Option<Note>| {
        if facts.finalizer_removed {
            Next::Done(Outcome {
                status,
                requeue: Requeue::Never,
                note,
                marked: None,
            })
        } else {
            Next::Do(Action::RemoveFinalizer)
        }
    };
    // 1. Not ours to clean up.
    if !has_finalizer(proxy) {
        return done(status, Requeue::Never, None);
    }
    // 2. Nothing was ever recorded as created.
    if status.provider_id.is_empty() {
        return release(status, None);
    }
    let id = ProviderId::new(status.provider_id.clone());
    // 3. The escape hatch, before the provider lookup.
    if proxy.skip_cleanup() {
        let note = Note::SkipCleanup {
            provider_id: id.as_str().to_string(),
        };
        return release(status, Some(note));
    }
    // 4. Cleanup needs the provider.
    if !input.provider_configured {
        let message = format!(
            "provider \"{}\" is not configured; cannot clean up instance {}",
            proxy.spec.provider,
            id.as_str()
        );
        return done(status, Requeue::Error(message), None);
    }
    // 5. Where is it?
    match &facts.get {
        None => Next::Do(Action::Get(id)),
        Some(Err(f)) if f.class == ErrorClass::NotFound => release(status, None),
        Some(Err(get)) if get.class == ErrorClass::Permanent => match &facts.delete {
            None => Next::Do(Action::Delete(id)),
            Some(Ok(())) => {
                let note = Note::UnreachableButCleaned {
                    provider_id: id.as_str().to_string(),
                    get_error: get.message.clone(),
                };
                release(status, Some(note))
            }
            Some(Err(del)) => {
                let joined = format!("{}; {}", get.message, del.message);
                Next::Done(deletion_failure(timings, status, joined, del.class))
            }
        },
        Some(Err(get)) => Next::Done(deletion_failure(timings, status, get.message.clone(), get.class)),
        // Another Proxy's instance (review M2): not deleted; this Proxy lets go of it.
        Some(Ok(instance)) if let Some(owner) = foreign_owner(proxy, instance) => {
            let note = Note::LeftToItsOwner {
                provider_id: id.as_str().to_string(),
                owner: owner.to_owned(),
            };
            release(status, Some(note))
        }
        // 6. Still there: delete, and poll until Get says NotFound.
        Some(Ok(_)) => match &facts.delete {
            None => Next::Do(Action::Delete(id)),
            Some(Err(f)) => Next::Done(deletion_failure(timings, status, f.message.clone(), f.class)),
            Some(Ok(())) => done(status, Requeue::After(timings.deletion_poll), None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_cloud_init() {
        let secret = "#cloud-config\npassword: SENTINEL-7f3a";
        let action = Action::Create {
            cloud_init: secret.into(),
            credentials: Some(ProxyCredentials::new(
                egress_provider::Credentials::new("u", "SENTINEL-pw").unwrap(),
                "s",
            )),
        };
        let facts = Facts {
            secret: Some(Ok(secret.into())),
            ..Default::default()
        };
        for text in [format!("{action:?}"), format!("{facts:?}")] {
            assert!(!text.contains("SENTINEL"), "{text}");
            assert!(text.contains(&format!("<{} bytes>", secret.len())), "{text}");
        }
    }
}
