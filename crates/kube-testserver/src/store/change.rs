//! A committed change: what a watch reports, and what the history keeps.

use serde_json::Value;

use super::options::Target;
use crate::resources::StoreKey;

/// What happened to an object, as a watch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) key: StoreKey,
    pub(crate) namespace: String,
    pub(crate) kind: ChangeKind,
    pub(crate) object: Value,
    /// The object before this change, so a filtered watch can tell "left the selection".
    pub(crate) previous: Option<Value>,
}

/// The most the change history may hold, roughly, in bytes of JSON.
pub(super) const HISTORY_BYTE_LIMIT: usize = 64 * 1024 * 1024;

impl Change {
    /// The JSON size of what the change keeps (the object and its previous state).
    pub(super) fn approximate_size(&self) -> usize {
        let size = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len());
        size(&self.object) + self.previous.as_ref().map_or(0, size)
    }
}

/// Whether a change belongs to a watch on `t`.
pub(crate) fn watches(t: &Target, change: &Change) -> bool {
    change.key == t.rt.key() && t.namespace.as_ref().is_none_or(|ns| *ns == change.namespace)
}
