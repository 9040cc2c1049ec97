//! The Proxy reconciler's I/O shell: it runs the pure decision of [`crate::decide`], performs
//! each action with kube or the provider, and flushes the status when it changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_api::{ANNOTATION_SPEC_HASH, FINALIZER, LABEL_CLOUD_INIT, Proxy, SecretRef};
use egress_provider::{CreateRequest, OpCtx, Placement, Provider, ProviderError, Providers, name_from_uid};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue_;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::decide::{Action, Facts, Failure, Input, Next, Note, Requeue, Timings, next};
use crate::merge;
use crate::status::Verdict;

/// The field manager of the operator's writes.
pub const FIELD_MANAGER: &str = "egress-proxies-operator";

/// The most steps one pass may take; a pass needs at most a handful.
const MAX_STEPS: usize = 16;

/// Where the reconciler reads health verdicts: the health engine's snapshot.
pub trait HealthVerdicts: Send + Sync + 'static {
    fn verdict(&self, namespace: &str, name: &str) -> Option<Verdict>;
}

/// A reconcile that failed; the workqueue retries it with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{0}")]
    Provider(String),
    #[error("writing Proxy {what}: {source}")]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("the pass did not end within {MAX_STEPS} steps (a bug)")]
    Runaway,
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub providers: Arc<Providers>,
    pub health: Arc<dyn HealthVerdicts>,
    pub timings: Timings,
    /// The installation mark providers write at create, when the operator runs with one.
    pub installation: Option<String>,
    /// Cancelled at shutdown: provider calls in flight return promptly.
    pub shutdown: CancellationToken,
    failures: Mutex<HashMap<(String, String), u32>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(
        client: Client,
        providers: Arc<Providers>,
        health: Arc<dyn HealthVerdicts>,
        timings: Timings,
        installation: Option<String>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            client,
            providers,
            health,
            timings,
            installation,
            shutdown,
            failures: Mutex::default(),
        }
    }

    /// The workqueue's backoff for a failing Proxy: 5 ms doubling per failure, at most 1000 s
    /// (client-go's default rate limiter).
    fn backoff(&self, key: (String, String)) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        let millis = 5u64.saturating_mul(1u64 << (*n - 1).min(30));
        Duration::from_millis(millis).min(Duration::from_secs(1000))
    }

    fn succeeded(&self, key: &(String, String)) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

fn key(proxy: &Proxy) -> (String, String) {
    (proxy.namespace().unwrap_or_default(), proxy.name_any())
}

fn failure(e: &ProviderError) -> Failure {
    Failure {
        class: e.class(),
        message: e.to_string(),
    }
}

fn create_request(proxy: &Proxy, cloud_init: String, installation: Option<String>) -> CreateRequest {
    let uid = proxy.uid().unwrap_or_default();
    let placement = proxy.spec.placement.clone().unwrap_or_default();
    CreateRequest {
        name: name_from_uid(&uid),
        uid,
        namespace: proxy.namespace().unwrap_or_default(),
        proxy_name: proxy.name_any(),
        placement: Placement {
            region: placement.region,
            zone: placement.zone,
            machine_type: placement.machine_type,
            image: placement.image,
        },
        cloud_init,
        port: u16::try_from(proxy.spec.port).unwrap_or(egress_api::DEFAULT_PORT as u16),
        installation,
    }
}

/// Reads a cloud-init Secret as the labelled-Secret cache would: an unlabelled Secret is
/// invisible. The error names the Secret and key, never the content.
async fn read_secret(client: &Client, namespace: &str, r: &SecretRef) -> Result<String, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let missing = || {
        format!(
            "Secret \"{}\" with label {LABEL_CLOUD_INIT}=true and key \"{}\" not found in namespace {namespace}",
            r.name, r.key
        )
    };
    let secret = match api.get_opt(&r.name).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(missing()),
        Err(e) => return Err(format!("reading Secret \"{}\": {e}", r.name)),
    };
    let labelled = secret.labels().get(LABEL_CLOUD_INIT).is_some_and(|v| v == "true");
    if !labelled {
        return Err(missing());
    }
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .map(|b| b.0.clone())
        .ok_or_else(missing)?;
    String::from_utf8(bytes).map_err(|_| format!("Secret \"{}\" key \"{}\" is not UTF-8 text", r.name, r.key))
}

/// Writes metadata with a merge patch conditioned on the resourceVersion the pass started from
/// (an optimistic update), and returns the new resourceVersion.
async fn write_metadata(
    api: &Api<Proxy>,
    name: &str,
    rv: &str,
    metadata: serde_json::Value,
    what: &'static str,
) -> Result<String, ReconcileError> {
    let mut patch = json!({"metadata": metadata});
    patch["metadata"]["resourceVersion"] = json!(rv);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let updated = api
        .patch(name, &params, &Patch::Merge(patch))
        .await
        .map_err(|source| ReconcileError::Kube { what, source })?;
    Ok(updated.resource_version().unwrap_or_default())
}

