//! The writes of a whole object: create, update (PUT), and the common end of update, patch and
//! apply.

use serde_json::{Value, json};

use super::change::ChangeKind;
use super::meta::{
    content, finalizers, meta, meta_mut, meta_str, name_suffix, new_uid, now, ownership, without_volatile_metadata,
};
use super::options::{Target, WriteOptions};
use super::state::State;
use crate::fields::{self, ListType, Scope, Writer};
use crate::resources::{ResourceType, from_crd};
use crate::status::{ApiError, FieldCause};

impl State {
    pub(crate) fn create(&mut self, t: &Target, mut body: Value, opts: &WriteOptions) -> Result<Value, ApiError> {
        Self::check_type(t, &mut body)?;
        Self::check_namespace_in_body(t, &mut body)?;
        let mut body = Self::stored(&t.rt, body);
        let now = now();
        {
            let m = meta_mut(&mut body);
            if m.get("resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                return Err(ApiError::bad_request(
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            let name = m.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            if name.is_empty() {
                match m.get("generateName").and_then(Value::as_str) {
                    Some(prefix) if !prefix.is_empty() => {
                        // The prefix is cut so that the name stays within 63 characters.
                        let prefix: String = prefix.chars().take(58).collect();
                        let generated = format!("{prefix}{}", name_suffix());
                        m.insert("name".into(), json!(generated));
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &t.rt.kind,
                            &t.rt.group,
                            "",
                            vec![FieldCause::required(
                                "metadata.name",
                                "name or generateName is required",
                            )],
                        ));
                    }
                }
            }
            for server_owned in [
                "uid",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
                "managedFields",
            ] {
                m.remove(server_owned);
            }
            m.insert("uid".into(), json!(new_uid()));
            m.insert("creationTimestamp".into(), json!(now));
            m.insert("generation".into(), json!(1));
        }
        if t.rt.status_subresource {
            body.as_object_mut().expect("checked above").remove("status");
        }
        if t.rt.plural == "namespaces" && t.rt.group.is_empty() {
            body["status"] = json!({"phase": "Active"});
        }
        if t.rt.group == "apiextensions.k8s.io" {
            body["status"] = crd_status(&body);
        }
        let name = meta_str(&body, "name").unwrap_or_default().to_string();
        let t = Target {
            name: Some(name.clone()),
            ..t.clone()
        };
        // Namespace lifecycle admission runs before validation, as on the real server.
        self.check_namespace_for_write(&t)?;
        self.admit(&t, &mut body, None)?;
        if self.lookup(&t).is_some() {
            return Err(ApiError::already_exists(&t.rt.group, &t.rt.plural, &name));
        }
        let lists = |p: &[String]| list_type(&t.rt, p);
        let who = writer(&t, opts, &now, &lists);
        fields::record_update(None, &mut body, &who);
        if opts.dry_run {
            return Ok(Self::shown(&t.rt, &body));
        }
        self.after_create(&t, &body)?;
        let created = self.commit(&t.rt, ChangeKind::Added, body);
        Ok(Self::shown(&t.rt, &created))
    }

    /// A created CRD starts serving its kind.
    pub(super) fn after_create(&mut self, t: &Target, object: &Value) -> Result<(), ApiError> {
        if t.rt.group == "apiextensions.k8s.io" {
            let types = from_crd(object).map_err(|e| ApiError::bad_request(e.0))?;
            self.types
                .register_crd(meta_str(object, "name").unwrap_or_default(), types);
        }
        Ok(())
    }

    /// PUT: a whole new object (or a whole new status), with optimistic concurrency.
    pub(crate) fn update(&mut self, t: &Target, mut body: Value, opts: &WriteOptions) -> Result<Value, ApiError> {
        let old = self.lookup(t).cloned().ok_or_else(|| t.not_found())?;
        Self::check_type(t, &mut body)?;
        Self::check_namespace_in_body(t, &mut body)?;
        if meta_str(&body, "resourceVersion").is_none_or(str::is_empty) && !t.rt.allows_unconditional_update() {
            let cause = FieldCause {
                reason: "FieldValueInvalid",
                field: "metadata.resourceVersion".into(),
                detail: "Invalid value: 0x0: must be specified for an update".into(),
            };
            return Err(ApiError::invalid(&t.rt.kind, &t.rt.group, t.name(), vec![cause]));
        }
        let given = meta_str(&body, "name").unwrap_or_default();
        if given.is_empty() {
            meta_mut(&mut body).insert("name".into(), json!(t.name()));
        } else if given != t.name() {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({given}) does not match the name on the URL ({})",
                t.name()
            )));
        }
        let body = Self::stored(&t.rt, body);
        self.write(t, &old, body, opts, None)
    }

    /// The common end of update, patch and apply: server-owned fields kept, the status rule,
    /// finalizer rules, schema, generation, no-op detection and the final delete when the last
    /// finalizer goes.
    pub(super) fn write(
        &mut self,
        t: &Target,
        old: &Value,
        mut new: Value,
        opts: &WriteOptions,
        applied: Option<&Value>,
    ) -> Result<Value, ApiError> {
        check_preconditions(t, old, &new)?;
        let applied_ownership = applied.and(meta(&new).get("managedFields").cloned());
        keep_what_the_write_may_not_change(t, old, &mut new);
        let owners = applied_ownership
            .or_else(|| meta(old).get("managedFields").cloned())
            .unwrap_or(json!([]));
        meta_mut(&mut new).insert("managedFields".into(), owners);
        let deleting = meta(old).contains_key("deletionTimestamp");
        if deleting {
            refuse_new_finalizers(t, old, &new)?;
        }
        self.admit(t, &mut new, Some(old))?;
        let now = now();
        let lists = |p: &[String]| list_type(&t.rt, p);
        let who = writer(t, opts, &now, &lists);
        if applied.is_none() {
            fields::record_update(Some(old), &mut new, &who);
        }
        // Nothing changed (ownership aside from its timestamps): the real server writes nothing
        // and sends no event.
        if without_volatile_metadata(&new) == without_volatile_metadata(old) && ownership(&new) == ownership(old) {
            return Ok(Self::shown(&t.rt, old));
        }
        count_generation(t, old, &mut new);
        if opts.dry_run {
            return Ok(Self::shown(&t.rt, &new));
        }
        if deleting && finalizers(&new).is_empty() {
            return Ok(self.finish_deleting(t, new));
        }
        if t.rt.group == "apiextensions.k8s.io" && !t.is_status() {
            new["status"] = crd_status_after_update(old, &new);
            self.after_create(t, &new)?;
        }
        Ok(Self::shown(&t.rt, &self.commit(&t.rt, ChangeKind::Modified, new)))
    }

    /// The last finalizer of an object being deleted went in a write: it goes now, a namespace
    /// only once it is also empty. What the write answers.
    fn finish_deleting(&mut self, t: &Target, new: Value) -> Value {
        let is_namespace = t.rt.plural == "namespaces" && t.rt.group.is_empty();
        if is_namespace {
            // A namespace goes only once it is also empty.
            let kept = self.commit(&t.rt, ChangeKind::Modified, new);
            let result = self.finish_namespace(t.name()).unwrap_or(kept);
            return Self::shown(&t.rt, &result);
        }
        let gone = self.commit(&t.rt, ChangeKind::Deleted, new);
        self.after_delete(&t.rt, &gone);
        Self::shown(&t.rt, &gone)
    }
}

