//! What a provider crate supplies to run the suite: how to build its
//! provider over a backend, its declared behaviour profile, and fixtures.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use egress_provider::{BoxError, CreateRequest, ErrorClass, Placement, Provider, ProviderId};

use crate::hooks::{BackendHooks, CallKind, Fault};

/// The real backend is not configured for this run (real mode only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotConfigured(pub String);

/// How the suite builds a provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    /// The configured entry name (the suite uses `conformance-entry`).
    pub entry_name: String,
    /// Set the entry's verification-disabling switch, if it has one.
    pub insecure: bool,
}

/// A provider under test.
#[async_trait]
pub trait ConformanceTarget: Send + Sync + 'static {
    /// The backend handle (a fake, or the real backend).
    type Backend: BackendHooks;

    /// A fresh, empty backend (fake mode) or a handle on the real one.
    ///
    /// # Errors
    /// [`NotConfigured`] when a real backend is wanted but not configured:
    /// the case is skipped, or fails when real backends are required
    /// (`EGRESS_REAL_BACKENDS_REQUIRED=1`, [`egress_testkit::real`]).
    async fn backend(&self) -> Result<Self::Backend, NotConfigured>;

    /// Builds a provider over `backend`, as the production constructor would.
    /// Called again for a "fresh provider over the same backend" (H17): the
    /// new provider must share no memory with earlier ones.
    ///
    /// # Errors
    /// What the constructor refused.
    fn build(&self, backend: &Self::Backend, options: &BuildOptions) -> Result<Arc<dyn Provider>, BoxError>;

    /// The declared behaviour profile.
    fn profile(&self) -> Profile;

    /// A request that succeeds on this backend, for Proxy UID `uid`, in the
    /// default location.
    fn valid_request(&self, uid: &str) -> CreateRequest;

    /// A request like [`valid_request`](Self::valid_request), in `location`.
    fn request_in(&self, uid: &str, location: &str) -> CreateRequest;

    /// The id of an instance named `name` in the default location.
    fn id_for(&self, name: &str) -> ProviderId;

    /// Provider-specific fixtures.
    fn fixtures(&self) -> Fixtures;

    /// Whether this target runs against a real backend (real mode).
    fn is_real(&self) -> bool {
        false
    }
}

/// `create-return`: when does create return?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateReturn {
    /// Once the backend accepted the request.
    Submit,
    /// Once the instance runs.
    Blocking,
}

/// `delete-return`: may delete return before the instance is gone?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReturn {
    /// Yes; get keeps showing it until it is.
    ReturnsEarly,
    /// No.
    Waits,
}

/// `gc-mark`: where the marks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcMark {
    /// Backend labels.
    NativeLabels,
    /// Metadata written in the creating call.
    WrittenMetadata,
    /// Written after creation, within a documented window.
    MarkWindow,
}

/// `list-partial`: part of the scope unreachable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListPartial {
    /// The whole call fails.
    FailWhole,
    /// The reachable part is returned and the omission logged.
    OmitUnreachable,
}

/// `quota`: can the provider tell "no capacity"?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quota {
    /// Yes: QuotaExceeded.
    Detected,
    /// No: the class its classify table documents for the capacity fault.
    Absent(ErrorClass),
}

/// `async-ops`: asynchronous backend operations or locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncOps {
    /// None.
    None,
    /// Async tasks with a handle.
    TaskHandle,
    /// Backend locks: get answers last state or Transient, delete Transient.
    BackendLock,
}

/// `provisioning-state`: how "created but not started" is told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProvisioningState {
    /// The backend has a pending state.
    Native,
    /// Create blocks until started.
    CreateBlocks,
    /// A creation marker.
    Marker,
}

/// `timeouts`: how each call is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeouts {
    /// Each backend call has its own budget.
    PerCall,
    /// The client enforces its own timeout.
    CtxOnly,
}

/// `logging`: which tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logging {
    /// DEBUG outcome lines and per-call detail.
    Tiered,
    /// DEBUG outcome lines only.
    OutcomeOnly,
    /// None (the client logs itself).
    None,
}

/// `child-spans`: how backend calls appear in traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildSpans {
    /// The SDK's own instrumentation.
    SdkInstrumentation,
    /// A wrapped HTTP transport, only under a parent span.
    TransportWrapper,
    /// A span decorator over the backend seam.
    SpanDecorator,
    /// No child spans (a documented gap).
    None,
}

/// `credentials`: where credentials come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credentials {
    /// Files; `rereads` when a rotated file is picked up without a restart.
    MountedFiles {
        /// Whether the file is re-read on use.
        rereads: bool,
    },
    /// Environment (a key-file path counts as a file).
    Environment,
    /// The workload's identity; nothing to read.
    WorkloadIdentity,
}

