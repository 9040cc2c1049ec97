//! Request bodies in the Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! which kubectl and client-go send for built-in kinds. The envelope is the magic `k8s\0`
//! followed by a `runtime.Unknown` naming the type and holding the object's own message; the
//! messages are decoded with `k8s-pb`'s types, and each kind's mapping to the JSON the store
//! keeps is written field by field: [`kinds`] (Secret, ConfigMap, Namespace, Event), [`pod`],
//! the metadata they share in [`meta`], on the builder of [`json`]; [`refusal`] words what
//! cannot be decoded.
//!
//! Covered: Secret, ConfigMap, Namespace, core `v1` Event and Pod (the kinds this server serves
//! that kubectl creates). Every field of the first four is mapped. A Pod's common fields are; a
//! Pod that sets one of the others (volumes, probes, security contexts, affinity, ...) is
//! refused with 415 naming the field, so nothing is ever dropped without a word: send it as
//! JSON. The destructuring is exhaustive, so a field that a newer `k8s-pb` adds does not
//! compile until it is mapped or refused. Fields `k8s-pb` itself does not know (a client newer
//! than its Kubernetes version) are skipped by prost, the one gap.

mod json;
mod kinds;
mod meta;
mod pod;
mod refusal;

use prost::Message;
use serde_json::{Value, json};

use crate::resources::ResourceType;
use crate::status::ApiError;
pub(crate) use refusal::MEDIA_TYPE;
use refusal::malformed;

/// What every protobuf-encoded object starts with.
const MAGIC: &[u8] = b"k8s\0";

/// Whether bodies of `rt` are decoded from protobuf here.
pub(crate) fn supports(rt: &ResourceType) -> bool {
    rt.group.is_empty()
        && rt.version == "v1"
        && matches!(
            rt.plural.as_str(),
            "secrets" | "configmaps" | "namespaces" | "events" | "pods"
        )
}

/// The object in a protobuf request body for `rt`, as the JSON the store keeps.
pub(crate) fn decode(bytes: &[u8], rt: &ResourceType) -> Result<Value, ApiError> {
    let kind = rt.kind.as_str();
    if !supports(rt) {
        // As the real server answers for custom resources, which have no protobuf form.
        return Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
        ]));
    }
    let body = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| malformed(kind, "the body does not start with the k8s protobuf magic"))?;
    let envelope = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(body).map_err(|e| malformed(kind, e))?;
    if envelope.content_encoding.as_deref().is_some_and(|e| !e.is_empty()) {
        return Err(malformed(kind, "a content encoding is not supported"));
    }
    let type_meta = envelope.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let sent_kind = type_meta.kind.unwrap_or_default();
    let raw = envelope.raw.unwrap_or_default();
    let decoded = match (rt.group.as_str(), rt.version.as_str(), rt.plural.as_str()) {
        ("", "v1", "secrets") => kinds::secret(decode_message(&raw, kind)?),
        ("", "v1", "configmaps") => kinds::config_map(decode_message(&raw, kind)?),
        ("", "v1", "namespaces") => kinds::namespace(decode_message(&raw, kind)?),
        ("", "v1", "events") => kinds::event(decode_message(&raw, kind)?),
        ("", "v1", "pods") => pod::pod(decode_message(&raw, kind)?)?,
        _ => unreachable!("supports() lists exactly these"),
    };
    // The envelope names the type as JSON's apiVersion and kind do; the store checks them.
    let mut object = decoded;
    if !api_version.is_empty() {
        object["apiVersion"] = json!(api_version);
    }
    if !sent_kind.is_empty() {
        object["kind"] = json!(sent_kind);
    }
    Ok(object)
}

/// The message in `raw`. NB: prost skips fields its type does not know (from a client newer
/// than `k8s-pb`'s Kubernetes version); they cannot be told from a re-encoding, which also drops
/// the empty map values client-go writes out, so they are not refused.
fn decode_message<M: Message + Default>(raw: &[u8], kind: &str) -> Result<M, ApiError> {
    M::decode(raw).map_err(|e| malformed(kind, e))
}

#[cfg(test)]
mod tests {
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;

    use super::*;

    fn envelope(api_version: &str, kind: &str, message: &impl Message) -> Vec<u8> {
        let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(message.encode_to_vec()),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC, unknown.encode_to_vec().as_slice()].concat()
    }

    fn rt(plural: &str) -> ResourceType {
        crate::resources::builtins()
            .into_iter()
            .find(|t| t.group.is_empty() && t.plural == plural)
            .expect("a built-in kind")
    }

    #[test]
    fn garbage_and_other_kinds_get_clear_errors() {
        let e = decode(b"not protobuf", &rt("secrets")).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("magic"), "{}", e.message);
        let e = decode(b"k8s\0\xff\xff\xff", &rt("secrets")).unwrap_err();
        assert_eq!(e.code, 400);
        let leases = crate::resources::builtins()
            .into_iter()
            .find(|t| t.plural == "leases")
            .unwrap();
        let e = decode(
            &envelope("coordination.k8s.io/v1", "Lease", &core::Secret::default()),
            &leases,
        )
        .unwrap_err();
        assert_eq!(e.code, 415);
    }

    #[test]
    fn a_pod_field_not_mapped_is_refused_by_name() {
        let pod = core::Pod {
            metadata: Some(meta::ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            }),
            spec: Some(core::PodSpec {
                containers: vec![core::Container {
                    name: Some("c".into()),
                    liveness_probe: Some(core::Probe::default()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        let e = decode(&envelope("v1", "Pod", &pod), &rt("pods")).unwrap_err();
        assert_eq!(e.code, 415);
        assert!(e.message.contains("spec.containers[0].livenessProbe"), "{}", e.message);
        let pod = core::Pod {
            spec: Some(core::PodSpec {
                volumes: vec![core::Volume::default()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = decode(&envelope("v1", "Pod", &pod), &rt("pods")).unwrap_err();
        assert!(e.message.contains("spec.volumes"), "{}", e.message);
    }
}
