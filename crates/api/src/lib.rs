//! The custom resources of the egress-proxy operator: `Proxy` (namespaced, short name `px`),
//! `ProxyPool` (namespaced, short name `ppool`) and `ProviderHealth` (cluster-scoped, short name
//! `ph`), group `crawl.example.com`, version
//! `v1alpha1`, with the annotation, label, finalizer and condition names the operator and its
//! users share. The wire shapes are those of the Go operator this replaces.
//!
//! `cargo xtask crds` writes `deploy/crds/*.yaml` from these types.

mod condition;
mod provider_health;
mod proxy;
mod proxy_pool;
pub mod served;

pub use condition::{Condition, ConditionStatus};
pub use provider_health::{ProviderHealth, ProviderHealthFields, ProviderHealthStatus, ProviderTarget};
pub use proxy::{
    CloudInit, Credentials, CredentialsSecretRef, CredentialsType, Endpoint, ExitSpec, ExitStatus, HealthCheck,
    HealthCheckSpec, Mode, Phase, Placement, PoolMembership, PoolRole, Proxy, ProxySpec, ProxyStatus, SecretRef,
};
pub use proxy_pool::{
    IntOrString, PoolAutoscale, PoolStrategy, ProxyPool, ProxyPoolSpec, ProxyPoolStatus, ProxyTemplate,
    TemplateMetadata,
};

/// The API group.
pub const GROUP: &str = "crawl.example.com";
/// The API version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of this group's objects.
pub const API_VERSION: &str = "crawl.example.com/v1alpha1";

/// The finalizer the operator puts on every Managed Proxy before it provisions anything.
pub const FINALIZER: &str = "crawl.example.com/finalizer";
/// Hash of the replacement-relevant spec the current instance was built from.
pub const ANNOTATION_SPEC_HASH: &str = "crawl.example.com/spec-hash";
/// Written when the operator adopts an instance whose spec-hash annotation another operator (the
/// Go one, or an earlier build of this one) wrote: that value, kept so a rollback can restore it
/// instead of letting the other operator replace the instance.
pub const ANNOTATION_PREVIOUS_SPEC_HASH: &str = "crawl.example.com/previous-spec-hash";
/// Set by a user to exactly `"true"`: deletion releases the finalizer without provider cleanup.
pub const ANNOTATION_SKIP_CLEANUP: &str = "crawl.example.com/skip-cleanup";
/// Must be `"true"` on every Secret a Proxy's `cloudInit.secretRef` names.
pub const LABEL_CLOUD_INIT: &str = "crawl.example.com/cloud-init";
/// The label of Secrets that hold proxy credentials: `generated` on the ones the operator makes
/// and owns, `"true"` on a user's for an External proxy. Only labelled Secrets are read.
pub const LABEL_PROXY_CREDENTIALS: &str = "crawl.example.com/proxy-credentials";
/// The value of that label on the operator's own credential Secrets.
pub const PROXY_CREDENTIALS_GENERATED: &str = "generated";
/// On a user's credentials Secret: the Proxies of its namespace that may take their credentials
/// from it, as a comma-separated list of names (at most [`MAX_CREDENTIALS_PROXIES`]). An
/// External Proxy whose Secret does not name it is refused, so naming another team's Secret in
/// `secretRef` hands out nothing.
pub const ANNOTATION_CREDENTIALS_PROXIES: &str = "crawl.example.com/proxies";
/// The most Proxies one credentials Secret may name; a longer list makes the Secret unusable.
pub const MAX_CREDENTIALS_PROXIES: usize = 64;
/// On a generated credentials Secret: the provider ID of the instance that was created with
/// them. Credentials that served an instance are never given to the next one.
pub const ANNOTATION_CREDENTIALS_INSTANCE: &str = "crawl.example.com/credentials-instance";
/// The label on objects the operator creates (ProviderHealth), and its value.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "egress-proxies-operator";

/// On a pool's members: the pool's name (with the owner reference, how the pool finds them).
pub const LABEL_POOL: &str = "crawl.example.com/pool";
/// On a pool's members: the hash of the template the member was made from.
pub const LABEL_POOL_TEMPLATE_HASH: &str = "crawl.example.com/pool-template-hash";
/// On a pool's members: `active` (offered to leases), `standby` (Ready, held back) or
/// `draining` (no new leases; deleted once its leases end or the drain timeout passes).
pub const LABEL_POOL_ROLE: &str = "crawl.example.com/pool-role";
/// On a draining pool member: when it started draining (RFC 3339), from which the pool's drain
/// timeout runs.
pub const ANNOTATION_DRAINING_SINCE: &str = "crawl.example.com/draining-since";
/// The attribute every member carries with its pool's name, so a lease selector can name a pool.
pub const ATTRIBUTE_POOL: &str = "pool";