/// A provider's declared behaviour (spec/providers.md §1.5), the axes the
/// suite picks variants from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// `create-return`.
    pub create_return: CreateReturn,
    /// `delete-return`.
    pub delete_return: DeleteReturn,
    /// `gc-mark`.
    pub gc_mark: GcMark,
    /// `list-partial`.
    pub list_partial: ListPartial,
    /// `quota`.
    pub quota: Quota,
    /// `async-ops`.
    pub async_ops: AsyncOps,
    /// `provisioning-state`.
    pub provisioning_state: ProvisioningState,
    /// `timeouts`.
    pub timeouts: Timeouts,
    /// `logging`.
    pub logging: Logging,
    /// `child-spans`.
    pub child_spans: ChildSpans,
    /// `credentials`.
    pub credentials: Credentials,
    /// Whether the IP is discovered (a discovery failure is "no address yet").
    pub ip_discovered: bool,
    /// Whether cloud-init is delivered as user-data.
    pub delivers_cloud_init: bool,
    /// Whether create refuses to adopt an instance with another UID or no mark.
    pub adoption_guard: bool,
    /// Whether marks are key/value (a managed key with another value exists).
    pub key_value_marks: bool,
    /// The class a not-found inside create becomes (never NotFound).
    pub create_not_found_class: ErrorClass,
    /// How long a new instance may take to be Running with an address.
    pub readiness_budget: Duration,
    /// How long a delete may take to reach NotFound.
    pub delete_budget: Duration,
}

/// One classification row: the provider's own classifier applied to a raw
/// backend error, and the class its table documents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassifyCase {
    /// What the raw error was (a code, a captured response).
    pub what: String,
    /// What the provider's classifier said.
    pub actual: ErrorClass,
    /// What the table documents.
    pub expected: ErrorClass,
    /// Whether this row is "not a backend error at all".
    pub not_a_backend_error: bool,
}

impl ClassifyCase {
    /// A row of the backend's table: `what` the raw error was, the class the provider's
    /// classifier gave it, and the class the table documents.
    pub fn row(what: impl Into<String>, actual: ErrorClass, expected: ErrorClass) -> Self {
        Self {
            what: what.into(),
            actual,
            expected,
            not_a_backend_error: false,
        }
    }

    /// [`ClassifyCase::row`] of each `(what, actual, expected)`.
    pub fn rows<W: Into<String>>(rows: impl IntoIterator<Item = (W, ErrorClass, ErrorClass)>) -> Vec<Self> {
        rows.into_iter()
            .map(|(what, actual, expected)| Self::row(what, actual, expected))
            .collect()
    }

    /// The row every target carries: `err` is not from the backend at all (no code, no
    /// answer), and the contract's `class_of` must call it Transient.
    pub fn not_a_backend_error(what: impl Into<String>, err: &(dyn std::error::Error + 'static)) -> Self {
        Self {
            what: what.into(),
            actual: egress_provider::class_of(err),
            expected: ErrorClass::Transient,
            not_a_backend_error: true,
        }
    }

    /// A row of `actual` for an error that is not from the backend (a transport or token
    /// failure before any answer) which the backend's table documents as Transient.
    pub fn transient_without_answer(what: impl Into<String>, actual: ErrorClass) -> Self {
        Self {
            what: what.into(),
            actual,
            expected: ErrorClass::Transient,
            not_a_backend_error: true,
        }
    }
}

/// The backend call kinds the suite needs to address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallKinds {
    /// Every kind create issues, in order.
    pub create_steps: Vec<CallKind>,
    /// The call that makes the instance exist.
    pub create_instance: CallKind,
    /// The calls get issues.
    pub get: Vec<CallKind>,
    /// The calls of get that only discover the address (a failure there is
    /// "no address yet" for `ip_discovered` providers).
    pub get_discovery: Vec<CallKind>,
    /// The call delete issues that frees the name.
    pub delete_frees_name: CallKind,
    /// The calls delete issues.
    pub delete: Vec<CallKind>,
    /// The call list_by_tag issues first.
    pub list: CallKind,
    /// The call the checker probes with.
    pub probe: Option<CallKind>,
}

/// Per-call budgets the provider declares (gate `timeouts: per-call`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// The longest a get's backend call may take.
    pub get: Duration,
}

/// Provider-specific fixtures (spec/providers.md §2.4).
#[derive(Clone, Debug)]
pub struct Fixtures {
    /// Ids that can never resolve (at least: empty, no separator, an extra
    /// segment, an empty location, an empty name).
    pub malformed_ids: Vec<ProviderId>,
    /// A well-formed id in a location the entry does not configure.
    pub id_in_unconfigured_location: Option<(ProviderId, String)>,
    /// Placements that can never work: (placement, field, value).
    pub invalid_placements: Vec<(Placement, &'static str, String)>,
    /// The provider's classification table.
    pub classify_cases: Vec<ClassifyCase>,
    /// Checker target names in config order.
    pub check_targets: Vec<String>,
    /// (fault on the probe call, target, expected reason).
    pub check_faults: Vec<(Fault, String, &'static str)>,
    /// Every location the entry can create in.
    pub locations: Vec<String>,
    /// Inventory kinds that belong to one instance.
    pub secondary_kinds: Vec<String>,
    /// Inventory kinds shared between instances, allowed to survive delete.
    pub shared_kinds: Vec<String>,
    /// Backend call kinds.
    pub calls: CallKinds,
    /// Declared per-call budgets.
    pub budgets: Option<Budgets>,
    /// The name of the entry's verification-disabling switch, if any.
    pub insecure_switch: Option<&'static str>,
}
