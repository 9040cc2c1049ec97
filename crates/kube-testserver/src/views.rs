//! One stored object seen through more than one API: Events are one set of objects that a real
//! API server serves both as core `v1` Events and as `events.k8s.io/v1` Events, with fields
//! renamed between the two. The store keeps the core shape; an `events.k8s.io` request is
//! answered in its own shape and its writes are turned back into the core one, field by field,
//! as the API server's conversion does.

use serde_json::{Map, Value};

/// How objects of one served version relate to the stored shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum View {
    /// Stored as served.
    #[default]
    Stored,
    /// `events.k8s.io/v1` over core `v1` Events.
    EventsV1,
}

/// The top-level fields core `v1` (left) and `events.k8s.io/v1` (right) name differently; every
/// other field (metadata, reason, type, action, related, eventTime, series, reportingInstance)
/// has one name in both.
const EVENT_RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// The field selectors of core `v1` Events (the labels the API server supports) and the stored
/// field each one reads.
const CORE_EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject.kind", "/involvedObject/kind"),
    ("involvedObject.namespace", "/involvedObject/namespace"),
    ("involvedObject.name", "/involvedObject/name"),
    ("involvedObject.uid", "/involvedObject/uid"),
    ("involvedObject.apiVersion", "/involvedObject/apiVersion"),
    ("involvedObject.resourceVersion", "/involvedObject/resourceVersion"),
    ("involvedObject.fieldPath", "/involvedObject/fieldPath"),
    ("reason", "/reason"),
    ("reportingComponent", "/reportingComponent"),
    ("source", "/source/component"),
    ("type", "/type"),
];

/// The same for `events.k8s.io/v1`, in its own names (the API server converts these labels to
/// the core ones).
const EVENTS_V1_FIELDS: &[(&str, &str)] = &[
    ("regarding.kind", "/involvedObject/kind"),
    ("regarding.namespace", "/involvedObject/namespace"),
    ("regarding.name", "/involvedObject/name"),
    ("regarding.uid", "/involvedObject/uid"),
    ("regarding.apiVersion", "/involvedObject/apiVersion"),
    ("regarding.resourceVersion", "/involvedObject/resourceVersion"),
    ("regarding.fieldPath", "/involvedObject/fieldPath"),
    ("reason", "/reason"),
    ("reportingController", "/reportingComponent"),
    ("type", "/type"),
];

const POD_FIELDS: &[(&str, &str)] = &[
    ("spec.nodeName", "/spec/nodeName"),
    ("spec.restartPolicy", "/spec/restartPolicy"),
    ("spec.schedulerName", "/spec/schedulerName"),
    ("spec.serviceAccountName", "/spec/serviceAccountName"),
    ("status.phase", "/status/phase"),
    ("status.podIP", "/status/podIP"),
    ("status.nominatedNodeName", "/status/nominatedNodeName"),
];

const SECRET_FIELDS: &[(&str, &str)] = &[("type", "/type")];

const NAMESPACE_FIELDS: &[(&str, &str)] = &[("status.phase", "/status/phase")];

/// The field selector labels a built-in resource supports beyond `metadata.name` and
/// `metadata.namespace`, each with the stored field it reads.
pub(crate) fn selectable_fields(group: &str, plural: &str) -> &'static [(&'static str, &'static str)] {
    match (group, plural) {
        ("", "events") => CORE_EVENT_FIELDS,
        ("events.k8s.io", "events") => EVENTS_V1_FIELDS,
        ("", "pods") => POD_FIELDS,
        ("", "secrets") => SECRET_FIELDS,
        ("", "namespaces") => NAMESPACE_FIELDS,
        _ => &[],
    }
}

fn renamed(object: &Value, renames: impl Iterator<Item = (&'static str, &'static str)>) -> Value {
    let Value::Object(fields) = object else {
        return object.clone();
    };
    let renames: Vec<(&str, &str)> = renames.collect();
    let mut out = Map::new();
    for (name, value) in fields {
        let to = renames
            .iter()
            .find(|(from, _)| from == name)
            .map_or(name.as_str(), |(_, to)| to);
        out.insert(to.to_owned(), value.clone());
    }
    Value::Object(out)
}

impl View {
    /// The stored object as this version shows it (apiVersion and kind are the caller's).
    pub(crate) fn show(self, stored: &Value) -> Value {
        match self {
            Self::Stored => stored.clone(),
            Self::EventsV1 => renamed(stored, EVENT_RENAMES.iter().copied()),
        }
    }

    /// What to store for an object written in this version.
    pub(crate) fn store(self, shown: &Value) -> Value {
        match self {
            Self::Stored => shown.clone(),
            Self::EventsV1 => renamed(shown, EVENT_RENAMES.iter().map(|(core, v1)| (*v1, *core))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_map_field_by_field_both_ways() {
        let core = json!({
            "metadata": {"name": "e", "namespace": "ns"},
            "involvedObject": {"kind": "Proxy", "name": "p", "namespace": "ns", "uid": "u"},
            "reason": "Ready", "message": "the proxy works", "type": "Normal",
            "source": {"component": "egress"}, "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T00:01:00Z", "count": 2,
            "eventTime": "2026-01-01T00:00:00.000000Z", "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
            "action": "Probe", "reportingComponent": "egress-operator", "reportingInstance": "pod-1",
            "related": {"kind": "Pod", "name": "x"},
        });
        let v1 = View::EventsV1.show(&core);
        assert_eq!(v1["regarding"], core["involvedObject"]);
        assert_eq!(v1["note"], "the proxy works");
        assert_eq!(v1["reportingController"], "egress-operator");
        assert_eq!(v1["deprecatedSource"], core["source"]);
        assert_eq!(v1["deprecatedFirstTimestamp"], core["firstTimestamp"]);
        assert_eq!(v1["deprecatedLastTimestamp"], core["lastTimestamp"]);
        assert_eq!(v1["deprecatedCount"], 2);
        for same in [
            "metadata",
            "reason",
            "type",
            "eventTime",
            "series",
            "action",
            "reportingInstance",
            "related",
        ] {
            assert_eq!(v1[same], core[same], "{same}");
        }
        for gone in ["involvedObject", "message", "source", "count", "reportingComponent"] {
            assert!(v1.get(gone).is_none(), "{gone}");
        }
        assert_eq!(View::EventsV1.store(&v1), core);
        assert_eq!(View::Stored.show(&core), core);
    }

    #[test]
    fn both_versions_select_the_same_stored_fields() {
        let core = selectable_fields("", "events");
        let v1 = selectable_fields("events.k8s.io", "events");
        for (label, pointer) in v1 {
            let core_label = label
                .replace("regarding.", "involvedObject.")
                .replace("reportingController", "reportingComponent");
            assert!(core.contains(&(core_label.as_str(), *pointer)), "{label}");
        }
    }
}
