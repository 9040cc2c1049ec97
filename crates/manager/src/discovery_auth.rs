//! The discovery API's authentication as the flags ask for it: clients and their bearer tokens
//! from the token dir (the `discovery-token` Secret's volume, one key per client), the token file
//! and `DISCOVERY_TOKEN` (both the client `default`'s), followed while the manager runs; when
//! none gives a token, one the manager makes and keeps in that Secret, as the default client's.
//! The API refuses everything until it has a token, and the manager never exits for want of one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use egress_controller::token_secret::{self, SECRET_NAME, TokenOrigin, TokenSecretError};
use egress_discovery::{Auth, ClientFiles, TokenSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::flags::{DiscoveryAuth, Options};

/// How often the token files are read again.
pub(crate) const FILE_POLL: Duration = Duration::from_secs(10);
/// One attempt at the Secret, and the longest pause between attempts.
const SECRET_CALL_BUDGET: Duration = Duration::from_secs(10);
const SECRET_RETRY_MAX: Duration = Duration::from_secs(30);

/// The tokens of `DISCOVERY_TOKEN` (the Go operator's variable; it cannot rotate).
fn env_tokens() -> Vec<String> {
    let Some(value) = std::env::var("DISCOVERY_TOKEN").ok().filter(|t| !t.trim().is_empty()) else {
        return Vec::new();
    };
    egress_discovery::parse_tokens(&value).unwrap_or_else(|e| {
        tracing::error!(problem = %e, "DISCOVERY_TOKEN cannot be used as a discovery token; ignored");
        Vec::new()
    })
}

/// The token sources the flags name; an empty flag names none.
fn client_files(options: &Options) -> ClientFiles {
    let mut files = ClientFiles::default()
        .fixed_tokens(env_tokens())
        .revoke_grace(options.token_revoke_grace);
    if !options.discovery_token_file.is_empty() {
        files = files.token_file(PathBuf::from(&options.discovery_token_file));
    }
    if !options.discovery_token_dir.is_empty() {
        files = files.token_dir(PathBuf::from(&options.discovery_token_dir));
    }
    files
}

/// The API's [`Auth`], with the tasks that keep its tokens current spawned on `tasks`.
pub(crate) async fn start(
    options: &Options,
    client: &kube::Client,
    namespace: &str,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> Auth {
    if options.discovery_auth == DiscoveryAuth::None {
        return Auth::None;
    }
    let set = Arc::new(TokenSet::default());
    let mut files = client_files(options);
    files.reload(&set);
    tasks.spawn(files.follow(set.clone(), FILE_POLL, shutdown.clone()));
    if set.is_configured() {
        tracing::info!(
            tokens = set.len(),
            clients = set.clients(),
            "Discovery API authentication: bearer tokens"
        );
    } else {
        let secrets = kube::Api::namespaced(client.clone(), namespace);
        tasks.spawn(bootstrap(secrets, namespace.to_owned(), set.clone(), shutdown.clone()));
    }
    Auth::Tokens(set)
}

/// Reads or makes the Secret's token until it has one (or shutdown), and serves with it as the
/// default client's unless a token file gave tokens meanwhile.
async fn bootstrap(
    secrets: kube::Api<k8s_openapi::api::core::v1::Secret>,
    namespace: String,
    set: Arc<TokenSet>,
    shutdown: CancellationToken,
) {
    let mut pause = Duration::from_secs(1);
    loop {
        // A token file may have given tokens meanwhile: then none is needed from here.
        if set.is_configured() {
            return;
        }
        // One span per attempt, so its API calls are not root spans.
        let attempt = tokio::time::timeout(
            SECRET_CALL_BUDGET,
            token_secret::ensure(&secrets, token_secret::random_token()),
        )
        .instrument(tracing::info_span!("discovery.token"));
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            o = attempt => o,
        };
        match outcome {
            Ok(Ok(origin)) => {
                // Unless a token file gave tokens meanwhile, which then stay in force.
                set.replace_if_unconfigured(vec![origin.token().to_owned()]);
                let read = format!(
                    "kubectl -n {namespace} get secret {SECRET_NAME} -o jsonpath='{{.data.token}}' | base64 -d"
                );
                match origin {
                    TokenOrigin::Created(_) => tracing::warn!(
                        secret = %format!("{namespace}/{SECRET_NAME}"),
                        read_it_with = %read,
                        "No discovery token was configured: made one and stored it in a Secret; clients send it as a bearer token"
                    ),
                    TokenOrigin::Existing(_) => tracing::info!(
                        secret = %format!("{namespace}/{SECRET_NAME}"),
                        read_it_with = %read,
                        "Discovery API authentication: the token of the Secret"
                    ),
                }
                return;
            }
            Ok(Err(e @ TokenSecretError::Unusable)) => {
                tracing::error!(error = %e, "no discovery token: the discovery API refuses every request");
                pause = SECRET_RETRY_MAX;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "no discovery token yet: the discovery API refuses every request");
            }
            Err(_) => tracing::warn!(
                budget = ?SECRET_CALL_BUDGET,
                "no discovery token yet: the API server did not answer about the Secret"
            ),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(SECRET_RETRY_MAX);
    }
}
