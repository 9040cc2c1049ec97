//! DELETE of one object and of a collection: preconditions, finalizers, and what follows a
//! final removal (a CRD's kind goes, a namespace may finish, dependents are collected).

use serde_json::{Value, json};

use super::change::ChangeKind;
use super::meta::{finalizers, meta, meta_mut, meta_str, now};
use super::options::{DeleteOptions, ListOptions, Target};
use super::state::State;
use crate::resources::{ResourceType, from_crd};
use crate::status::ApiError;

impl State {
    pub(crate) fn delete(&mut self, t: &Target, opts: &DeleteOptions) -> Result<Value, ApiError> {
        let current = self.lookup(t).cloned().ok_or_else(|| t.not_found())?;
        if let Some(uid) = &opts.precondition_uid
            && Some(uid.as_str()) != meta_str(&current, "uid")
        {
            let why = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(&current, "uid").unwrap_or_default()
            );
            return Err(ApiError::conflict(&t.rt.group, &t.rt.plural, t.name(), &why));
        }
        if let Some(rv) = &opts.precondition_rv
            && Some(rv.as_str()) != meta_str(&current, "resourceVersion")
        {
            let why = format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta_str(&current, "resourceVersion").unwrap_or_default()
            );
            return Err(ApiError::conflict(&t.rt.group, &t.rt.plural, t.name(), &why));
        }
        let is_namespace = t.rt.plural == "namespaces" && t.rt.group.is_empty();
        if is_namespace && matches!(t.name(), "default" | "kube-system" | "kube-public") {
            return Err(ApiError::forbidden(
                "",
                "namespaces",
                t.name(),
                format!(
                    "namespaces \"{}\" is forbidden: this namespace may not be deleted",
                    t.name()
                ),
            ));
        }
        if !finalizers(&current).is_empty() || is_namespace {
            if meta(&current).contains_key("deletionTimestamp") {
                return Ok(Self::shown(&t.rt, &current));
            }
            let mut marked = current.clone();
            let generation = meta(&current).get("generation").and_then(Value::as_i64).unwrap_or(1);
            let m = meta_mut(&mut marked);
            m.insert("deletionTimestamp".into(), json!(now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            m.insert("generation".into(), json!(generation + 1));
            if is_namespace {
                marked["status"] = json!({"phase": "Terminating"});
            }
            if opts.dry_run {
                return Ok(Self::shown(&t.rt, &marked));
            }
            let marked = self.commit(&t.rt, ChangeKind::Modified, marked);
            if is_namespace {
                self.empty_namespace(t.name());
                if let Some(finished) = self.finish_namespace(t.name()) {
                    return Ok(Self::shown(&t.rt, &finished));
                }
            }
            return Ok(Self::shown(&t.rt, &marked));
        }
        if opts.dry_run {
            return Ok(Self::shown(&t.rt, &current));
        }
        let gone = self.commit(&t.rt, ChangeKind::Deleted, current);
        if opts.orphan {
            self.orphan_dependents(meta_str(&gone, "uid").unwrap_or_default());
        }
        self.after_delete(&t.rt, &gone);
        if t.rt.returns_deleted_object {
            return Ok(Self::shown(&t.rt, &gone));
        }
        let mut details = json!({"name": t.name(), "kind": t.rt.plural, "uid": meta_str(&gone, "uid")});
        if !t.rt.group.is_empty() {
            details["group"] = json!(t.rt.group);
        }
        Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}))
    }

    pub(crate) fn delete_collection(
        &mut self,
        t: &Target,
        list: &ListOptions,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let names: Vec<String> = self
            .matching(t, list)
            .map(|o| meta_str(o, "name").unwrap_or_default().to_string())
            .collect();
        let mut items = Vec::new();
        for name in names {
            let one = Target {
                name: Some(name),
                ..t.clone()
            };
            let before = self.lookup(&one).map(|o| Self::shown(&t.rt, o));
            match (self.delete(&one, opts), before) {
                // An object deleted at once answers with a Status; the list shows the object.
                (Ok(o), Some(before)) if o.get("kind").and_then(Value::as_str) == Some("Status") => items.push(before),
                (Ok(o), _) => items.push(o),
                (Err(_), _) => {}
            }
        }
        Ok(json!({"kind": t.rt.list_kind, "apiVersion": t.rt.api_version(),
            "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}))
    }

    /// What follows an object's final removal: a CRD takes its kind and objects with it, and
    /// a terminating namespace that is now empty goes.
    pub(super) fn after_delete(&mut self, rt: &ResourceType, gone: &Value) {
        if rt.group == "apiextensions.k8s.io" {
            let name = meta_str(gone, "name").unwrap_or_default().to_string();
            if let Ok(types) = from_crd(gone)
                && let Some(first) = types.first()
            {
                let key = first.key();
                let objects: Vec<Value> = self
                    .objects
                    .get(&key)
                    .map(|b| b.values().cloned().collect())
                    .unwrap_or_default();
                for o in objects {
                    let gone = self.commit(first, ChangeKind::Deleted, o);
                    // Their dependents and a namespace waiting on them follow, as for any delete.
                    self.after_delete(first, &gone);
                }
            }
            self.types.unregister_crd(&name);
        }
        if rt.namespaced
            && let Some(ns) = meta_str(gone, "namespace")
        {
            let ns = ns.to_string();
            self.finish_namespace(&ns);
        }
        if let Some(uid) = meta_str(gone, "uid") {
            let uid = uid.to_string();
            self.gc_pending.push(uid);
            if !self.gc_running {
                self.gc_running = true;
                while let Some(owner) = self.gc_pending.pop() {
                    self.collect_dependents(&owner);
                }
                self.gc_running = false;
            }
        }
    }
}
