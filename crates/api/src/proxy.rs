//! `Proxy`: one egress proxy, either provisioned by the operator through a provider (`Managed`)
//! or already running somewhere (`External`).
// The KubeSchema derive builds its schema from a private twin of each struct it derives,
// whose `pub` items trip `unreachable_pub`; every type here is re-exported from the crate root.
#![allow(unreachable_pub)]

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Condition;

/// Who runs the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Mode {
    /// The operator provisions the instance through `spec.provider`.
    #[default]
    Managed,
    /// The proxy already exists at `spec.endpoint`; the operator only checks and hands it out.
    External,
}

/// The desired proxy.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "Proxy",
    plural = "proxies",
    singular = "proxy",
    shortname = "px",
    namespaced,
    status = "ProxyStatus",
    doc = "An egress forward proxy: provisioned through a provider (Managed) or already running (External), health-checked through a real CONNECT and handed out by the discovery API.",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.ip"}"#,
    printcolumn = r#"{"name":"Healthy","type":"string","jsonPath":".status.conditions[?(@.type==\"Healthy\")].status"}"#,
    printcolumn = r#"{"name":"Exit","type":"string","priority":1,"jsonPath":".status.exit.address"}"#,
    printcolumn = r#"{"name":"Country","type":"string","priority":1,"jsonPath":".status.exit.country"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.mode != 'External' || has(self.endpoint)").message("an External proxy needs spec.endpoint"),
    validation = Rule::new("self.mode != 'Managed' || (has(self.provider) && size(self.provider) > 0)").message("a Managed proxy needs spec.provider"),
    validation = Rule::new("self.mode != 'Managed' || !has(self.endpoint)").message("spec.endpoint is for External proxies only"),
    validation = Rule::new("!has(oldSelf.provider) || (has(self.provider) && self.provider == oldSelf.provider)").message("spec.provider is immutable"),
    validation = Rule::new("!has(self.credentials) || self.credentials.type != 'Generated' || self.mode != 'External'").message("Generated credentials are for Managed proxies (an External proxy names its Secret: type Secret)"),
    validation = Rule::new("!has(self.credentials) || self.credentials.type != 'Secret' || self.mode == 'External'").message("credentials of type Secret are for External proxies (a Managed proxy uses Generated)"),
    validation = Rule::new("!has(self.attributes) || self.attributes.all(k, k != 'session' && k != 'ttl' && !k.startsWith('exit.'))").message("the attribute names session, ttl and exit.* are reserved (a gateway username uses them for routing, not selection)")
)]
pub struct ProxySpec {
    /// `Managed` (default) or `External`.
    #[serde(default)]
    pub mode: Mode,
    /// The configured name of a providers-config entry (not its type). Immutable.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub provider: String,
    /// Provider-specific placement, passed through to the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// The port the proxy listens on. Part of the spec hash.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// The instance's user-data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<CloudInit>,
    /// Where an `External` proxy is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    /// Free-form selection labels (`geo`, `asn`, `purpose`, ...) the discovery API filters on.
    /// `session`, `ttl` and names starting with `exit.` are reserved: a gateway username uses
    /// them for routing, so no selector could name them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
    /// Lease capacity. Absent means 5; an explicit 0 means the proxy is never leased.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), extend("default" = 5))]
    pub max_leases: Option<i32>,
    /// Probe settings for this proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckSpec>,
    /// What the proxy demands of its clients. Absent: nothing (type `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Credentials>,
    /// What the proxy's exit is expected to be, checked through it when the operator has an echo
    /// URL and a country database. `attributes` are never read as expectations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitSpec>,
}

/// `spec.exit`: what the exit check expects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExitSpec {
    /// The countries the exit may be in (ISO 3166-1 alpha-2, upper case: `DE`, `US`). Empty or
    /// absent: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 250), inner(regex(pattern = r"^[A-Z]{2}$")))]
    pub countries: Vec<String>,
}

