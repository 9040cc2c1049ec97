//! Secret, ConfigMap, Namespace and core `v1` Event: every field mapped.

use k8s_pb::api::core::v1 as core;
use serde_json::{Value, json};

use super::json::{Fields, micro_time, time};
use super::meta::{object_meta, object_reference};

pub(super) fn secret(s: core::Secret) -> Value {
    let core::Secret {
        metadata,
        immutable,
        data,
        string_data,
        r#type,
    } = s;
    Fields::default()
        .put("metadata", object_meta(metadata))
        .some("immutable", immutable)
        .bytes_map("data", data)
        .string_map("stringData", string_data)
        .text("type", r#type)
        .done()
}

pub(super) fn config_map(c: core::ConfigMap) -> Value {
    let core::ConfigMap {
        metadata,
        immutable,
        data,
        binary_data,
    } = c;
    Fields::default()
        .put("metadata", object_meta(metadata))
        .some("immutable", immutable)
        .string_map("data", data)
        .bytes_map("binaryData", binary_data)
        .done()
}

pub(super) fn namespace(n: core::Namespace) -> Value {
    let core::Namespace { metadata, spec, status } = n;
    let spec = spec.map(|s| {
        let core::NamespaceSpec { finalizers } = s;
        Fields::default().strings("finalizers", finalizers).done()
    });
    let status = status.map(|s| {
        let core::NamespaceStatus { phase, conditions } = s;
        let conditions = conditions
            .into_iter()
            .map(|c| {
                let core::NamespaceCondition {
                    r#type,
                    status,
                    last_transition_time,
                    reason,
                    message,
                } = c;
                Fields::default()
                    .text("type", r#type)
                    .text("status", status)
                    .text("lastTransitionTime", time(last_transition_time))
                    .text("reason", reason)
                    .text("message", message)
                    .done()
            })
            .collect();
        Fields::default()
            .text("phase", phase)
            .list("conditions", conditions)
            .done()
    });
    Fields::default()
        .put("metadata", object_meta(metadata))
        .object("spec", spec)
        .object("status", status)
        .done()
}

pub(super) fn event(e: core::Event) -> Value {
    let core::Event {
        metadata,
        involved_object,
        reason,
        message,
        source,
        first_timestamp,
        last_timestamp,
        count,
        r#type,
        event_time,
        series,
        action,
        related,
        reporting_component,
        reporting_instance,
    } = e;
    let source = source.map(|s| {
        let core::EventSource { component, host } = s;
        Fields::default().text("component", component).text("host", host).done()
    });
    let series = series.map(|s| {
        let core::EventSeries {
            count,
            last_observed_time,
        } = s;
        Fields::default()
            .nonzero("count", count)
            .text("lastObservedTime", micro_time(last_observed_time))
            .done()
    });
    // involvedObject is not omitempty in the Go type: an Event always shows one.
    Fields::default()
        .put("metadata", object_meta(metadata))
        .put("involvedObject", object_reference(involved_object).unwrap_or(json!({})))
        .text("reason", reason)
        .text("message", message)
        .object("source", source)
        .text("firstTimestamp", time(first_timestamp))
        .text("lastTimestamp", time(last_timestamp))
        .nonzero("count", count)
        .text("type", r#type)
        .text("eventTime", micro_time(event_time))
        .object("series", series)
        .text("action", action)
        .object("related", object_reference(related))
        .text("reportingComponent", reporting_component)
        .text("reportingInstance", reporting_instance)
        .done()
}
