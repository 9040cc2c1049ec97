//! Kubernetes Events (events.k8s.io/v1), as both controllers publish them: what one says, and
//! how it is posted. Which Events a Proxy's pass raises is [`crate::proxy::events`]'s to say;
//! the pool's pass raises its own.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::identity::FIELD_MANAGER;

/// One event: Normal or Warning, a CamelCase reason and a note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

impl Event {
    pub fn normal(reason: &'static str, note: String) -> Self {
        Self {
            warning: false,
            reason,
            note,
        }
    }

    pub fn warning(reason: &'static str, note: String) -> Self {
        Self {
            warning: true,
            reason,
            note,
        }
    }
}

/// Cuts text to at most `max` bytes, at a character boundary (an Event note's limit is in bytes).
fn truncate_bytes(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_string()
}

/// Publishes one Event about the object `regarding`, in `namespace`, reported by `instance`. A
/// failure to publish is logged at debug; it never fails the caller.
pub(crate) async fn post(client: &Client, instance: &str, regarding: &ObjectReference, namespace: &str, e: &Event) {
    let api: Api<K8sEvent> = Api::namespaced(client.clone(), namespace);
    let now = k8s_openapi::jiff::Timestamp::now();
    // NB: one Event object per occurrence, no aggregation cache: events follow transitions, so
    // repeats are rare, and a cache (kube's Recorder keeps six minutes of them) would grow with
    // the fleet.
    let event = K8sEvent {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or_default(),
                now.as_nanosecond()
            )),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(if e.warning { "Warning" } else { "Normal" }.into()),
        reason: Some(e.reason.into()),
        note: Some(truncate_bytes(&e.note, 1024)),
        action: Some("Reconcile".into()),
        regarding: Some(regarding.clone()),
        reporting_controller: Some(FIELD_MANAGER.into()),
        reporting_instance: Some(instance.to_owned()),
        ..Default::default()
    };
    if let Err(err) = api.create(&PostParams::default(), &event).await {
        tracing::debug!(error = %err, reason = e.reason, "publishing an Event failed");
    }
}