/// A write's optimistic concurrency: a `resourceVersion` other than the stored one is stale, a
/// `uid` other than the stored one a failed precondition.
fn check_preconditions(t: &Target, old: &Value, new: &Value) -> Result<(), ApiError> {
    let stale = match meta_str(new, "resourceVersion") {
        Some(rv) if !rv.is_empty() => Some(rv) != meta_str(old, "resourceVersion"),
        _ => false,
    };
    if stale {
        return Err(ApiError::stale(&t.rt.group, &t.rt.plural, t.name()));
    }
    if let Some(uid) = meta_str(new, "uid").filter(|u| !u.is_empty())
        && Some(uid) != meta_str(old, "uid")
    {
        let why = format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            meta_str(old, "uid").unwrap_or_default()
        );
        return Err(ApiError::conflict(&t.rt.group, &t.rt.plural, t.name(), &why));
    }
    Ok(())
}

/// What a write to `t` may not change, taken back from `old`: a status write moves only the
/// status; any other keeps the server-owned metadata, and the status when the kind has a status
/// subresource.
fn keep_what_the_write_may_not_change(t: &Target, old: &Value, new: &mut Value) {
    if t.is_status() {
        // Only the status moves; everything else stays as stored.
        let status = new.get("status").cloned();
        *new = old.clone();
        match status {
            Some(s) => new["status"] = s,
            None => {
                new.as_object_mut()
                    .expect("stored objects are objects")
                    .remove("status");
            }
        }
        return;
    }
    for keep in [
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        let m = meta_mut(new);
        match meta(old).get(keep) {
            Some(v) => m.insert(keep.into(), v.clone()),
            None => m.remove(keep),
        };
    }
    if t.rt.status_subresource {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                new.as_object_mut().expect("checked type").remove("status");
            }
        }
    }
}

