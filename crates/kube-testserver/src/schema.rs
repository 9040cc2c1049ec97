//! What the API server does with a custom resource's OpenAPI v3 schema, in its order: drop
//! nulls the schema does not allow, prune unknown fields, apply defaults, validate the shape
//! (the `jsonschema` crate, Draft 4, which is what OpenAPI 3.0 schemas follow) and evaluate the
//! `x-kubernetes-validations` CEL rules (the `kube-cel` crate), `oldSelf` included on updates.

use jsonschema::error::ValidationErrorKind;
use serde_json::{Map, Value};

use crate::status::FieldCause;

/// A compiled structural schema of one custom resource version.
pub(crate) struct Schema {
    openapi: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema").finish_non_exhaustive()
    }
}

impl Schema {
    pub(crate) fn compile(openapi: &Value) -> Result<Self, String> {
        let json_schema = to_json_schema(openapi);
        let validator = jsonschema::draft4::options()
            .build(&json_schema)
            .map_err(|e| e.to_string())?;
        Ok(Self {
            openapi: openapi.clone(),
            validator,
        })
    }

    /// Nulls dropped, unknown fields pruned and defaults applied, as on every write.
    pub(crate) fn normalise(&self, object: &mut Value) {
        drop_nulls(&self.openapi, object);
        prune(&self.openapi, object, true);
        *object = kube_cel::apply_defaults(&self.openapi, object);
    }

    /// The `x-kubernetes-list-type` of the list at a FieldsV1 path, if the schema declares one.
    pub(crate) fn list_type(&self, path: &[String]) -> Option<crate::fields::ListType> {
        let mut node = &self.openapi;
        for element in path {
            node = match element.strip_prefix("f:") {
                Some(name) => node
                    .pointer(&format!("/properties/{}", name.replace('~', "~0").replace('/', "~1")))
                    .or_else(|| value_schema(node))?,
                None => node.get("items")?,
            };
        }
        match node.get("x-kubernetes-list-type").and_then(Value::as_str)? {
            "set" => Some(crate::fields::ListType::Set),
            "map" => {
                let keys = node.get("x-kubernetes-list-map-keys").and_then(Value::as_array)?;
                Some(crate::fields::ListType::Map(
                    keys.iter().filter_map(|k| k.as_str().map(str::to_string)).collect(),
                ))
            }
            _ => Some(crate::fields::ListType::Atomic),
        }
    }

    /// The fields pruning would drop, as dotted paths (for `fieldValidation=Strict`).
    pub(crate) fn unknown_fields(&self, object: &Value) -> Vec<String> {
        let mut found = Vec::new();
        unknown(&self.openapi, object, true, "", &mut found);
        found
    }

    /// Every field that breaks the schema or one of its CEL rules. `old` is the stored object on
    /// an update, so transition rules (`oldSelf`) are evaluated.
    pub(crate) fn validate(&self, object: &Value, old: Option<&Value>) -> Vec<FieldCause> {
        let errors: Vec<jsonschema::ValidationError<'_>> = self.validator.iter_errors(object).collect();
        // As on the real server, CEL rules run unless the object has the wrong shape (a type
        // error), where the rules could not be evaluated meaningfully.
        let wrong_shape = errors
            .iter()
            .any(|e| matches!(e.kind(), ValidationErrorKind::Type { .. }));
        let mut causes: Vec<FieldCause> = errors.iter().map(cause_of).collect();
        if !wrong_shape && let Err(errors) = kube_cel::Validator::new().validate(&self.openapi, object, old) {
            for e in errors.into_vec() {
                let field = if e.field_path.is_empty() {
                    "<nil>".to_string()
                } else {
                    e.field_path.clone()
                };
                let value = lookup_dotted(object, &e.field_path).cloned().unwrap_or(Value::Null);
                let mut cause = FieldCause::invalid(field, &value, e.message.clone());
                if e.reason.as_deref() == Some("FieldValueForbidden") {
                    cause = FieldCause::forbidden(cause.field, e.message.clone());
                }
                causes.push(cause);
            }
        }
        causes
    }
}

/// The dotted field path (`spec.port`, `spec.hosts[0]`) of a JSON pointer.
pub(crate) fn dotted(pointer: &str) -> String {
    let mut out = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if segment.parse::<usize>().is_ok() {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&segment);
        }
    }
    out
}

