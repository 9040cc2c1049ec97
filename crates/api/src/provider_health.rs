//! `ProviderHealth`: status-only, cluster-scoped, one per configured provider, written only by
//! the operator's provider-health monitor.
// The KubeSchema derive builds its schema from a private twin of each struct it derives,
// whose `pub` items trip `unreachable_pub`; every type here is re-exported from the crate root.
#![allow(unreachable_pub)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Condition;

/// A ProviderHealth has no spec: the object is its name (the provider's configured name) and
/// its status.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "ProviderHealth",
    plural = "providerhealths",
    singular = "providerhealth",
    shortname = "ph",
    status = "ProviderHealthStatus",
    no_spec,
    doc = "The health of one configured provider, as the operator last checked it. Written only by the operator.",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".status.type"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Targets","type":"string","jsonPath":".status.targetsReady"}"#,
    printcolumn = r#"{"name":"Last Check","type":"date","jsonPath":".status.lastCheckTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct ProviderHealthFields {}

/// The last check of one provider.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHealthStatus {
    /// The provider's type from the providers config (`kubernetes`, `gcp`, `kvm`, `kvm2`, ...).
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub type_: String,
    /// Holds `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// One verdict per checked target, keyed by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub targets: Vec<ProviderTarget>,
    /// `"<ready>/<total>"`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub targets_ready: String,
    /// When the latest check round finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::optional_date_time")]
    pub last_check_time: Option<Time>,
}

/// One checked target (a hypervisor, a zone, the cluster...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderTarget {
    #[schemars(length(min = 1))]
    pub name: String,
    /// Where the check connected.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// The last check succeeded. Always written, `false` included.
    pub ready: bool,
    /// CamelCase verdict: `Reachable`, `Unreachable`, `Forbidden`, `SSHHandshakeFailed`...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Usually the error, cut to 1024 characters.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub message: String,
    /// How long the last check took (omitted when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub latency_millis: i64,
    /// When `ready` last changed.
    #[schemars(schema_with = "crate::schema::date_time")]
    pub last_transition_time: Time,
    /// Provider-specific facts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_and_transition_time_are_always_written() {
        let t = ProviderTarget {
            name: "hv1".into(),
            address: String::new(),
            ready: false,
            reason: String::new(),
            message: String::new(),
            latency_millis: 0,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::from_second(0).unwrap()),
            details: BTreeMap::new(),
        };
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"name": "hv1", "ready": false, "lastTransitionTime": "1970-01-01T00:00:00Z"})
        );
    }
}
