//! The values that cross the provider boundary.

use std::fmt;
use std::net::IpAddr;
use std::time::SystemTime;

/// The opaque handle a provider returns from `create` and accepts in `get` and
/// `delete` (`status.providerID` on the Proxy).
///
/// Only the provider that issued an id knows its shape (for example
/// `hosts/<host>/domains/<name>`); everyone else stores and passes it back.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ProviderId(String);

impl ProviderId {
    /// Wraps an id string as issued by a provider or read from a Proxy status.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as the provider wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Consumes the id and returns the string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for ProviderId {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for ProviderId {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// Where a Proxy wants its instance: a one-to-one copy of `spec.placement`.
///
/// Empty strings mean "not given". Which fields a provider needs, and what it
/// does with the others, is in that provider's guide.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Placement {
    /// A region, where the backend has them.
    pub region: String,
    /// A zone, host or namespace: the location the instance is created in.
    pub zone: String,
    /// A key into the provider's machine catalogue.
    pub machine_type: String,
    /// A key into the provider's image catalogue.
    pub image: String,
}

/// What the reconciler asks a provider to create. Built by the reconciler,
/// never by providers.
///
/// `Debug` is written by hand: `cloud_init` may hold secrets, so only its byte
/// count is ever printed.
#[derive(Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// [`name_from_uid`](crate::name_from_uid) of `uid`: the instance name
    /// every provider keys its idempotency on.
    pub name: String,
    /// The owning Proxy's `metadata.uid`, written as the UID mark.
    pub uid: String,
    /// The Proxy's namespace.
    pub namespace: String,
    /// The Proxy's `metadata.name`.
    pub proxy_name: String,
    /// A copy of `spec.placement`.
    pub placement: Placement,
    /// The resolved cloud-init document (inline text or the Secret's bytes), as bytes: it may
    /// be gzip or anything else that is not UTF-8, and providers deliver it byte for byte.
    /// May hold secrets: never log it, never put it in a span or an error.
    pub cloud_init: Vec<u8>,
    /// The port the proxy listens on (`spec.port`, default 3128).
    pub port: u16,
    /// The installation mark to write, when the operator runs with one
    /// (see [`LABEL_INSTALLATION`](crate::LABEL_INSTALLATION)).
    pub installation: Option<String>,
    /// The credentials the proxy must demand of every client (`spec.credentials: Generated`);
    /// `None`: the proxy takes clients without them (its other rules still apply).
    pub credentials: Option<ProxyCredentials>,
    /// The group of instances this one belongs with and should be placed apart from (the
    /// members of one pool), as a token of at most 63 letters, digits, `-`, `_` and `.`
    /// beginning and ending with a letter or digit (a Kubernetes label value; the reconciler
    /// gives the pool's UID). A backend that can spread instances (kubernetes: over nodes)
    /// does; the others ignore it. `None`: the instance belongs to no group.
    pub spread_group: Option<String>,
}

/// The credentials one instance demands, in each form a backend may need. Minted by the
/// operator before the create, and new for each instance it replaces.
///
/// `Debug` shows the user name and the Secret's name only.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyCredentials {
    /// The user name and password clients show. Only a backend whose proxy config takes the
    /// password in clear (the local provider's tinyproxy) reads the password.
    pub credentials: egress_credentials::Credentials,
    /// The same as an htpasswd line (the user name and a salted hash): what goes to a VM.
    pub htpasswd: String,
    /// The Secret in the request's namespace that holds them, under the keys
    /// [`egress_credentials::USERNAME_KEY`], [`PASSWORD_KEY`](egress_credentials::PASSWORD_KEY)
    /// and [`HTPASSWD_KEY`](egress_credentials::HTPASSWD_KEY). A backend whose instances run in
    /// that cluster (kubernetes) mounts it rather than copying it anywhere.
    pub secret_name: String,
}

impl fmt::Debug for ProxyCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyCredentials")
            .field("username", &self.credentials.username())
            .field("secret_name", &self.secret_name)
            .finish_non_exhaustive()
    }
}

impl ProxyCredentials {
    /// Credentials with a fresh htpasswd line, kept in the Secret `secret_name`.
    pub fn new(credentials: egress_credentials::Credentials, secret_name: impl Into<String>) -> Self {
        Self {
            htpasswd: credentials.htpasswd_line(),
            credentials,
            secret_name: secret_name.into(),
        }
    }
}

impl fmt::Debug for CreateRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateRequest")
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("namespace", &self.namespace)
            .field("proxy_name", &self.proxy_name)
            .field("placement", &self.placement)
            .field("cloud_init_bytes", &self.cloud_init.len())
            .field("port", &self.port)
            .field("installation", &self.installation)
            .field("credentials", &self.credentials)
            .field("spread_group", &self.spread_group)
            .finish()
    }
}

/// The lifecycle state of an instance as the reconciler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstanceState {
    /// Being created, started, or running without a known address yet.
    Provisioning,
    /// Running, with an address (a provider never reports Running without one).
    Running,
    /// Stopped, or in a state the provider does not recognise. It will not
    /// come back on its own; the reconciler deletes and recreates it.
    Stopped,
    /// Gone for good but still visible. Treated exactly like `Stopped`.
    Terminated,
}

impl InstanceState {
    /// The name used in logs and status (`Provisioning`, `Running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "Provisioning",
            Self::Running => "Running",
            Self::Stopped => "Stopped",
            Self::Terminated => "Terminated",
        }
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a provider knows about one instance, read back from the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// The id `get` and `delete` accept.
    pub id: ProviderId,
    /// The address the proxy answers on. `Some` whenever `state` is Running.
    pub ip: Option<IpAddr>,
    /// The lifecycle state.
    pub state: InstanceState,
    /// The UID mark as stored on the backend; empty when the instance has none
    /// (GC never deletes such an instance).
    pub uid: String,
    /// When the backend says the instance was created. `None` when missing or
    /// unparsable, which GC treats as very old; never "now".
    pub created_at: Option<SystemTime>,
    /// The installation mark as stored on the backend, if any (written at create, or later by
    /// `mark_installation`).
    pub installation: Option<String>,
}

impl Instance {
    /// Builds an instance in `state` with no address or marks; tests and
    /// providers fill in the rest with the `with_*` methods.
    pub fn new(id: impl Into<ProviderId>, state: InstanceState) -> Self {
        Self {
            id: id.into(),
            ip: None,
            state,
            uid: String::new(),
            created_at: None,
            installation: None,
        }
    }

    /// Sets the address. A Running instance without one becomes
    /// Provisioning, so the GT3 rule holds by construction.
    pub fn with_ip(mut self, ip: Option<IpAddr>) -> Self {
        self.ip = ip;
        self.normalised()
    }

    /// Sets the UID mark.
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = uid.into();
        self
    }

    /// Sets the creation time.
    pub fn with_created_at(mut self, at: Option<SystemTime>) -> Self {
        self.created_at = at;
        self
    }

    /// Sets the installation mark.
    pub fn with_installation(mut self, installation: Option<String>) -> Self {
        self.installation = installation;
        self
    }

    /// Applies the contract's rule that Running needs an address: a running
    /// backend object with no address is still Provisioning.
    pub fn normalised(mut self) -> Self {
        if self.state == InstanceState::Running && self.ip.is_none() {
            self.state = InstanceState::Provisioning;
        }
        self
    }
}
