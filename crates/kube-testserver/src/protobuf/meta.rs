//! `ObjectMeta` and `ObjectReference`, as every kind carries them.

use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use serde_json::Value;

use super::json::{Fields, time};

pub(super) fn object_meta(m: Option<meta::ObjectMeta>) -> Value {
    let meta::ObjectMeta {
        name,
        generate_name,
        namespace,
        self_link,
        uid,
        resource_version,
        generation,
        creation_timestamp,
        deletion_timestamp,
        deletion_grace_period_seconds,
        labels,
        annotations,
        owner_references,
        finalizers,
        managed_fields,
    } = m.unwrap_or_default();
    let owners = owner_references
        .into_iter()
        .map(|r| {
            let meta::OwnerReference {
                api_version,
                kind,
                name,
                uid,
                controller,
                block_owner_deletion,
            } = r;
            Fields::default()
                .text("apiVersion", api_version)
                .text("kind", kind)
                .text("name", name)
                .text("uid", uid)
                .some("controller", controller)
                .some("blockOwnerDeletion", block_owner_deletion)
                .done()
        })
        .collect();
    let managed = managed_fields
        .into_iter()
        .map(|f| {
            let meta::ManagedFieldsEntry {
                manager,
                operation,
                api_version,
                time: at,
                fields_type,
                fields_v1,
                subresource,
            } = f;
            let fields = fields_v1
                .and_then(|f| f.raw)
                .and_then(|raw| serde_json::from_slice::<Value>(&raw).ok());
            Fields::default()
                .text("manager", manager)
                .text("operation", operation)
                .text("apiVersion", api_version)
                .text("time", time(at))
                .text("fieldsType", fields_type)
                .object("fieldsV1", fields)
                .text("subresource", subresource)
                .done()
        })
        .collect();
    Fields::default()
        .text("name", name)
        .text("generateName", generate_name)
        .text("namespace", namespace)
        .text("selfLink", self_link)
        .text("uid", uid)
        .text("resourceVersion", resource_version)
        .nonzero("generation", generation)
        .text("creationTimestamp", time(creation_timestamp))
        .text("deletionTimestamp", time(deletion_timestamp))
        .some("deletionGracePeriodSeconds", deletion_grace_period_seconds)
        .string_map("labels", labels)
        .string_map("annotations", annotations)
        .list("ownerReferences", owners)
        .strings("finalizers", finalizers)
        .list("managedFields", managed)
        .done()
}

pub(super) fn object_reference(r: Option<core::ObjectReference>) -> Option<Value> {
    r.map(|r| {
        let core::ObjectReference {
            kind,
            namespace,
            name,
            uid,
            api_version,
            resource_version,
            field_path,
        } = r;
        Fields::default()
            .text("kind", kind)
            .text("namespace", namespace)
            .text("name", name)
            .text("uid", uid)
            .text("apiVersion", api_version)
            .text("resourceVersion", resource_version)
            .text("fieldPath", field_path)
            .done()
    })
}
