//! What a candidate object must pass before it is written: its namespace open for writes, its
//! type and namespace as the URL says, its name, the kind's own rules and the schema.

use serde_json::{Value, json};

use super::meta::{is_dns_label, is_dns_subdomain, meta, meta_mut, meta_str};
use super::options::Target;
use super::state::State;
use crate::resources::from_crd;
use crate::status::{ApiError, FieldCause};

impl State {
    pub(super) fn check_namespace_for_write(&self, t: &Target) -> Result<(), ApiError> {
        if !t.rt.namespaced {
            return Ok(());
        }
        let ns = t.ns();
        let key = self.builtin("", "namespaces").key();
        match self.bucket(&key).and_then(|b| b.get(&(String::new(), ns.clone()))) {
            None => Err(ApiError::not_found("", "namespaces", &ns)),
            Some(o) if meta(o).contains_key("deletionTimestamp") => Err(ApiError::forbidden(
                &t.rt.group,
                &t.rt.plural,
                t.name(),
                format!(
                    "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    t.rt.qualified(),
                    t.name()
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Checks the body's apiVersion and kind and fills them in when absent.
    pub(super) fn check_type(t: &Target, body: &mut Value) -> Result<(), ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: expected an object",
                t.rt.kind
            )));
        }
        let expected = t.rt.api_version();
        // Any served version of the group is accepted; the object is stored as the requested one.
        match body.get("apiVersion").and_then(Value::as_str) {
            Some(v) if v != expected && !(t.rt.group.is_empty() && v == "v1") => {
                let group_of = |v: &str| v.rsplit_once('/').map_or(String::new(), |(g, _)| g.to_string());
                if group_of(v) != t.rt.group {
                    return Err(ApiError::bad_request(format!(
                        "the API version in the data ({v}) does not match the expected API version ({expected})"
                    )));
                }
            }
            _ => {}
        }
        match body.get("kind").and_then(Value::as_str) {
            Some(k) if k != t.rt.kind => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    t.rt.kind
                )));
            }
            _ => {}
        }
        body["apiVersion"] = json!(expected);
        body["kind"] = json!(t.rt.kind);
        Ok(())
    }

    pub(super) fn check_namespace_in_body(t: &Target, body: &mut Value) -> Result<(), ApiError> {
        let ns = t.ns();
        let m = meta_mut(body);
        if t.rt.namespaced {
            match m.get("namespace").and_then(Value::as_str) {
                Some(given) if !given.is_empty() && given != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {
                    m.insert("namespace".into(), json!(ns));
                }
            }
        } else {
            m.remove("namespace");
        }
        Ok(())
    }

    /// Kind-specific and schema-driven normalisation and validation of a candidate object.
    pub(super) fn admit(&self, t: &Target, object: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
        let name = meta_str(object, "name").unwrap_or_default().to_string();
        let mut causes = Vec::new();
        let name_ok = if t.rt.label_names {
            is_dns_label(&name)
        } else {
            is_dns_subdomain(&name)
        };
        if !name_ok {
            let rule = if t.rt.label_names {
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
            } else {
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            };
            causes.push(FieldCause::invalid("metadata.name", &json!(name), rule));
        }
        if t.rt.plural == "secrets" && t.rt.group.is_empty() {
            fold_string_data(object).map_err(|why| {
                ApiError::bad_request(format!("Secret in version \"v1\" cannot be handled as a Secret: {why}"))
            })?;
            // The API server's default for a Secret without a type.
            if object.get("type").and_then(Value::as_str).is_none_or(str::is_empty) {
                object["type"] = json!("Opaque");
            }
        }
        if let Some(schema) = &t.rt.schema {
            schema.normalise(object);
            causes.extend(schema.validate(object, old));
        }
        if t.rt.group == "apiextensions.k8s.io"
            && let Err(e) = from_crd(object)
        {
            causes.push(FieldCause::invalid("spec", &Value::Null, e.0));
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&t.rt.kind, &t.rt.group, &name, causes))
        }
    }
}

/// `stringData` is write-only: it is folded into `data` (base64) as the server does.
/// A value that is not a string is refused with the decoder's complaint.
fn fold_string_data(secret: &mut Value) -> Result<(), String> {
    let string_data = match secret.as_object_mut().and_then(|m| m.remove("stringData")) {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err("stringData: expected a map of strings".into()),
    };
    if !secret.get("data").is_some_and(Value::is_object) {
        secret["data"] = json!({});
    }
    for (k, v) in string_data {
        let Some(text) = v.as_str() else {
            return Err(format!("stringData.{k}: expected a string"));
        };
        secret["data"][k] = json!(data_encoding::BASE64.encode(text.as_bytes()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_data_is_folded_into_data() {
        let mut s = json!({"data": {"a": "eA=="}, "stringData": {"b": "hi"}});
        fold_string_data(&mut s).unwrap();
        assert_eq!(s, json!({"data": {"a": "eA==", "b": "aGk="}}));
    }
}