/// How a Proxy's clients authenticate to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CredentialsType {
    /// No credentials: anyone who reaches the proxy may use it (its access rules still apply).
    #[default]
    None,
    /// Managed only: the operator mints a user and password for each instance, keeps them in a
    /// Secret the Proxy owns, and hands them out with each lease.
    Generated,
    /// External only: the user and password are in a Secret the user keeps (`secretRef`).
    Secret,
}

/// `spec.credentials`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.type != 'Secret' || has(self.secretRef)").message("credentials of type Secret need secretRef"),
    validation = Rule::new("self.type == 'Secret' || !has(self.secretRef)").message("credentials.secretRef is for type Secret only")
)]
pub struct Credentials {
    /// `None` (default), `Generated` or `Secret`.
    #[serde(rename = "type", default)]
    pub type_: CredentialsType,
    /// For `Secret`: a Secret in the Proxy's namespace with the keys `username` and `password`,
    /// labelled `crawl.example.com/proxy-credentials: "true"` and naming this Proxy in its
    /// annotation `crawl.example.com/proxies` (comma-separated names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<CredentialsSecretRef>,
}

/// The Secret of an External proxy's credentials.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialsSecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

fn default_port() -> i32 {
    crate::DEFAULT_PORT
}

/// The spec the server's defaulting would produce for an empty one: Managed, port 3128.
impl Default for ProxySpec {
    fn default() -> Self {
        Self {
            mode: Mode::default(),
            provider: String::new(),
            placement: None,
            port: default_port(),
            cloud_init: None,
            endpoint: None,
            attributes: BTreeMap::new(),
            max_leases: None,
            health_check: None,
            credentials: None,
            exit: None,
        }
    }
}

impl ProxySpec {
    /// The lease capacity: `maxLeases`, or 5 when it is absent.
    pub fn effective_max_leases(&self) -> i32 {
        self.max_leases.unwrap_or(crate::DEFAULT_MAX_LEASES)
    }

    /// The probe settings with every default filled in.
    pub fn effective_health_check(&self) -> HealthCheck {
        self.health_check.clone().unwrap_or_default().effective()
    }

    /// The credentials type, `None` when `spec.credentials` is absent.
    pub fn credentials_type(&self) -> CredentialsType {
        self.credentials.as_ref().map(|c| c.type_).unwrap_or_default()
    }

    /// Where an `External` proxy listens: `endpoint.port` when set, else `spec.port`.
    pub fn external_address(&self) -> Option<(String, i32)> {
        let endpoint = self.endpoint.as_ref()?;
        Some((endpoint.host.clone(), endpoint.port.unwrap_or(self.port)))
    }
}

/// Provider-specific placement. Each provider refuses what it cannot use, naming the field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// A GCP zone, a KVM host name...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
    /// A GCP machine type, a KVM catalogue key...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine_type: String,
    /// An image path, a catalogue key, a URL...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
}

/// User-data for the instance: inline text or a key of a labelled Secret, exactly one of them.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.inline) != has(self.secretRef)").message("exactly one of cloudInit.inline and cloudInit.secretRef must be set"))]
pub struct CloudInit {
    /// The user-data, byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
    /// A Secret in the Proxy's namespace, labelled `crawl.example.com/cloud-init: "true"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
}

/// A key of a Secret in the Proxy's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Defaults to `userdata`.
    #[serde(default = "default_secret_key")]
    #[schemars(length(min = 1))]
    pub key: String,
}

fn default_secret_key() -> String {
    crate::DEFAULT_SECRET_KEY.into()
}

