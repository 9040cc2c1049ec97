//! Each verb on an object route, answered from the store: what it reads from the request, which
//! store method it calls, and the shape of its answer.

use std::sync::Arc;

use http::{HeaderMap, Response};
use serde_json::{Value, json};

use super::negotiate::{Form, decode_object, metadata_only, parse_yaml_or_json};
use super::params::{delete_options, list_options, patch_kind, strict_fields, write_options};
use super::respond::{Body, json_response};
use super::route::Query;
use super::shared::Shared;
use super::watch::watch;
use crate::discovery;
use crate::faults::Verb;
use crate::status::ApiError;
use crate::store::{PatchKind, Target, WriteOptions};

/// What a verb reads of its request, once the body is in.
pub(super) struct Sent<'a> {
    pub(super) query: &'a Query,
    pub(super) headers: &'a HeaderMap,
    pub(super) media: String,
    pub(super) bytes: &'a [u8],
}

impl Sent<'_> {
    fn write_options(&self, apply: bool, body: Option<&Value>) -> Result<WriteOptions, ApiError> {
        write_options(self.query, self.headers, apply, body)
    }
}

/// `verb` on `t`, answered in `form`.
pub(super) fn answer(
    shared: &Arc<Shared>,
    t: Target,
    verb: Verb,
    form: Form,
    sent: &Sent<'_>,
) -> Result<Response<Body>, ApiError> {
    if t.subresource.as_deref() == Some("scale") {
        let opts = sent.write_options(false, None)?;
        let (code, value) = scale_request(shared, &t, verb, sent.bytes, &sent.media, opts)?;
        return Ok(json_response(code, &value));
    }
    let (code, value) = match verb {
        Verb::Get => get(shared, &t, form)?,
        Verb::List => list(shared, &t, form, sent.query)?,
        Verb::Watch => return watch(shared, t, sent.query, form == Form::Metadata),
        Verb::Create => {
            let body = decode_object(sent.bytes, &sent.media, &t.rt)?;
            let opts = sent.write_options(false, None)?;
            strict_fields(sent.query, &t, &body)?;
            (201, shared.state().create(&t, body, &opts)?)
        }
        Verb::Update => {
            let body = decode_object(sent.bytes, &sent.media, &t.rt)?;
            let opts = sent.write_options(false, None)?;
            strict_fields(sent.query, &t, &body)?;
            (200, shared.state().update(&t, body, &opts)?)
        }
        Verb::Patch => patch(shared, &t, sent)?,
        Verb::Delete | Verb::DeleteCollection => {
            let opts = delete_options(sent.query, sent.bytes)?;
            let mut state = shared.state();
            if verb == Verb::Delete {
                (200, state.delete(&t, &opts)?)
            } else {
                (
                    200,
                    state.delete_collection(&t, &list_options(sent.query, &t.rt)?, &opts)?,
                )
            }
        }
    };
    Ok(json_response(code, &value))
}

/// The resourceVersion a list or an object carries in its metadata.
fn resource_version_of(v: &Value) -> String {
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn get(shared: &Arc<Shared>, t: &Target, form: Form) -> Result<(u16, Value), ApiError> {
    let o = shared.state().get(t)?;
    Ok(match form {
        Form::Metadata => (200, metadata_only(&o)),
        Form::Table => {
            let rv = resource_version_of(&o);
            (200, discovery::table(&t.rt, &[o], &rv))
        }
        Form::Full => (200, o),
    })
}

fn list(shared: &Arc<Shared>, t: &Target, form: Form, query: &Query) -> Result<(u16, Value), ApiError> {
    let opts = list_options(query, &t.rt)?;
    let list = shared.state().list(t, &opts)?;
    Ok(match form {
        Form::Metadata => {
            let items: Vec<Value> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(metadata_only)
                .collect();
            (
                200,
                json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                "metadata": list["metadata"], "items": items}),
            )
        }
        Form::Table => {
            let items = list["items"].as_array().cloned().unwrap_or_default();
            let rv = resource_version_of(&list);
            let mut table = discovery::table(&t.rt, &items, &rv);
            if let Some(c) = list.pointer("/metadata/continue") {
                table["metadata"]["continue"] = c.clone();
            }
            (200, table)
        }
        Form::Full => (200, list),
    })
}

fn patch(shared: &Arc<Shared>, t: &Target, sent: &Sent<'_>) -> Result<(u16, Value), ApiError> {
    let kind = patch_kind(&sent.media, t.rt.custom)?;
    let body = match kind {
        PatchKind::Apply => {
            parse_yaml_or_json(sent.bytes).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
        }
        _ => serde_json::from_slice(sent.bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
    };
    let opts = sent.write_options(kind == PatchKind::Apply, None)?;
    if kind != PatchKind::Json {
        strict_fields(sent.query, t, &body)?;
    }
    let mut state = shared.state();
    let existed = state.get(t).is_ok();
    let out = state.patch(t, kind, body, &opts)?;
    Ok((if existed { 200 } else { 201 }, out))
}

/// `GET`, `PUT` or `PATCH` of `<object>/scale`: the object's Scale, and a write of its
/// `spec.replicas` as a merge patch of the object (so its schema and generation apply).
fn scale_request(
    shared: &Arc<Shared>,
    t: &Target,
    verb: Verb,
    bytes: &[u8],
    media: &str,
    opts: WriteOptions,
) -> Result<(u16, Value), ApiError> {
    let object = Target {
        subresource: None,
        ..t.clone()
    };
    let paths = t.rt.scale.clone().ok_or_else(ApiError::no_such_resource)?;
    let mut state = shared.state();
    let current = paths.scale_of(&state.get(&object)?);
    let wanted = match verb {
        Verb::Get => return Ok((200, current)),
        Verb::Update => {
            serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("error decoding Scale: {e}")))?
        }
        Verb::Patch => {
            let patch: Value = serde_json::from_slice(bytes)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let mut scale = current;
            match patch_kind(media, false)? {
                PatchKind::Json => crate::patch::json_patch(&mut scale, &patch)
                    .map_err(|e| ApiError::new(422, "Invalid", format!("applying the patch to the Scale: {e:?}")))?,
                PatchKind::Merge | PatchKind::Strategic => crate::patch::json_merge(&mut scale, &patch),
                PatchKind::Apply => {
                    return Err(ApiError::unsupported_media_type(&[
                        "application/json-patch+json",
                        "application/merge-patch+json",
                        "application/strategic-merge-patch+json",
                    ]));
                }
            }
            scale
        }
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "the scale subresource takes get, update and patch",
            ));
        }
    };
    let written = state.patch(&object, PatchKind::Merge, paths.object_patch(&wanted)?, &opts)?;
    Ok((200, paths.scale_of(&written)))
}