fn lookup_dotted<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = object;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        cur = cur.get(name)?;
        if let Some(i) = index {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

fn cause_of(e: &jsonschema::ValidationError<'_>) -> FieldCause {
    let path = dotted(&e.instance_path().to_string());
    let at = if path.is_empty() {
        "body".to_string()
    } else {
        path.clone()
    };
    let value = e.instance().as_ref();
    match e.kind() {
        ValidationErrorKind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            let field = if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            };
            FieldCause::required(field, "")
        }
        ValidationErrorKind::Enum { options } => {
            let listed: Vec<String> = options
                .as_array()
                .map(|a| a.iter().map(Value::to_string).collect())
                .unwrap_or_default();
            FieldCause {
                reason: "FieldValueNotSupported",
                field: at,
                detail: format!("Unsupported value: {value}: supported values: {}", listed.join(", ")),
            }
        }
        ValidationErrorKind::Type { .. } => {
            FieldCause::invalid(&at, value, format!("{at} in body must be of type {}", type_words(e)))
        }
        ValidationErrorKind::Maximum { limit } => FieldCause::invalid(
            &at,
            value,
            format!("{at} in body should be less than or equal to {}", bound(limit)),
        ),
        ValidationErrorKind::Minimum { limit } => FieldCause::invalid(
            &at,
            value,
            format!("{at} in body should be greater than or equal to {}", bound(limit)),
        ),
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            FieldCause::invalid(&at, value, format!("{at} in body should be less than {}", bound(limit)))
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => FieldCause::invalid(
            &at,
            value,
            format!("{at} in body should be greater than {}", bound(limit)),
        ),
        ValidationErrorKind::MaxLength { limit } => FieldCause {
            reason: "FieldValueTooLong",
            field: at,
            detail: format!("Too long: may not be more than {limit} bytes"),
        },
        ValidationErrorKind::MinLength { limit } => FieldCause::invalid(
            &at,
            value,
            format!("{at} in body should be at least {limit} chars long"),
        ),
        ValidationErrorKind::Pattern { pattern } => {
            FieldCause::invalid(&at, value, format!("{at} in body should match '{pattern}'"))
        }
        ValidationErrorKind::MaxItems { limit } => FieldCause {
            reason: "FieldValueTooMany",
            field: at,
            detail: format!("Too many: must have at most {limit} items"),
        },
        ValidationErrorKind::MinItems { limit } => {
            FieldCause::invalid(&at, value, format!("{at} in body should have at least {limit} items"))
        }
        _ => FieldCause::invalid(&at, value, format!("{at} in body {}", e.masked())),
    }
}

/// A schema bound as the real server prints it: `1`, not `1.0`, for a whole number.
fn bound(limit: &Value) -> String {
    match limit.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => limit.to_string(),
    }
}

fn type_words(e: &jsonschema::ValidationError<'_>) -> String {
    match e.kind() {
        ValidationErrorKind::Type { kind } => format!("{kind:?}")
            .to_lowercase()
            .replace("single(", "")
            .replace(')', ""),
        _ => String::new(),
    }
}

