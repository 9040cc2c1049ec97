//! Content negotiation: the shape a read is answered in (full, Table, metadata only), and the
//! object a write sends (JSON, YAML or protobuf).

use http::{HeaderMap, header};
use serde_json::{Value, json};

use crate::resources::ResourceType;
use crate::status::ApiError;

/// The shape a read is answered in, from the `Accept` header's `as=` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    Full,
    /// `meta.k8s.io/v1 Table`, for `kubectl get`.
    Table,
    /// `PartialObjectMetadata(List)`, for metadata-only clients and watchers.
    Metadata,
}

/// The first form the client accepts, in the order it lists them; JSON only.
pub(super) fn negotiate(headers: &HeaderMap) -> Result<Form, ApiError> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(Form::Full);
    };
    for option in accept.split(',') {
        let mut parts = option.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        if !matches!(media.as_str(), "application/json" | "*/*" | "application/*" | "") {
            continue;
        }
        let as_param = parts.find_map(|p| p.strip_prefix("as="));
        match as_param {
            None => return Ok(Form::Full),
            Some("Table") => return Ok(Form::Table),
            Some("PartialObjectMetadata" | "PartialObjectMetadataList") => return Ok(Form::Metadata),
            Some(_) => {}
        }
    }
    Err(ApiError::new(
        406,
        "NotAcceptable",
        "only the following media types are accepted: application/json",
    ))
}

/// One object as `PartialObjectMetadata`.
pub(super) fn metadata_only(object: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or(json!({}))})
}

pub(super) fn parse_yaml_or_json(bytes: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) => Ok(v),
        Err(json_err) => {
            let text = std::str::from_utf8(bytes).map_err(|_| json_err.to_string())?;
            serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
        }
    }
}

/// The object in a create or update body: JSON, YAML, or (for the built-in kinds kubectl sends
/// that way) the Kubernetes protobuf encoding.
pub(super) fn decode_object(bytes: &[u8], media: &str, rt: &ResourceType) -> Result<Value, ApiError> {
    let kind = rt.kind.as_str();
    let unrecognized = |e: String| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: {e}"
        ))
    };
    match media {
        "" | "application/json" => serde_json::from_slice(bytes).map_err(|e| unrecognized(e.to_string())),
        "application/yaml" => parse_yaml_or_json(bytes).map_err(unrecognized),
        crate::protobuf::MEDIA_TYPE => crate::protobuf::decode(bytes, rt),
        _ if crate::protobuf::supports(rt) => Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
            crate::protobuf::MEDIA_TYPE,
        ])),
        _ => Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
        ])),
    }
}
