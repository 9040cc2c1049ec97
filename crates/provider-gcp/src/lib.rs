//! The gcp provider (spec/providers.md §5, §6.2): one Compute Engine VM with an ephemeral
//! external IP per Proxy, over the Compute REST API with a thin client of our own.
//!
//! - [`settings`], [`names`], [`id`], [`body`], [`state`], [`classify`], [`wire`]: pure pieces
//!   (the config with its defaults, what the API accepts as a name, providerIDs, the insert
//!   request, what an instance's status means, what an API answer means, how the wire log shows
//!   payloads);
//! - [`auth`]: access tokens by Application Default Credentials;
//! - [`client`]: the HTTP client (timeouts, retries of reads, spans, the wire log);
//! - [`transport`]: what the client and the token source share: transport errors as text, and
//!   answers read with a cap;
//! - [`provider`]: create, get, delete, list and the health check;
//! - `suite_run` (feature `testing`): a conformance run against a real project: its settings and
//!   its janitor, for the tests and `cargo xtask conformance --provider gcp --real`.
//!
//! [`construct`] builds it from a config entry as the operator does.

pub mod auth;
pub mod body;
pub mod classify;
pub mod client;
pub mod config;
pub mod id;
pub mod names;
pub mod provider;
pub mod settings;
pub mod state;
#[cfg(feature = "testing")]
pub mod suite_run;
pub mod transport;
pub mod wire;

use std::sync::Arc;

use egress_provider::config::ProviderConfig;
use egress_provider::{BoxError, Provider, ProviderType};

pub use auth::CredentialSource;
pub use config::GcpConfig;
pub use provider::GcpProvider;
pub use settings::Settings;
pub use wire::WireOptions;

/// The `type:` value.
pub const TYPE_NAME: &str = "gcp";

/// The `gcp` provider type for the operator's registry; `wire` is what
/// `--gcp-wire-log-full-payloads` asked for.
pub fn provider_type(wire: WireOptions) -> ProviderType {
    ProviderType::with_block::<GcpConfig>(TYPE_NAME, move |entry| construct(entry, wire))
}

/// Builds a provider from a `gcp` entry, with credentials as Application Default Credentials
/// find them in this process's environment. Reads no credential and contacts nothing: a key
/// file that is not there yet is warned about, and calls answer Transient until it appears.
///
/// # Errors
/// The HTTP client cannot be built.
pub fn construct(entry: &ProviderConfig, wire: WireOptions) -> Result<Arc<dyn Provider>, BoxError> {
    let block: GcpConfig = entry.block()?.unwrap_or_default();
    let source = CredentialSource::from_environment();
    Ok(Arc::new(build(
        &entry.name,
        Settings::from_config(&block),
        source,
        client::DEFAULT_BASE_URL,
        wire,
    )?))
}

/// A provider of entry `name` calling the API at `base_url` with tokens from `source`: the
/// production constructor's body, and the tests' (with a local server's URL).
///
/// # Errors
/// The HTTP client cannot be built.
pub fn build(
    name: &str,
    settings: Settings,
    source: CredentialSource,
    base_url: &str,
    wire: WireOptions,
) -> Result<GcpProvider, BoxError> {
    let http = client::http_client().map_err(|e| format!("gcp provider {name:?}: building the HTTP client: {e}"))?;
    build_with(
        name,
        settings,
        auth::Tokens::new(source, http.clone()),
        http,
        base_url,
        wire,
    )
}

/// [`build`] with a token source of the caller's (a test's authorized-user endpoint, say).
///
/// # Errors
/// None today; kept fallible with [`build`].
pub fn build_with(
    name: &str,
    settings: Settings,
    tokens: auth::Tokens,
    http: reqwest::Client,
    base_url: &str,
    wire: WireOptions,
) -> Result<GcpProvider, BoxError> {
    if let Some(path) = tokens.source().missing_file() {
        tracing::warn!(
            provider = name,
            path = %path.display(),
            "gcp credential file {} does not exist yet; calls fail until it appears",
            path.display()
        );
    }
    let project = settings.project.clone();
    let client = client::Client::new(http, base_url, project, tokens, wire);
    Ok(GcpProvider::new(name, settings, client))
}
