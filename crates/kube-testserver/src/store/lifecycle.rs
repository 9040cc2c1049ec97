//! The lifecycles the server runs itself: namespaces made, emptied and finished, and the
//! garbage collector's pass over an owner's dependents (or their orphaning).

use serde_json::{Value, json};

use super::change::ChangeKind;
use super::meta::{finalizers, meta, meta_mut, meta_str};
use super::options::{DeleteOptions, Target, WriteOptions};
use super::state::State;
use crate::resources::{ResourceType, StoreKey};

impl State {
    pub(crate) fn ensure_namespace(&mut self, name: &str) {
        let rt = self.builtin("", "namespaces");
        let key = ("".to_string(), name.to_string());
        if self.objects.get(&rt.key()).is_some_and(|m| m.contains_key(&key)) {
            return;
        }
        let target = Target {
            rt,
            namespace: None,
            name: None,
            subresource: None,
        };
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        self.create(
            &target,
            body,
            &WriteOptions {
                manager: "kube-testserver".into(),
                ..Default::default()
            },
        )
        .expect("a namespace with a valid name can be created");
    }

    /// The garbage collector's background pass for one removed owner: each object that named it
    /// and has no other owner left is deleted (finalizers still hold it). Their own removal
    /// queues them as owners in turn, so chains of owners unwind.
    pub(super) fn collect_dependents(&mut self, owner_uid: &str) {
        let refers_to = |o: &Value, uid: &str| {
            meta(o)
                .get("ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| refs.iter().any(|r| r.get("uid").and_then(Value::as_str) == Some(uid)))
        };
        let candidates: Vec<(StoreKey, String, String, Value)> = self
            .objects
            .iter()
            .flat_map(|(key, bucket)| bucket.iter().map(move |((ns, name), o)| (key, ns, name, o)))
            .filter(|(_, _, _, o)| refers_to(o, owner_uid) && !meta(o).contains_key("deletionTimestamp"))
            .map(|(key, ns, name, o)| (key.clone(), ns.clone(), name.clone(), o.clone()))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let live: std::collections::HashSet<String> = self
            .objects
            .values()
            .flat_map(|b| b.values())
            .filter_map(|o| meta_str(o, "uid").map(str::to_string))
            .collect();
        for (key, ns, name, o) in candidates {
            let owners = meta(&o)
                .get("ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let all_gone = owners.iter().all(|r| {
                r.get("uid")
                    .and_then(Value::as_str)
                    .is_none_or(|uid| !live.contains(uid))
            });
            let Some(rt) = self.type_of(&key) else { continue };
            if !all_gone {
                continue;
            }
            let namespace = rt.namespaced.then_some(ns);
            let t = Target {
                rt,
                namespace,
                name: Some(name),
                subresource: None,
            };
            if self.lookup(&t).is_some() {
                let _ = self.delete(&t, &DeleteOptions::default());
            }
        }
    }

    /// `Orphan` propagation: dependents lose their reference to the deleted owner.
    pub(super) fn orphan_dependents(&mut self, owner_uid: &str) {
        let mut freed = Vec::new();
        for (key, bucket) in &self.objects {
            for o in bucket.values() {
                let refs = meta(o).get("ownerReferences").and_then(Value::as_array);
                if refs.is_some_and(|r| {
                    r.iter()
                        .any(|x| x.get("uid").and_then(Value::as_str) == Some(owner_uid))
                }) {
                    freed.push((key.clone(), o.clone()));
                }
            }
        }
        for (key, mut o) in freed {
            let Some(rt) = self.type_of(&key) else { continue };
            if let Some(Value::Array(refs)) = meta_mut(&mut o).get_mut("ownerReferences") {
                refs.retain(|x| x.get("uid").and_then(Value::as_str) != Some(owner_uid));
            }
            self.commit(&rt, ChangeKind::Modified, o);
        }
    }

    /// Deletes everything in a terminating namespace (objects with finalizers get marked).
    pub(super) fn empty_namespace(&mut self, ns: &str) {
        let mut doomed = Vec::new();
        let mut kinds: Vec<&ResourceType> = self.types.all().filter(|rt| rt.namespaced).collect();
        // Several versions of one kind share one store: visit each store once.
        kinds.sort_by_key(|rt| rt.key());
        kinds.dedup_by_key(|rt| rt.key());
        for rt in kinds {
            if let Some(bucket) = self.objects.get(&rt.key()) {
                for ((obj_ns, name), _) in bucket.iter().filter(|((n, _), _)| n == ns) {
                    doomed.push(Target {
                        rt: rt.clone(),
                        namespace: Some(obj_ns.clone()),
                        name: Some(name.clone()),
                        subresource: None,
                    });
                }
            }
        }
        for t in doomed {
            if self.lookup(&t).is_some() {
                let _ = self.delete(&t, &DeleteOptions::default());
            }
        }
    }

    /// Removes a terminating namespace once nothing is left in it.
    pub(super) fn finish_namespace(&mut self, ns: &str) -> Option<Value> {
        let rt = self.builtin("", "namespaces");
        let namespace = self.bucket(&rt.key())?.get(&(String::new(), ns.to_string()))?.clone();
        if !meta(&namespace).contains_key("deletionTimestamp") || !finalizers(&namespace).is_empty() {
            return None;
        }
        let occupied = self
            .objects
            .iter()
            .any(|(key, bucket)| key.plural != "namespaces" && bucket.keys().any(|(obj_ns, _)| obj_ns == ns));
        if occupied {
            return None;
        }
        Some(self.commit(&rt, ChangeKind::Deleted, namespace))
    }
}
