//! What a request points at, and the options of its verb.

use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;

/// Where a request points.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) rt: ResourceType,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

impl Target {
    pub(super) fn ns(&self) -> String {
        self.namespace.clone().unwrap_or_default()
    }
    pub(super) fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
    pub(super) fn is_status(&self) -> bool {
        self.subresource.as_deref() == Some("status")
    }
    pub(super) fn not_found(&self) -> ApiError {
        ApiError::not_found(&self.rt.group, &self.rt.plural, self.name())
    }
}

/// Options common to writes.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteOptions {
    pub(crate) manager: String,
    pub(crate) dry_run: bool,
    pub(crate) force: bool,
    /// `fieldValidation=Strict` for a JSON patch, whose unknown fields show only once applied.
    pub(crate) strict: bool,
}

/// Options of a list or watch.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListOptions {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
}

/// Options of a delete, from the query and the `DeleteOptions` body.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOptions {
    pub(crate) dry_run: bool,
    /// `propagationPolicy: Orphan`: dependents keep living, without this owner.
    pub(crate) orphan: bool,
    pub(crate) precondition_uid: Option<String>,
    pub(crate) precondition_rv: Option<String>,
}

/// The patch formats, by content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}
