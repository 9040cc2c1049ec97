//! PATCH in its four forms: JSON patch, merge patch, strategic merge patch and server-side
//! apply.

use serde_json::{Value, json};

use super::change::ChangeKind;
use super::meta::{meta, meta_mut, meta_str, now};
use super::options::{PatchKind, Target, WriteOptions};
use super::state::State;
use super::write::{list_type, writer};
use crate::fields;
use crate::patch::{self, PatchFailure};
use crate::status::{ApiError, FieldCause};

impl State {
    pub(crate) fn patch(
        &mut self,
        t: &Target,
        kind: PatchKind,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        if kind == PatchKind::Strategic && t.rt.custom {
            return Err(ApiError::unsupported_media_type(&[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
            ]));
        }
        let current = self.lookup(t).cloned();
        if kind == PatchKind::Apply {
            if current.is_none() && t.is_status() {
                return Err(t.not_found());
            }
            return self.apply(t, current, body, opts);
        }
        let current = current.ok_or_else(|| t.not_found())?;
        let mut patched = Self::shown(&t.rt, &current);
        match kind {
            PatchKind::Merge => {
                if !body.is_object() {
                    return Err(ApiError::bad_request(
                        "error decoding patch: a merge patch must be a JSON object",
                    ));
                }
                patch::json_merge(&mut patched, &body);
            }
            PatchKind::Strategic => {
                if !body.is_object() {
                    return Err(ApiError::bad_request(
                        "error decoding patch: a strategic merge patch must be a JSON object",
                    ));
                }
                patch::strategic_merge(&mut patched, &body);
            }
            PatchKind::Json => {
                match patch::json_patch(&mut patched, &body) {
                    Ok(()) => {}
                    Err(PatchFailure::Malformed(e)) => return Err(ApiError::bad_request(e)),
                    Err(PatchFailure::DoesNotApply(e)) => return Err(ApiError::patch_failed(e)),
                }
                if opts.strict
                    && let Some(schema) = &t.rt.schema
                {
                    let unknown = schema.unknown_fields(&patched);
                    if !unknown.is_empty() {
                        let listed: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
                        return Err(ApiError::bad_request(format!(
                            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                            t.rt.kind,
                            t.rt.api_version(),
                            t.rt.kind,
                            listed.join(", ")
                        )));
                    }
                }
            }
            PatchKind::Apply => unreachable!("handled above"),
        }
        if !patched.is_object() {
            return Err(ApiError::patch_failed("the patched document is not an object"));
        }
        if meta_str(&patched, "name") != Some(t.name()) {
            let given = meta_str(&patched, "name").unwrap_or_default();
            return Err(ApiError::bad_request(format!(
                "the name of the object ({given}) does not match the name on the URL ({})",
                t.name()
            )));
        }
        Self::check_type(t, &mut patched)?;
        Self::check_namespace_in_body(t, &mut patched)?;
        let patched = Self::stored(&t.rt, patched);
        self.write(t, &current, patched, opts, None)
    }

    pub(super) fn apply(
        &mut self,
        t: &Target,
        current: Option<Value>,
        mut body: Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        check_apply_configuration(opts, &body)?;
        Self::check_type(t, &mut body)?;
        Self::check_namespace_in_body(t, &mut body)?;
        // The name may be left out (it is taken from the URL), not changed.
        match meta_str(&body, "name") {
            None | Some("") => {
                meta_mut(&mut body).insert("name".into(), json!(t.name()));
            }
            Some(n) if n == t.name() => {}
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({})",
                    t.name()
                )));
            }
        }
        let now = now();
        let lists = |p: &[String]| list_type(&t.rt, p);
        let who = writer(t, opts, &now, &lists);
        let shell = json!({"apiVersion": t.rt.api_version(), "kind": t.rt.kind,
            "metadata": {"name": t.name(), "namespace": t.namespace}});
        // Applied in the store's terms, as every other write records ownership: one set of
        // field names in managedFields, whichever API a manager writes through.
        let body = Self::stored(&t.rt, body);
        let base = current.clone().unwrap_or(shell);
        let merged =
            fields::apply(&base, &body, opts.force, &who).map_err(|conflicts| apply_conflict(t, &conflicts))?;
        match current {
            Some(old) => {
                // Apply is not an optimistic write unless the configuration names a resourceVersion.
                let mut merged = merged;
                let wanted_rv = meta_str(&body, "resourceVersion").unwrap_or_default().to_string();
                meta_mut(&mut merged).insert("resourceVersion".into(), json!(wanted_rv));
                self.write(t, &old, merged, opts, Some(&body))
            }
            None => {
                let mut merged = merged;
                meta_mut(&mut merged).remove("resourceVersion");
                let fields = meta(&merged).get("managedFields").cloned();
                // create takes the object as the requested version shows it.
                let created = self.create(
                    t,
                    Self::shown(&t.rt, &merged),
                    &WriteOptions {
                        dry_run: true,
                        ..opts.clone()
                    },
                )?;
                let mut created = Self::stored(&t.rt, created);
                if let Some(f) = fields {
                    meta_mut(&mut created).insert("managedFields".into(), f);
                }
                if opts.dry_run {
                    return Ok(Self::shown(&t.rt, &created));
                }
                let t = Target {
                    name: Some(t.name().to_string()),
                    ..t.clone()
                };
                self.after_create(&t, &created)?;
                let created = self.commit(&t.rt, ChangeKind::Added, created);
                Ok(Self::shown(&t.rt, &created))
            }
        }
    }
}

/// What an apply configuration must be before it is looked at: sent by a named field manager, an
/// object that names its type itself and carries no managedFields.
fn check_apply_configuration(opts: &WriteOptions, body: &Value) -> Result<(), ApiError> {
    if opts.manager.is_empty() {
        let cause = FieldCause::required("fieldManager", "is required for apply patch");
        return Err(ApiError::invalid("PatchOptions", "meta.k8s.io", "", vec![cause]));
    }
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "error decoding YAML: an apply configuration must be an object",
        ));
    }
    // An apply configuration names its type itself, and never carries managedFields.
    if body.get("apiVersion").and_then(Value::as_str).is_none_or(str::is_empty)
        || body.get("kind").and_then(Value::as_str).is_none_or(str::is_empty)
    {
        return Err(ApiError::bad_request(
            "invalid object type: apiVersion and kind must be set in an apply configuration",
        ));
    }
    if meta(body).get("managedFields").is_some_and(|m| !m.is_null()) {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    Ok(())
}

/// The 409 of an apply that met fields other managers own, each conflict a cause.
fn apply_conflict(t: &Target, conflicts: &[fields::ApplyConflict]) -> ApiError {
    let mut e = ApiError::conflict(&t.rt.group, &t.rt.plural, t.name(), "");
    e.message = fields::conflict_message(conflicts);
    e.details["causes"] = Value::Array(
        conflicts
            .iter()
            .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.field}))
            .collect(),
    );
    e
}
