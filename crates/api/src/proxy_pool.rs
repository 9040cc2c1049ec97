//! `ProxyPool`: a fleet of Managed Proxies made from one template, kept at `replicas` leasable
//! members plus `standby` Ready ones held back from leases, rolled on template changes and
//! rotated by age without cutting a lease (docs/pools.md).
// The KubeSchema derive builds its schema from a private twin of each struct it derives,
// whose `pub` items trip `unreachable_pub`; every type here is re-exported from the crate root.
#![allow(unreachable_pub)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
pub use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Condition, ProxySpec};

/// A Go duration (`90s`, `1h30m`): what `maxAge`, `drainTimeout` and `startupGrace` take.
const GO_DURATION: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";
/// A whole percentage from `0%` to `100%`: the string form of `maxUnhealthy`.
const PERCENT: &str = r"^(100|[1-9]?[0-9])%$";

/// The desired fleet.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "ProxyPool",
    plural = "proxypools",
    singular = "proxypool",
    shortname = "ppool",
    namespaced,
    status = "ProxyPoolStatus",
    doc = "A fleet of Managed Proxies made from one template: replicas offered to leases, standbys kept Ready to take a failed member's place at once, rolled on template changes and rotated by age without cutting a lease.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.availableReplicas"}"#,
    printcolumn = r#"{"name":"Standby","type":"integer","jsonPath":".status.standbyReady"}"#,
    printcolumn = r#"{"name":"Up-to-date","type":"integer","jsonPath":".status.updatedReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.autoscale) || self.autoscale.min <= self.autoscale.max").message("autoscale.min must not be above autoscale.max")
)]
pub struct ProxyPoolSpec {
    /// Members offered to leases. Default 1; 0 keeps only the standbys (or nothing).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: i32,
    /// What each member is made from. A change makes new members; members are never edited.
    pub template: ProxyTemplate,
    /// Members kept Ready but not offered to leases, promoted at once when a member fails.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub standby: i32,
    /// A member older than this is replaced (rotation), as a template change replaces it.
    /// Absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GO_DURATION))]
    pub max_age: Option<String>,
    /// How long a member chosen for removal keeps serving the leases it has before it is
    /// deleted anyway. Default `10m`; it gets no new leases meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GO_DURATION))]
    pub drain_timeout: Option<String>,
    /// How members are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<PoolStrategy>,
    /// Stops rollouts and rotation (scaling and failure replacement go on).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Sizes `replicas` by the pool's lease load and the lease requests it could not serve,
    /// between `min` and `max`. While it is set the pool controller owns `replicas`: a number
    /// written by `kubectl scale` or an HPA is only its starting point (docs/pools.md#autoscale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<PoolAutoscale>,
    /// The most failed members the pool replaces: a count (`2`) or a share of its members
    /// that are not draining (`"40%"`, rounded down but at least 1). Beyond it, failed members
    /// are kept, nothing is made for them and the pool does not grow until enough recover: a
    /// failure that hits most members at once (a probe target or a network down) is not the
    /// members' to fix. Default `40%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "count_or_percent")]
    pub max_unhealthy: Option<IntOrString>,
    /// How long a new member may fail its probes, from when its instance first runs, before
    /// it counts as failed; one that is not Ready by then is a failed creation, and failed
    /// creations in a row delay the next replacement. Default `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GO_DURATION))]
    pub startup_grace: Option<String>,
}

/// `maxUnhealthy`'s schema: a whole number from 0, or a percentage such as `"40%"`.
fn count_or_percent(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "minimum": 0,
        "pattern": PERCENT,
    })
}

fn default_replicas() -> i32 {
    1
}

/// The members' labels, annotations and spec.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.spec.mode) || self.spec.mode == 'Managed'").message("a pool's template is a Managed Proxy spec")
)]
pub struct ProxyTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    pub spec: ProxySpec,
}

/// The labels and annotations every member gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TemplateMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// How many members a replacement may add or take away at once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStrategy {
    /// Members made beyond `replicas + standby` while replacing. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_surge: Option<i32>,
    /// Members that may be drained before their replacement is Ready. Default 0: a rollout
    /// never lowers the leasable count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_unavailable: Option<i32>,
}

/// `spec.autoscale`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolAutoscale {
    /// Fewest replicas; 0 scales the pool to nothing while no lease asks for it (the first
    /// request naming the pool is refused with `409 no_match` and wakes it).
    #[schemars(range(min = 0, max = 10000))]
    pub min: i32,
    /// Most replicas.
    #[schemars(range(min = 1, max = 10000))]
    pub max: i32,
    /// Active leases over lease capacity, in percent, the pool is sized for. Default 70.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub target_utilization: Option<i32>,
    /// How long the load must stay low before members are removed (they drain first). Default
    /// `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GO_DURATION))]
    pub scale_down_delay: Option<String>,
}

/// What the pool controller observed.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolStatus {
    /// Members offered to leases or on their way to it (not draining, not standby).
    #[serde(default)]
    pub replicas: i32,
    /// Of those, the Ready ones.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Of those, the ones a lease can get now.
    #[serde(default)]
    pub available_replicas: i32,
    /// Standbys that are Ready.
    #[serde(default)]
    pub standby_ready: i32,
    /// Members (standbys included) made from the current template.
    #[serde(default)]
    pub updated_replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The members' label selector, as a string (the scale subresource's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// Members that are not draining and have failed (past their startup grace, or lost).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_members: i32,
    /// Members in a row that never became Ready within their startup grace (0 once one does).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_creations: i32,
    /// While failed creations delay replacements: when the next one may be made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::optional_date_time")]
    pub next_replacement_time: Option<Time>,
    /// `Available`, `Progressing`, `ReplicaFailure` and `RemediationAllowed`, keyed by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::json;

    #[test]
    fn the_crd_serves_scale_and_refuses_what_cannot_work() {
        let crd = serde_json::to_value(ProxyPool::crd()).unwrap();
        let version = &crd["spec"]["versions"][0];
        assert_eq!(
            version["subresources"]["scale"],
            json!({"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                   "labelSelectorPath": ".status.selector"})
        );
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["ppool"]));
        let text = version["schema"].to_string();
        for rule in [
            "a pool's template is a Managed Proxy spec",
            "autoscale.min must not be above autoscale.max",
        ] {
            assert!(text.contains(rule), "{rule}");
        }
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(spec["maxAge"]["pattern"], GO_DURATION);
        assert_eq!(spec["drainTimeout"]["pattern"], GO_DURATION);
    }

    #[test]
    fn absent_fields_take_their_defaults_and_stay_absent() {
        let spec: ProxyPoolSpec = serde_json::from_value(json!({"template": {"spec": {"provider": "p"}}})).unwrap();
        assert_eq!((spec.replicas, spec.standby, spec.paused), (1, 0, false));
        assert_eq!(spec.template.spec.provider, "p");
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({"replicas": 1, "standby": 0,
                   "template": {"spec": {"mode": "Managed", "port": 3128, "provider": "p"}}})
        );
    }
}
