//! Errors as the API server reports them: a `meta/v1 Status` body with a code, a reason and
//! details. Messages follow the wording of kube-apiserver, since clients and people match on them.

use serde_json::{Value, json};

/// One failed request: what goes into the `Status` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Value,
}

/// How an object is named in messages: `pods`, `proxies.crawl.example.com`.
pub(crate) fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = serde_json::Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    d.insert("kind".into(), json!(kind));
    Value::Object(d)
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: json!({}),
        }
    }

    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", qualified(group, plural)),
            details: details(name, group, plural),
        }
    }

    /// A path the server does not serve (an unknown resource, group or version).
    pub(crate) fn no_such_resource() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource")
    }

    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} \"{name}\" already exists", qualified(group, plural)),
            details: details(name, group, plural),
        }
    }

    pub(crate) fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
            details: details(name, group, plural),
        }
    }

    pub(crate) fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 with one cause per field, as field validation reports it.
    pub(crate) fn invalid(kind: &str, group: &str, name: &str, causes: Vec<FieldCause>) -> Self {
        let gk = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let listed: Vec<String> = causes.iter().map(FieldCause::sentence).collect();
        let joined = if listed.len() == 1 {
            listed[0].clone()
        } else {
            format!("[{}]", listed.join(", "))
        };
        let mut d = details(name, group, kind);
        d["causes"] = Value::Array(
            causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.detail, "field": c.field}))
                .collect(),
        );
        Self {
            code: 422,
            reason: "Invalid",
            message: format!("{gk} \"{name}\" is invalid: {joined}"),
            details: d,
        }
    }

    /// A patch that parsed but cannot be applied to the object.
    pub(crate) fn patch_failed(cause: impl Into<String>) -> Self {
        let cause = cause.into();
        Self {
            code: 422,
            reason: "Invalid",
            message: format!("the server rejected our request due to an error in our request: {cause}"),
            details: json!({"causes": [{"reason": "UnexpectedServerResponse", "message": cause}]}),
        }
    }

    pub(crate) fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    pub(crate) fn method_not_allowed(verb: &str, what: &str) -> Self {
        Self::new(405, "MethodNotAllowed", format!("{verb} is not supported on {what}"))
    }

    pub(crate) fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    pub(crate) fn forbidden(group: &str, plural: &str, name: &str, message: impl Into<String>) -> Self {
        Self {
            code: 403,
            reason: "Forbidden",
            message: message.into(),
            details: details(name, group, plural),
        }
    }

    /// The `Status` body sent for this error.
    pub fn to_status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        })
    }
}

/// One field-level problem in a 422 answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldCause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, `FieldValueForbidden`...
    pub(crate) reason: &'static str,
    pub(crate) field: String,
    pub(crate) detail: String,
}

impl FieldCause {
    pub(crate) fn invalid(field: impl Into<String>, value: &Value, detail: impl Into<String>) -> Self {
        let field = field.into();
        let detail = detail.into();
        Self {
            reason: "FieldValueInvalid",
            detail: format!("Invalid value: {}: {detail}", short(value)),
            field,
        }
    }

    pub(crate) fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            detail: format!("Required value: {}", detail.into()),
        }
    }

    pub(crate) fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueForbidden",
            field: field.into(),
            detail: format!("Forbidden: {}", detail.into()),
        }
    }

    fn sentence(&self) -> String {
        format!("{}: {}", self.field, self.detail)
    }
}

/// A value as it appears in a validation message: strings quoted, large values elided.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 80 {
        format!("{}...", text.chars().take(77).collect::<String>())
    } else {
        text
    }
}
