//! The discovery API's authentication as the flags ask for it: bearer tokens from the token file
//! (the `discovery-token` Secret's volume, followed while the manager runs) and
//! `DISCOVERY_TOKEN`; when neither has one, a token the manager makes and keeps in that Secret.
//! The API refuses everything until it has a token, and the manager never exits for want of one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use egress_controller::token_secret::{self, SECRET_NAME, TokenOrigin, TokenSecretError};
use egress_discovery::{Auth, FileTokens, TokenSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::flags::{DiscoveryAuth, Options};

/// How often the token file is read again.
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
    let path = PathBuf::from(&options.discovery_token_file);
    let fixed = env_tokens();
    let file = egress_discovery::read_token_file(&path).await;
    if let FileTokens::Unusable(why) = &file {
        tracing::error!(problem = %why, "the discovery token file cannot be used");
    }
    let initial = egress_discovery::tokens_in_force(&file, &fixed).unwrap_or_else(|| fixed.clone());
    let set = Arc::new(TokenSet::new(initial));
    tasks.spawn(egress_discovery::follow_token_file(
        path,
        fixed,
        set.clone(),
        FILE_POLL,
        shutdown.clone(),
    ));
    if set.is_empty() {
        let secrets = kube::Api::namespaced(client.clone(), namespace);
        tasks.spawn(bootstrap(secrets, namespace.to_owned(), set.clone(), shutdown.clone()));
    } else {
        tracing::info!(tokens = set.len(), "Discovery API authentication: bearer tokens");
    }
    Auth::Tokens(set)
}

/// Reads or makes the Secret's token until it has one (or shutdown), and serves with it unless
/// the token file gave tokens meanwhile.
async fn bootstrap(
    secrets: kube::Api<k8s_openapi::api::core::v1::Secret>,
    namespace: String,
    set: Arc<TokenSet>,
    shutdown: CancellationToken,
) {
    let mut pause = Duration::from_secs(1);
    loop {
        // The token file may have given tokens meanwhile: then none is needed from here.
        if !set.is_empty() {
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
                // Unless the token file gave tokens meanwhile, which then stay in force.
                set.replace_if_empty(vec![origin.token().to_owned()]);
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