/// OpenAPI 3.0 keywords JSON Schema spells differently: `nullable` and `x-kubernetes-int-or-string`.
fn to_json_schema(openapi: &Value) -> Value {
    match openapi {
        Value::Object(map) => {
            let mut out: Map<String, Value> = map.iter().map(|(k, v)| (k.clone(), to_json_schema(v))).collect();
            // `default` and `example` hold data, not schemas: keep them as they are.
            for key in ["default", "example", "enum"] {
                if let Some(v) = map.get(key) {
                    out.insert(key.into(), v.clone());
                }
            }
            if map.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
                out.remove("type");
                out.insert(
                    "anyOf".into(),
                    serde_json::json!([{"type": "integer"}, {"type": "string"}]),
                );
            }
            if map.get("nullable").and_then(Value::as_bool) == Some(true)
                && let Some(Value::String(t)) = map.get("type")
            {
                out.insert("type".into(), serde_json::json!([t, "null"]));
                if let Some(Value::Array(options)) = out.get_mut("enum") {
                    options.push(Value::Null);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(to_json_schema).collect()),
        other => other.clone(),
    }
}

fn nullable(schema: &Value) -> bool {
    schema.get("nullable").and_then(Value::as_bool) == Some(true)
}

fn preserves_unknown(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

/// The schema of a map's values (`additionalProperties` as a schema), if it is a map.
fn value_schema(schema: &Value) -> Option<&Value> {
    schema.get("additionalProperties").filter(|s| s.is_object())
}

/// Nulls in fields that are not nullable are removed, as the server does before defaulting.
fn drop_nulls(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            let props = schema.get("properties");
            map.retain(|k, v| {
                let field = props.and_then(|p| p.get(k)).or_else(|| value_schema(schema));
                !(v.is_null() && field.is_some_and(|f| !nullable(f)))
            });
            for (k, v) in map.iter_mut() {
                if let Some(field) = props.and_then(|p| p.get(k)).or_else(|| value_schema(schema)) {
                    drop_nulls(field, v);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                items.iter_mut().for_each(|v| drop_nulls(item, v));
            }
        }
        _ => {}
    }
}

fn unknown(schema: &Value, value: &Value, root: bool, at: &str, found: &mut Vec<String>) {
    let join = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let keep_all = preserves_unknown(schema)
                || value_schema(schema).is_some()
                || schema.get("additionalProperties") == Some(&Value::Bool(true));
            for (k, v) in map {
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match props.and_then(|p| p.get(k)).or_else(|| value_schema(schema)) {
                    Some(field) => unknown(field, v, false, &join(k), found),
                    None if !keep_all => found.push(join(k)),
                    None => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    unknown(item, v, false, &format!("{at}[{i}]"), found);
                }
            }
        }
        _ => {}
    }
}

/// Fields the schema does not name are removed, unless it preserves unknown fields there.
/// At the root, `apiVersion`, `kind` and `metadata` always stay.
fn prune(schema: &Value, value: &mut Value, root: bool) {
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let keep_all = preserves_unknown(schema)
                || value_schema(schema).is_some()
                || schema.get("additionalProperties") == Some(&Value::Bool(true));
            if !keep_all {
                map.retain(|k, _| {
                    (root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                        || props.is_some_and(|p| p.contains_key(k))
                });
            }
            for (k, v) in map.iter_mut() {
                if root && k == "metadata" {
                    continue;
                }
                if let Some(field) = props.and_then(|p| p.get(k)).or_else(|| value_schema(schema)) {
                    prune(field, v, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                items.iter_mut().for_each(|v| prune(item, v, false));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::compile(&json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["mode"],
                    "properties": {
                        "mode": {"type": "string", "enum": ["A", "B"]},
                        "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 3128},
                        "note": {"type": "string", "nullable": true, "maxLength": 5},
                        "limit": {"type": "integer"}
                    },
                    "x-kubernetes-validations": [{"rule": "self.mode != 'B' || has(self.note)", "message": "B needs a note"}]
                }
            }
        }))
        .unwrap()
    }

    #[test]
    fn normalise_prunes_drops_nulls_and_defaults() {
        let s = schema();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "extra": 1},
            "spec": {"mode": "A", "unknown": true, "note": null, "limit": null}, "stray": 1});
        s.normalise(&mut obj);
        assert_eq!(
            obj,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "extra": 1},
            "spec": {"mode": "A", "note": null, "port": 3128}})
        );
    }

    #[test]
    fn validation_names_each_field() {
        let s = schema();
        let causes = s.validate(&json!({"spec": {"mode": "C", "port": 70000}}), None);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"spec.mode"), "{causes:?}");
        assert!(fields.contains(&"spec.port"), "{causes:?}");
        let port = causes.iter().find(|c| c.field == "spec.port").unwrap();
        assert_eq!(
            port.detail,
            "Invalid value: 70000: spec.port in body should be less than or equal to 65535"
        );
        let missing = s.validate(&json!({"spec": {}}), None);
        assert_eq!(missing[0].field, "spec.mode");
        assert_eq!(missing[0].reason, "FieldValueRequired");
    }

    #[test]
    fn cel_rules_run_when_the_shape_is_valid() {
        let s = schema();
        let causes = s.validate(&json!({"spec": {"mode": "B"}}), None);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert!(causes[0].detail.contains("B needs a note"), "{causes:?}");
        assert!(
            s.validate(&json!({"spec": {"mode": "B", "note": "n"}}), None)
                .is_empty()
        );
    }

    #[test]
    fn dotted_paths() {
        assert_eq!(dotted("/spec/hosts/0/name"), "spec.hosts[0].name");
        assert_eq!(dotted(""), "");
    }
}