/// One reconcile of one Proxy.
pub async fn reconcile(proxy: Arc<Proxy>, ctx: Arc<Context>) -> Result<Requeue_, ReconcileError> {
    let namespace = proxy.namespace().unwrap_or_default();
    let name = proxy.name_any();
    let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &namespace);
    let provider: Option<Arc<dyn Provider>> = ctx.providers.get(&proxy.spec.provider).cloned();
    let input = Input {
        proxy: &proxy,
        provider_configured: provider.is_some(),
        verdict: ctx.health.verdict(&namespace, &name),
        now: Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let cx = OpCtx::with_cancel(ctx.shutdown.child_token());
    let mut facts = Facts::default();
    let mut rv = proxy.resource_version().unwrap_or_default();
    let mut finalizers = proxy.finalizers().to_vec();
    let mut outcome = None;
    for _ in 0..MAX_STEPS {
        let action = match next(&input, &facts, &ctx.timings) {
            Next::Done(o) => {
                outcome = Some(o);
                break;
            }
            Next::Do(a) => a,
        };
        // The decision asks for a provider call only when the provider is configured.
        let p = || {
            provider
                .as_ref()
                .expect("the decision checked that the provider is configured")
        };
        match action {
            Action::AddFinalizer => {
                finalizers.push(FINALIZER.into());
                rv = write_metadata(&api, &name, &rv, json!({"finalizers": finalizers}), "finalizer").await?;
                facts.finalizer_added = true;
            }
            Action::RemoveFinalizer => {
                finalizers.retain(|f| f != FINALIZER);
                match write_metadata(&api, &name, &rv, json!({"finalizers": finalizers}), "finalizer").await {
                    Ok(new_rv) => rv = new_rv,
                    // Removing the last finalizer may have let the object go already.
                    Err(ReconcileError::Kube {
                        source: kube::Error::Api(s),
                        ..
                    }) if s.code == 404 => {}
                    Err(e) => return Err(e),
                }
                facts.finalizer_removed = true;
            }
            Action::WriteSpecHash(hash) => {
                let annotations = json!({ANNOTATION_SPEC_HASH: hash});
                rv = write_metadata(
                    &api,
                    &name,
                    &rv,
                    json!({"annotations": annotations}),
                    "spec-hash annotation",
                )
                .await?;
                facts.spec_hash_written = Some(hash);
            }
            Action::ReadSecret(r) => facts.secret = Some(read_secret(&ctx.client, &namespace, &r).await),
            Action::Get(id) => facts.get = Some(p().get(&cx, &id).await.map_err(|e| failure(&e))),
            Action::Create { cloud_init } => {
                let request = create_request(&proxy, cloud_init, ctx.installation.clone());
                facts.create = Some(p().create(&cx, &request).await.map_err(|e| failure(&e)));
            }
            Action::Delete(id) => facts.delete = Some(p().delete(&cx, &id).await.map_err(|e| failure(&e))),
        }
    }
    let outcome = outcome.ok_or(ReconcileError::Runaway)?;
    flush_status(&api, &proxy, &outcome.status).await?;
    match &outcome.note {
        Some(Note::SkipCleanup { provider_id }) => tracing::info!(
            proxy = %name, namespace = %namespace, providerID = %provider_id, provider = %proxy.spec.provider,
            "skip-cleanup annotation set; abandoning the instance"
        ),
        Some(Note::UnreachableButCleaned { provider_id, get_error }) => tracing::info!(
            proxy = %name, namespace = %namespace, providerID = %provider_id, error = %get_error,
            "instance unreachable but cleanup succeeded; removing the finalizer"
        ),
        None => {}
    }
    match outcome.requeue {
        Requeue::After(d) => {
            ctx.succeeded(&key(&proxy));
            Ok(Requeue_::requeue(d))
        }
        Requeue::Never => {
            ctx.succeeded(&key(&proxy));
            Ok(Requeue_::await_change())
        }
        Requeue::Error(message) => Err(ReconcileError::Provider(message)),
    }
}

/// Sends the status as a merge patch against the fetched status, only when it changed. A Proxy
/// that is gone (its last finalizer just went) is not an error.
async fn flush_status(api: &Api<Proxy>, base: &Proxy, status: &egress_api::ProxyStatus) -> Result<(), ReconcileError> {
    let before = serde_json::to_value(&base.status).unwrap_or_default();
    let after = serde_json::to_value(status).unwrap_or_default();
    if before == after {
        return Ok(());
    }
    let patch = json!({"status": merge::diff(&before, &after)});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.patch_status(&base.name_any(), &params, &Patch::Merge(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(ReconcileError::Kube { what: "status", source }),
    }
}

/// The workqueue's answer to a failed reconcile: exponential backoff per Proxy.
pub fn error_policy(proxy: Arc<Proxy>, error: &ReconcileError, ctx: Arc<Context>) -> Requeue_ {
    let delay = ctx.backoff(key(&proxy));
    tracing::warn!(proxy = %proxy.name_any(), namespace = ?proxy.namespace(), error = %error, retry_in = ?delay, "reconcile failed");
    Requeue_::requeue(delay)
}
