//! The query parameters and bodies that shape a verb: patch type, dry run, field manager, list
//! selectors and paging, field validation, delete options.

use http::{HeaderMap, header};
use serde_json::Value;

use super::route::Query;
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{DeleteOptions, ListOptions, PatchKind, Target, WriteOptions};

pub(super) fn patch_kind(media: &str, custom: bool) -> Result<PatchKind, ApiError> {
    match media {
        "application/json-patch+json" => Ok(PatchKind::Json),
        "application/merge-patch+json" => Ok(PatchKind::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
        "application/apply-patch+yaml" => Ok(PatchKind::Apply),
        _ => {
            let mut accepted = vec![
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
            ];
            if !custom {
                accepted.push("application/strategic-merge-patch+json");
            }
            Err(ApiError::unsupported_media_type(&accepted))
        }
    }
}

fn dry_run(query: &Query, body: Option<&Value>) -> Result<bool, ApiError> {
    let from_body = body
        .and_then(|b| b.get("dryRun"))
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    match query.get("dryRun") {
        None | Some("") => Ok(from_body),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid dryRun value: {other}: supported values: \"All\""
        ))),
    }
}

/// The field manager: the `fieldManager` parameter, else the client's user agent up to its first
/// `/`, as the real server derives it.
fn manager(query: &Query, headers: &HeaderMap, apply: bool) -> String {
    match query.get("fieldManager") {
        Some(m) => m.to_string(),
        None if apply => String::new(),
        None => headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|ua| ua.split('/').next().unwrap_or(ua).to_string())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "unknown".into()),
    }
}

/// The options of a write: its field manager (required for apply), dry run, force, strict
/// field validation.
pub(super) fn write_options(
    query: &Query,
    headers: &HeaderMap,
    apply: bool,
    body: Option<&Value>,
) -> Result<WriteOptions, ApiError> {
    Ok(WriteOptions {
        manager: manager(query, headers, apply),
        dry_run: dry_run(query, body)?,
        force: query.flag("force"),
        strict: query.get("fieldValidation") == Some("Strict"),
    })
}

pub(super) fn list_options(query: &Query, rt: &ResourceType) -> Result<ListOptions, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default()).map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), rt.selectable_fields)
        .map_err(ApiError::bad_request)?;
    let limit = match query.get("limit") {
        None | Some("") => None,
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        ),
    };
    let continue_token = query.get("continue").filter(|c| !c.is_empty()).map(str::to_string);
    Ok(ListOptions {
        labels,
        fields,
        limit,
        continue_token,
    })
}

/// `fieldValidation=Strict` refuses fields the schema does not declare (the default, `Warn`,
/// and `Ignore` let pruning drop them silently).
pub(super) fn strict_fields(query: &Query, t: &Target, body: &Value) -> Result<(), ApiError> {
    match query.get("fieldValidation") {
        None | Some("" | "Ignore" | "Warn") => Ok(()),
        Some("Strict") => match &t.rt.schema {
            Some(schema) => {
                let unknown = schema.unknown_fields(body);
                if unknown.is_empty() {
                    Ok(())
                } else {
                    let listed: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
                    Err(ApiError::bad_request(format!(
                        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                        t.rt.kind,
                        t.rt.api_version(),
                        t.rt.kind,
                        listed.join(", ")
                    )))
                }
            }
            None => Ok(()),
        },
        Some(other) => Err(ApiError::bad_request(format!(
            "fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\", got \"{other}\""
        ))),
    }
}

/// The options of a delete: its query and its `DeleteOptions` body (when it has one).
pub(super) fn delete_options(query: &Query, bytes: &[u8]) -> Result<DeleteOptions, ApiError> {
    let body: Option<Value> = if bytes.is_empty() {
        None
    } else {
        Some(
            serde_json::from_slice(bytes)
                .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?,
        )
    };
    let policy = body
        .as_ref()
        .and_then(|b| b.get("propagationPolicy"))
        .and_then(Value::as_str)
        .or(query.get("propagationPolicy"));
    Ok(DeleteOptions {
        dry_run: dry_run(query, body.as_ref())?,
        orphan: match policy {
            None | Some("" | "Background" | "Foreground") => false,
            Some("Orphan") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                )));
            }
        },
        precondition_uid: body
            .as_ref()
            .and_then(|b| b.pointer("/preconditions/uid"))
            .and_then(Value::as_str)
            .map(str::to_string),
        precondition_rv: body
            .as_ref()
            .and_then(|b| b.pointer("/preconditions/resourceVersion"))
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}
