//! The server's state: the objects, the served types, the resourceVersion clock and the change
//! history with its subscribers. Every verb is a method of it (their rules in the sibling
//! modules), run under the one lock the HTTP side holds.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::change::{Change, ChangeKind, HISTORY_BYTE_LIMIT};
use super::meta::{meta_mut, meta_str};
use super::options::Target;
use crate::resources::{ResourceType, StoreKey, Types};

/// The server's state.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) types: Types,
    pub(super) rv: u64,
    pub(super) objects: HashMap<StoreKey, BTreeMap<(String, String), Value>>,
    pub(super) history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// The approximate bytes the history holds, and the most it may hold.
    history_bytes: usize,
    /// Changes up to and including this resourceVersion are no longer in the history.
    pub(super) compacted_through: u64,
    changes: broadcast::Sender<Arc<Change>>,
    /// Owners removed whose dependents the garbage collector has still to look at. A worklist,
    /// so a long chain of owners does not become a deep recursion.
    pub(super) gc_pending: Vec<String>,
    pub(super) gc_running: bool,
}

impl State {
    pub(crate) fn new(history_limit: usize) -> Self {
        let (changes, _) = broadcast::channel(4096);
        let mut state = Self {
            types: Types::with_builtins(),
            rv: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            history_bytes: 0,
            compacted_through: 0,
            changes,
            gc_pending: Vec::new(),
            gc_running: false,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            state.ensure_namespace(ns);
        }
        state
    }

    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Sets an object's `creationTimestamp` (a test control: the API never lets a client write
    /// it). False when there is no such object.
    pub(crate) fn backdate(&mut self, group: &str, plural: &str, namespace: &str, name: &str, at: &str) -> bool {
        // Through the served type, whose store may be another's (events.k8s.io Events).
        let Some(key) = self
            .types
            .all()
            .find(|t| t.group == group && t.plural == plural)
            .map(ResourceType::key)
        else {
            return false;
        };
        let Some(object) = self
            .objects
            .get_mut(&key)
            .and_then(|bucket| bucket.get_mut(&(namespace.to_owned(), name.to_owned())))
        else {
            return false;
        };
        meta_mut(object).insert("creationTimestamp".into(), json!(at));
        true
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Drops the whole change history, so a watch from any earlier resourceVersion gets 410.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.history_bytes = 0;
        self.compacted_through = self.rv;
    }

    pub(super) fn builtin(&self, group: &str, plural: &str) -> ResourceType {
        self.types
            .get(group, "v1", plural)
            .cloned()
            .expect("built-in kinds are always served")
    }

    pub(super) fn bucket(&self, key: &StoreKey) -> Option<&BTreeMap<(String, String), Value>> {
        self.objects.get(key)
    }

    pub(super) fn lookup(&self, t: &Target) -> Option<&Value> {
        self.bucket(&t.rt.key())?.get(&(t.ns(), t.name().to_string()))
    }

    /// The object as it is shown for the requested version.
    pub(super) fn shown(rt: &ResourceType, object: &Value) -> Value {
        rt.show(object)
    }

    /// What is stored for an object written through `rt` (its apiVersion and kind checked).
    pub(super) fn stored(rt: &ResourceType, written: Value) -> Value {
        let mut o = rt.view.store(&written);
        o["apiVersion"] = rt
            .view
            .stored_api_version()
            .map_or_else(|| written["apiVersion"].clone(), |v| json!(v));
        o["kind"] = written["kind"].clone();
        o
    }

    pub(super) fn commit(&mut self, rt: &ResourceType, kind: ChangeKind, mut object: Value) -> Value {
        self.rv += 1;
        meta_mut(&mut object).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let ns = meta_str(&object, "namespace").unwrap_or_default().to_string();
        let name = meta_str(&object, "name").unwrap_or_default().to_string();
        let bucket = self.objects.entry(rt.key()).or_default();
        let previous = match kind {
            ChangeKind::Deleted => bucket.remove(&(ns.clone(), name)),
            _ => bucket.insert((ns.clone(), name), object.clone()),
        };
        let change = Arc::new(Change {
            rv: self.rv,
            key: rt.key(),
            namespace: ns,
            kind,
            object: object.clone(),
            previous,
        });
        self.history_bytes += change.approximate_size();
        self.history.push_back(change.clone());
        // Bounded by count and by size, as the real watch cache is bounded; the newest change
        // always stays.
        while self.history.len() > self.history_limit
            || (self.history_bytes > HISTORY_BYTE_LIMIT && self.history.len() > 1)
        {
            if let Some(old) = self.history.pop_front() {
                self.history_bytes -= old.approximate_size();
                self.compacted_through = old.rv;
            }
        }
        // Nobody listening is fine.
        let _ = self.changes.send(change);
        object
    }

    pub(super) fn type_of(&self, key: &StoreKey) -> Option<ResourceType> {
        self.types.all().find(|t| t.key() == *key).cloned()
    }
}