/// Where an existing proxy listens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Endpoint {
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
    /// Defaults to `spec.port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// Probe settings. Every field is optional; [`HealthCheckSpec::effective`] fills the defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckSpec {
    /// The target fetched through the proxy. Default `https://www.gstatic.com/generate_204`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), regex(pattern = r"^https?://"))]
    pub url: Option<String>,
    /// The status the target must answer. Default 204.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 599))]
    pub expected_status: Option<i32>,
    /// Seconds between probes. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub interval_seconds: Option<i32>,
    /// Seconds one probe may take. Default 5, at most 60 (a probe holds one of the engine's
    /// workers for as long as it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60))]
    pub timeout_seconds: Option<i32>,
    /// Consecutive successes before a proxy counts as healthy. Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub success_threshold: Option<i32>,
    /// Consecutive failures before a proxy counts as unhealthy. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub failure_threshold: Option<i32>,
}

/// Probe settings with every default applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub url: String,
    pub expected_status: u16,
    pub interval: std::time::Duration,
    pub timeout: std::time::Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// The longest probe timeout (the schema's maximum; also applied to objects that bypassed it).
const MAX_TIMEOUT_SECONDS: u32 = 60;

impl HealthCheckSpec {
    pub const DEFAULT_URL: &'static str = "https://www.gstatic.com/generate_204";

    /// The settings with defaults for what is unset. Values below the schema's minimums (only
    /// possible for objects that bypassed validation) are raised to them.
    pub fn effective(&self) -> HealthCheck {
        let at_least_one = |v: Option<i32>, default: u32| v.map_or(default, |v| v.max(1).unsigned_abs());
        HealthCheck {
            url: self.url.clone().unwrap_or_else(|| Self::DEFAULT_URL.into()),
            expected_status: self.expected_status.and_then(|s| u16::try_from(s).ok()).unwrap_or(204),
            interval: std::time::Duration::from_secs(at_least_one(self.interval_seconds, 1).into()),
            timeout: std::time::Duration::from_secs(
                at_least_one(self.timeout_seconds, 5).min(MAX_TIMEOUT_SECONDS).into(),
            ),
            success_threshold: at_least_one(self.success_threshold, 2),
            failure_threshold: at_least_one(self.failure_threshold, 3),
        }
    }
}

/// Where a Proxy is in its life, as the operator derives it from the instance and its health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    Pending,
    Provisioning,
    Running,
    Ready,
    Unhealthy,
    Deleting,
    Failed,
}

/// What the operator observed.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The instance's IP once it runs (for `External`, the endpoint host).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    /// The provider's id of the current instance; empty until a create succeeded.
    #[serde(default, rename = "providerID", skip_serializing_if = "String::is_empty")]
    pub provider_id: String,
    /// `Provisioned` and `Healthy`, keyed by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Duration of the last status-affecting probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub latency_millis: Option<i64>,
    /// The address targets see when a request comes through the proxy, as the last exit check
    /// found it; absent while unknown. (Boxed: most statuses have none, and a status travels
    /// by value through every reconcile decision.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<Box<ExitStatus>>,
}

/// `status.exit`: the proxy's observed exit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExitStatus {
    /// The IP address the echo URL saw.
    pub address: String,
    /// When the exit checks started to see this address (RFC 3339).
    pub observed_at: String,
    /// The address's country (ISO 3166-1 alpha-2), from the country database when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    /// The address's autonomous system, from the ASN database when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asn: Option<u32>,
    /// The autonomous system's organisation, from the ASN database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub organization: Option<String>,
}

impl Proxy {
    /// Whether the user asked deletion to skip provider cleanup (the annotation is exactly `"true"`).
    pub fn skip_cleanup(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::ANNOTATION_SKIP_CLEANUP))
            .is_some_and(|v| v == "true")
    }

    /// The condition of this type, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
    }

    /// The pool this Proxy is a member of: the name in its [`LABEL_POOL`](crate::LABEL_POOL)
    /// label, and that pool's UID as its controller owner. A label alone, which anyone can
    /// write on a Proxy of their own, makes no member; neither does an owner reference alone
    /// (a member orphaned with `--cascade=orphan` keeps its labels but loses the reference,
    /// and becomes a plain Proxy).
    pub fn pool(&self) -> Option<PoolMembership<'_>> {
        let name = self.metadata.labels.as_ref()?.get(crate::LABEL_POOL)?;
        let owner = self.metadata.owner_references.as_ref()?.iter().find(|o| {
            o.controller == Some(true)
                && o.kind == "ProxyPool"
                && o.api_version == crate::API_VERSION
                && &o.name == name
        })?;
        let role = self
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::LABEL_POOL_ROLE))
            .map_or(PoolRole::Standby, |r| PoolRole::from_label(r));
        Some(PoolMembership {
            pool: name,
            pool_uid: &owner.uid,
            role,
        })
    }
}