/// An object being deleted takes no new finalizer.
fn refuse_new_finalizers(t: &Target, old: &Value, new: &Value) -> Result<(), ApiError> {
    let before = finalizers(old);
    let added: Vec<String> = finalizers(new).into_iter().filter(|f| !before.contains(f)).collect();
    if added.is_empty() {
        return Ok(());
    }
    let cause = FieldCause::forbidden(
        "metadata.finalizers",
        format!("no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"),
    );
    Err(ApiError::invalid(&t.rt.kind, &t.rt.group, t.name(), vec![cause]))
}

/// A change of anything but the metadata (and the status, when the kind has a status
/// subresource) counts one more generation.
fn count_generation(t: &Target, old: &Value, new: &mut Value) {
    if content(new, t.rt.status_subresource) != content(old, t.rt.status_subresource) {
        let generation = meta(old).get("generation").and_then(Value::as_i64).unwrap_or(1);
        meta_mut(new).insert("generation".into(), json!(generation + 1));
    }
}

/// A CRD's status after an update: names and versions may have changed, so it follows them,
/// keeping every version ever stored and the conditions it had.
fn crd_status_after_update(old: &Value, new: &Value) -> Value {
    let mut status = crd_status(new);
    let mut stored: Vec<Value> = old
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for v in status["storedVersions"].as_array().cloned().unwrap_or_default() {
        if !stored.contains(&v) {
            stored.push(v);
        }
    }
    status["storedVersions"] = Value::Array(stored);
    if let Some(conditions) = old.pointer("/status/conditions") {
        status["conditions"] = conditions.clone();
    }
    status
}

/// A served CRD's status: names accepted, established, and its storage version recorded, so
/// clients waiting for `Established` go on.
fn crd_status(crd: &Value) -> Value {
    let now = now();
    let condition = |kind: &str, reason: &str, message: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message});
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": stored,
    })
}

/// The list type at a path of an object of this kind: the metadata rules, then the CRD schema,
/// then (for built-in kinds, which have no schema here) their well-known keyed lists.
pub(super) fn list_type(rt: &ResourceType, path: &[String]) -> ListType {
    if let Some(t) = fields::metadata_list_type(path) {
        return t;
    }
    match &rt.schema {
        Some(schema) => schema.list_type(path).unwrap_or(ListType::Atomic),
        None => fields::builtin_list_type(path),
    }
}

/// Ownership rules for a write to `t`.
pub(super) fn writer<'a>(
    t: &'a Target,
    opts: &'a WriteOptions,
    now: &'a str,
    lists: &'a dyn Fn(&[String]) -> ListType,
) -> Writer<'a> {
    let scope = match (t.is_status(), t.rt.status_subresource) {
        (true, _) => Scope::OnlyStatus,
        (false, true) => Scope::NotStatus,
        (false, false) => Scope::Everything,
    };
    Writer {
        manager: &opts.manager,
        subresource: if t.is_status() { "status" } else { "" },
        api_version: t.rt.api_version(),
        now,
        scope,
        lists,
    }
}
