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

/// A field selector label of a built-in kind: the stored fields it reads (the first that is set
/// gives its value, as the API server's field sets fall back), and its value when none is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SelectableField {
    pub(crate) label: &'static str,
    pub(crate) pointers: &'static [&'static str],
    pub(crate) unset: &'static str,
}

const fn field(label: &'static str, pointers: &'static [&'static str]) -> SelectableField {
    SelectableField {
        label,
        pointers,
        unset: "",
    }
}

/// The field selectors of core `v1` Events (the labels the API server supports) and the stored
/// fields each one reads. `source` falls back to the reporting controller, as the server's does,
/// so Events written through events.k8s.io/v1 are found by it too.
const CORE_EVENT_FIELDS: &[SelectableField] = &[
    field("involvedObject.kind", &["/involvedObject/kind"]),
    field("involvedObject.namespace", &["/involvedObject/namespace"]),
    field("involvedObject.name", &["/involvedObject/name"]),
    field("involvedObject.uid", &["/involvedObject/uid"]),
    field("involvedObject.apiVersion", &["/involvedObject/apiVersion"]),
    field("involvedObject.resourceVersion", &["/involvedObject/resourceVersion"]),
    field("involvedObject.fieldPath", &["/involvedObject/fieldPath"]),
    field("reason", &["/reason"]),
    field("reportingComponent", &["/reportingComponent"]),
    field("source", &["/source/component", "/reportingComponent"]),
    field("type", &["/type"]),
];

/// The same for `events.k8s.io/v1`, in its own names (the API server converts these labels to
/// the core ones).
const EVENTS_V1_FIELDS: &[SelectableField] = &[
    field("regarding.kind", &["/involvedObject/kind"]),
    field("regarding.namespace", &["/involvedObject/namespace"]),
    field("regarding.name", &["/involvedObject/name"]),
    field("regarding.uid", &["/involvedObject/uid"]),
    field("regarding.apiVersion", &["/involvedObject/apiVersion"]),
    field("regarding.resourceVersion", &["/involvedObject/resourceVersion"]),
    field("regarding.fieldPath", &["/involvedObject/fieldPath"]),
    field("reason", &["/reason"]),
    field("reportingController", &["/reportingComponent"]),
    field("type", &["/type"]),
];

/// A Pod's labels; `status.podIP` reads the first of `podIPs`, as the server's does.
const POD_FIELDS: &[SelectableField] = &[
    field("spec.nodeName", &["/spec/nodeName"]),
    field("spec.restartPolicy", &["/spec/restartPolicy"]),
    field("spec.schedulerName", &["/spec/schedulerName"]),
    field("spec.serviceAccountName", &["/spec/serviceAccountName"]),
    SelectableField {
        label: "spec.hostNetwork",
        pointers: &["/spec/hostNetwork"],
        unset: "false",
    },
    field("status.phase", &["/status/phase"]),
    field("status.podIP", &["/status/podIPs/0/ip", "/status/podIP"]),
    field("status.nominatedNodeName", &["/status/nominatedNodeName"]),
];

const SECRET_FIELDS: &[SelectableField] = &[field("type", &["/type"])];

const NAMESPACE_FIELDS: &[SelectableField] = &[field("status.phase", &["/status/phase"])];

/// The field selector labels a built-in resource supports beyond `metadata.name` and
/// `metadata.namespace`.
pub(crate) fn selectable_fields(group: &str, plural: &str) -> &'static [SelectableField] {
    match (group, plural) {
        ("", "events") => CORE_EVENT_FIELDS,
        ("events.k8s.io", "events") => EVENTS_V1_FIELDS,
        ("", "pods") => POD_FIELDS,
        ("", "secrets") => SECRET_FIELDS,
        ("", "namespaces") => NAMESPACE_FIELDS,
        _ => &[],
    }
}

/// `object` with its top-level fields renamed. A field that already carries a target name is
/// not of the source version (an events.k8s.io body with a core `message`, say): dropped, as the
/// real decoder drops fields its type does not have.
fn renamed(object: &Value, renames: impl Iterator<Item = (&'static str, &'static str)>) -> Value {
    let Value::Object(fields) = object else {
        return object.clone();
    };
    let renames: Vec<(&str, &str)> = renames.collect();
    let mut out = Map::new();
    for (name, value) in fields {
        match renames.iter().find(|(from, _)| from == name) {
            Some((_, to)) => {
                out.insert((*to).to_owned(), value.clone());
            }
            None if renames.iter().any(|(_, to)| to == name) => {}
            None => {
                out.insert(name.clone(), value.clone());
            }
        }
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

    /// The apiVersion stored objects carry, when it is not the written one: a stored Event is a
    /// core one whichever API wrote it, so a write through the other API that changes nothing
    /// is still no change.
    pub(crate) fn stored_api_version(self) -> Option<&'static str> {
        match self {
            Self::Stored => None,
            Self::EventsV1 => Some("v1"),
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
        // A field of the other version is not carried over.
        let mixed = json!({"note": "new", "message": "stale", "regarding": {"name": "p"}});
        assert_eq!(
            View::EventsV1.store(&mixed),
            json!({"message": "new", "involvedObject": {"name": "p"}})
        );
    }

    #[test]
    fn both_versions_select_the_same_stored_fields() {
        let core = selectable_fields("", "events");
        let v1 = selectable_fields("events.k8s.io", "events");
        for f in v1 {
            let core_label = f
                .label
                .replace("regarding.", "involvedObject.")
                .replace("reportingController", "reportingComponent");
            let twin = core.iter().find(|c| c.label == core_label).expect("a core label");
            assert_eq!(twin.pointers, f.pointers, "{}", f.label);
        }
    }
}