/// Condition types.
pub mod conditions {
    /// On a Proxy: the instance is running with an IP.
    pub const PROVISIONED: &str = "Provisioned";
    /// On a Proxy: the health engine's verdict.
    pub const HEALTHY: &str = "Healthy";
    /// On a ProviderHealth: every target is ready.
    pub const READY: &str = "Ready";
    /// On a Proxy, with an echo URL configured: what the exit check found.
    pub const EXIT_VERIFIED: &str = "ExitVerified";
}

/// Condition reasons.
pub mod reasons {
    /// `ExitVerified=True`: one exit, this Proxy's alone, not the operator's, in an expected
    /// country.
    pub const EXIT_VERIFIED: &str = "Verified";
    /// `ExitVerified=False`: other Proxies have the same exit.
    pub const EXIT_SHARED: &str = "Shared";
    /// `ExitVerified=False`: the exit is the operator's own address; the proxy hides nothing.
    pub const EXIT_OPERATOR_ADDRESS: &str = "OperatorAddress";
    /// `ExitVerified=False`: the exit's country is not one `spec.exit.countries` names.
    pub const EXIT_UNEXPECTED: &str = "Unexpected";
    /// `ExitVerified=Unknown`: the exit check failed (not a health failure).
    pub const EXIT_UNKNOWN: &str = "Unknown";
    pub const PROVISIONING: &str = "Provisioning";
    pub const RUNNING: &str = "Running";
    pub const PERMANENT_ERROR: &str = "PermanentError";
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    pub const CLOUD_INIT_ERROR: &str = "CloudInitError";
    /// `spec.provider` names no entry of the providers config. Not latched: after a restart
    /// with the entry added, the Proxy is provisioned.
    pub const PROVIDER_NOT_CONFIGURED: &str = "ProviderNotConfigured";
    /// A pool member's instance is gone, stopped or never got an address: the reconciler does
    /// not rebuild it; its pool replaces the member.
    pub const INSTANCE_LOST: &str = "InstanceLost";
    pub const PROBE_SUCCEEDED: &str = "ProbeSucceeded";
    pub const PROBE_FAILED: &str = "ProbeFailed";
    /// The proxy refused the probe's credentials (or asked for some): a 407, or 401 from tinyproxy.
    pub const PROXY_AUTH_REQUIRED: &str = "ProxyAuthRequired";
    /// The credentials Secret of a Generated Proxy cannot be made or used.
    pub const CREDENTIALS_ERROR: &str = "CredentialsError";
    /// The create waits for its provider entry's create budget (`createsPerMinute`). Not an
    /// error: the create goes ahead when the budget has room again.
    pub const CREATE_BUDGET: &str = "CreateBudget";
    /// An External Proxy points at an internal destination (its endpoint, or its health-check
    /// URL): nothing is dialled, and it is not offered. Not latched: an allowlist given after a
    /// restart accepts it.
    pub const DESTINATION_REFUSED: &str = "DestinationRefused";
    /// An External Proxy in a namespace where External Proxies are not accepted
    /// (`--external-proxy-namespaces`): nothing is dialled, and it is not offered.
    pub const EXTERNAL_NOT_ALLOWED: &str = "ExternalNotAllowed";
    pub const ALL_TARGETS_READY: &str = "AllTargetsReady";
    pub const TARGETS_NOT_READY: &str = "TargetsNotReady";
    pub const CHECKS_NOT_IMPLEMENTED: &str = "ChecksNotImplemented";
    pub const NO_TARGETS: &str = "NoTargets";
}

/// The port a proxy listens on when the spec does not say.
pub const DEFAULT_PORT: i32 = 3128;
/// The lease capacity when `maxLeases` is absent (an explicit 0 means unleasable).
pub const DEFAULT_MAX_LEASES: i32 = 5;
/// The key in a cloud-init Secret when `secretRef.key` is not given.
pub const DEFAULT_SECRET_KEY: &str = "userdata";
/// Longest message written into a ProviderHealth target.
pub const MAX_TARGET_MESSAGE: usize = 1024;

pub(crate) mod schema {
    use schemars::{Schema, SchemaGenerator, json_schema};

    /// A timestamp on the wire: RFC 3339, as `metav1.Time`.
    pub(crate) fn date_time(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "format": "date-time"})
    }

    /// An optional timestamp.
    pub(crate) fn optional_date_time(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "format": "date-time", "nullable": true})
    }
}