/// A Proxy's place in its pool ([`Proxy::pool`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolMembership<'a> {
    pub pool: &'a str,
    pub pool_uid: &'a str,
    pub role: PoolRole,
}

/// What a pool member is to the lease path: its [`LABEL_POOL_ROLE`](crate::LABEL_POOL_ROLE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolRole {
    /// Offered to leases.
    Active,
    /// Ready, held back from leases until it is promoted.
    Standby,
    /// Gets no new leases; its leases run to their end or to the pool's drain timeout.
    Draining,
}

impl PoolRole {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Standby => "standby",
            Self::Draining => "draining",
        }
    }

    /// The role a label value names. A value that names none (an edit by hand) is read as
    /// `standby`: a member nobody can tell the role of is held back from leases, not offered.
    pub fn from_label(value: &str) -> Self {
        match value {
            "active" => Self::Active,
            "draining" => Self::Draining,
            _ => Self::Standby,
        }
    }

    /// Whether a member in this role may get a new lease.
    pub fn offered(self) -> bool {
        self == Self::Active
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn helpers_apply_the_documented_defaults() {
        let spec = ProxySpec::default();
        assert_eq!((spec.mode, spec.port), (Mode::Managed, 3128));
        assert_eq!(spec.effective_max_leases(), 5);
        assert_eq!(
            ProxySpec {
                max_leases: Some(0),
                ..Default::default()
            }
            .effective_max_leases(),
            0
        );
        let hc = spec.effective_health_check();
        assert_eq!(hc.url, "https://www.gstatic.com/generate_204");
        assert_eq!(
            (hc.expected_status, hc.success_threshold, hc.failure_threshold),
            (204, 2, 3)
        );
        assert_eq!((hc.interval.as_secs(), hc.timeout.as_secs()), (1, 5));
        let external = ProxySpec {
            mode: Mode::External,
            endpoint: Some(Endpoint {
                host: "h".into(),
                port: None,
            }),
            port: 8080,
            ..Default::default()
        };
        assert_eq!(external.external_address(), Some(("h".into(), 8080)));
    }

    #[test]
    fn wire_names_are_the_go_operators() {
        let status = ProxyStatus {
            provider_id: "id".into(),
            latency_millis: Some(3),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            json!({"providerID": "id", "latencyMillis": 3})
        );
        let spec: ProxySpec =
            serde_json::from_value(json!({"provider": "p", "cloudInit": {"secretRef": {"name": "s"}},
            "maxLeases": 0, "healthCheck": {"expectedStatus": 200}}))
            .unwrap();
        assert_eq!(spec.cloud_init.unwrap().secret_ref.unwrap().key, "userdata");
        assert_eq!(spec.max_leases, Some(0));
        let round = serde_json::to_value(ProxySpec::default()).unwrap();
        assert_eq!(
            round,
            json!({"mode": "Managed", "port": 3128}),
            "absent fields stay absent"
        );
    }

    #[test]
    fn skip_cleanup_needs_exactly_true() {
        let mut p = Proxy::new("a", ProxySpec::default());
        assert!(!p.skip_cleanup());
        for (value, skip) in [("true", true), ("True", false), ("yes", false), ("", false)] {
            p.metadata.annotations = Some([(crate::ANNOTATION_SKIP_CLEANUP.to_string(), value.to_string())].into());
            assert_eq!(p.skip_cleanup(), skip, "{value:?}");
        }
    }
}
