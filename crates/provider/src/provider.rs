//! The provider contract: five operations over an instance addressed by an
//! opaque id, and an optional health checker.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{CreateRequest, Instance, OpCtx, ProviderError, ProviderId};

/// A compute backend that runs forward proxies.
///
/// Shared behind `Arc<dyn Provider>` by the reconciler's workers, the orphan
/// collector and the health monitor at once, so every method takes `&self`
/// and tolerates concurrent calls, including two for the same instance.
///
/// Every method honours `cx` (returns a Transient error promptly once it is
/// cancelled or past its deadline), bounds each backend call with its own
/// budget, and leaves nothing poisoned when its future is dropped.
/// Each error is a [`ProviderError`] carrying the configured entry name.
/// Nothing here logs cloud-init or credentials, or puts them in spans or
/// errors.
///
/// Providers do not open `provider.*` spans or count requests: the
/// decorators in [`decorate`](crate::decorate) do both.
#[async_trait]
pub trait Provider: Send + Sync + fmt::Debug + 'static {
    /// Creates the instance named `req.name`, marked managed and with
    /// `req.uid`, in the same backend call that creates it.
    ///
    /// Idempotent by `req.name`: a repeat returns the same id and creates
    /// nothing. It may return once the backend accepted the request
    /// (`submit`) or once the instance runs (`blocking`); a blocking create
    /// caps its wait and every step resumes after an interruption.
    ///
    /// # Errors
    /// Permanent (before any backend call) for a placement that can never
    /// work, naming the field and value; QuotaExceeded when the backend is
    /// out of capacity; never NotFound for a missing instance.
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError>;

    /// Reads the instance back from the backend (state, address, marks and
    /// creation time, never from memory).
    ///
    /// # Errors
    /// NotFound only when the instance is really gone (and not while a
    /// delete is still in progress); Permanent for an id that can never
    /// resolve; Transient when the backend cannot tell.
    async fn get(&self, cx: &OpCtx, id: &ProviderId) -> Result<Instance, ProviderError>;

    /// Removes the instance and everything `create` made for it.
    ///
    /// Idempotent: an id that is already gone, or already being deleted, is
    /// success.
    ///
    /// # Errors
    /// Permanent for a malformed id; Transient when the backend fails.
    async fn delete(&self, cx: &OpCtx, id: &ProviderId) -> Result<(), ProviderError>;

    /// Every instance carrying the managed mark, wherever this provider can
    /// create them, each with an id `delete` accepts and its UID and
    /// creation time.
    ///
    /// # Errors
    /// Any failure that could make the list incomplete in a way the
    /// provider cannot account for: an error, never a partial list.
    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError>;

    /// Writes the installation mark `installation` on an existing instance that carries none,
    /// read back by `get` and `list_by_tag` from then on. It is how an instance made without
    /// one (by an operator run without an installation, or by the Go operator, then adopted)
    /// becomes one that this installation's orphan GC may collect.
    ///
    /// Idempotent: an instance already carrying `installation` is success, and nothing is
    /// written. An instance carrying another installation's mark is never changed (that
    /// installation's GC owns it), nor is one without the managed mark. The read and the write
    /// are one conditional change where the backend has one, so a concurrent change of the
    /// instance fails the call rather than being overwritten.
    ///
    /// # Errors
    /// NotFound when the instance is gone, as `get` says it; Permanent for a malformed id (before
    /// any backend call), an id in a location the entry no longer configures, an instance
    /// without the managed mark or carrying another installation's mark (nothing written);
    /// Transient when the backend fails or the instance changed between the read and the write.
    async fn mark_installation(&self, cx: &OpCtx, id: &ProviderId, installation: &str) -> Result<(), ProviderError>;

    /// The backend's health checker, if it has one. Decorators return `None`:
    /// the composition root takes checkers from undecorated providers.
    fn checker(&self) -> Option<Arc<dyn Checker>> {
        None
    }
}

/// The reason for a target that answered.
pub const REASON_REACHABLE: &str = "Reachable";
/// The check ran out of time.
pub const REASON_TIMEOUT: &str = "Timeout";
/// The target could not be reached (DNS, TCP, TLS).
pub const REASON_UNREACHABLE: &str = "Unreachable";
/// The backend rejected the credentials.
pub const REASON_UNAUTHORIZED: &str = "Unauthorized";
/// The credentials lack a permission.
pub const REASON_FORBIDDEN: &str = "Forbidden";
/// The backend answered with an error of its own.
pub const REASON_API_ERROR: &str = "APIError";

/// The verdict on one target of a provider (a host, a project, the API server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetStatus {
    /// Target id within the provider; stable across checks.
    pub name: String,
    /// What the check talked to, for humans.
    pub address: String,
    /// Whether the target can serve create, get, delete, list and mark.
    pub ready: bool,
    /// [`REASON_REACHABLE`] when ready, otherwise why not (CamelCase).
    pub reason: String,
    /// Detail for humans (usually the error text); empty when ready.
    pub message: String,
    /// How long the check of this target took.
    pub latency: Duration,
    /// Provider-specific facts (versions, capacity).
    pub details: BTreeMap<String, String>,
}

impl TargetStatus {
    /// A ready target.
    pub fn reachable(name: impl Into<String>, address: impl Into<String>, latency: Duration) -> Self {
        Self {
            name: name.into(),
            address: address.into(),
            ready: true,
            reason: REASON_REACHABLE.to_owned(),
            message: String::new(),
            latency,
            details: BTreeMap::new(),
        }
    }

    /// A target that is not ready, for `reason`.
    pub fn failed(
        name: impl Into<String>,
        address: impl Into<String>,
        reason: &str,
        message: impl Into<String>,
        latency: Duration,
    ) -> Self {
        Self {
            name: name.into(),
            address: address.into(),
            ready: false,
            reason: reason.to_owned(),
            message: message.into(),
            latency,
            details: BTreeMap::new(),
        }
    }
}

/// A provider's health check.
#[async_trait]
pub trait Checker: Send + Sync + fmt::Debug + 'static {
    /// One verdict per target, in a stable order. Never fails as a whole:
    /// every failure is a not-ready verdict. Returns promptly once `cx` is
    /// cancelled or past its deadline (reason [`REASON_TIMEOUT`]), and never
    /// disrupts provisioning calls that share its connection.
    async fn check(&self, cx: &OpCtx) -> Vec<TargetStatus>;
}
