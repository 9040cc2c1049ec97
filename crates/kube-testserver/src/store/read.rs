//! The reads: one object, a list (filtered, paged), the changes a watch replays, the snapshot a
//! watch from now starts with.

use std::sync::Arc;

use serde_json::{Value, json};

use super::change::{Change, watches};
use super::meta::{decode_continue, encode_continue, meta_str};
use super::options::{ListOptions, Target};
use super::state::State;
use crate::selectors::labels_of;
use crate::status::ApiError;

impl State {
    pub(crate) fn get(&self, t: &Target) -> Result<Value, ApiError> {
        self.lookup(t)
            .map(|o| Self::shown(&t.rt, o))
            .ok_or_else(|| t.not_found())
    }

    /// Objects in scope, sorted by namespace and name.
    pub(super) fn matching<'a>(&'a self, t: &'a Target, opts: &'a ListOptions) -> impl Iterator<Item = &'a Value> + 'a {
        self.bucket(&t.rt.key())
            .into_iter()
            .flat_map(|b| b.iter())
            .filter(move |((ns, _), _)| t.namespace.as_ref().is_none_or(|want| want == ns))
            .map(|(_, o)| o)
            .filter(move |o| opts.labels.matches(&labels_of(o)) && opts.fields.matches(o))
    }

    pub(crate) fn list(&self, t: &Target, opts: &ListOptions) -> Result<Value, ApiError> {
        let start_after = match &opts.continue_token {
            Some(token) => Some(decode_continue(token)?),
            None => None,
        };
        let mut items: Vec<Value> = self
            .matching(t, opts)
            .filter(|o| {
                start_after.as_ref().is_none_or(|after| {
                    (
                        meta_str(o, "namespace").unwrap_or_default(),
                        meta_str(o, "name").unwrap_or_default(),
                    ) > (after.0.as_str(), after.1.as_str())
                })
            })
            .map(|o| Self::shown(&t.rt, o))
            .collect();
        let mut metadata = json!({"resourceVersion": self.rv.to_string()});
        if let Some(limit) = opts.limit.filter(|l| *l > 0 && items.len() > *l) {
            let remaining = items.len() - limit;
            items.truncate(limit);
            let last = items.last().expect("limit is positive");
            let token = encode_continue(
                meta_str(last, "namespace").unwrap_or_default(),
                meta_str(last, "name").unwrap_or_default(),
            );
            metadata["continue"] = json!(token);
            metadata["remainingItemCount"] = json!(remaining);
        }
        Ok(json!({"kind": t.rt.list_kind, "apiVersion": t.rt.api_version(), "metadata": metadata, "items": items}))
    }

    /// The changes after `since` that a watch on `t` sees, or 410 when they are no longer kept.
    pub(crate) fn changes_since(&self, t: &Target, since: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        if since < self.compacted_through {
            return Err(ApiError::gone(format!(
                "too old resource version: {since} ({})",
                self.compacted_through + 1
            )));
        }
        Ok(self
            .history
            .iter()
            .filter(|c| c.rv > since && watches(t, c))
            .cloned()
            .collect())
    }

    /// The current objects in scope (as stored: the watch shows them), for the synthetic ADDED
    /// events a watch from "now" starts with.
    pub(crate) fn snapshot(&self, t: &Target, opts: &ListOptions) -> Vec<Value> {
        self.matching(t, opts).cloned().collect()
    }
}
