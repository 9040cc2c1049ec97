//! The Proxy reconciler's I/O shell: it runs the pure decision of [`super::decide`], performs
//! each action with kube or the provider, and flushes the status when it changed. What every
//! reconcile shares is its [`Context`].

use std::sync::Arc;

use egress_api::{ANNOTATION_PREVIOUS_SPEC_HASH, ANNOTATION_SPEC_HASH, FINALIZER, Proxy};
use egress_provider::{CreateRequest, Interrupted, OpCtx, Placement, Provider, ProviderError, name_from_uid};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action as ControllerAction;
use serde_json::json;
use tracing::Instrument;

use crate::identity::{FIELD_MANAGER, reconcile_id};
use crate::merge;
use crate::proxy::context::Context;
use crate::proxy::decide::{Action, Facts, Input, Next, Note, Outcome, ProviderFailure, Requeue, next, replacing};
use crate::runtime_metrics::ReconcileResult;

/// The most steps one pass may take; a pass needs at most a handful.
const MAX_STEPS: usize = 16;

/// A reconcile that failed; the workqueue retries it with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The pass decided to retry with backoff; `why` is what it found (the message its status
    /// shows). A status write that failed as well is kept beside it.
    #[error("{why}{}", .status_write.as_ref().map(|e| format!("; {e}")).unwrap_or_default())]
    Backoff {
        why: String,
        status_write: Option<Box<ReconcileError>>,
    },
    /// The Proxy names a provider entry the config does not have. (The decision asks for a
    /// provider call only when the entry exists, so this is a bug if it is ever seen.)
    #[error("provider \"{provider}\" is not configured")]
    NotConfigured { provider: String },
    #[error("writing Proxy {what}: {source}")]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("the pass did not end within {MAX_STEPS} steps (a bug)")]
    Runaway,
    #[error("the reconcile panicked: {0}")]
    Panicked(String),
}

pub(crate) fn key(proxy: &Proxy) -> (String, String) {
    (proxy.namespace().unwrap_or_default(), proxy.name_any())
}

/// The reconcile queue's key of a Proxy, as the queue metrics track it.
pub(crate) fn queue_key(proxy: &Proxy) -> String {
    format!("{}/{}", proxy.namespace().unwrap_or_default(), proxy.name_any())
}

fn failure(e: &ProviderError) -> ProviderFailure {
    ProviderFailure {
        class: e.class(),
        message: e.to_string(),
    }
}

fn create_request(
    proxy: &Proxy,
    cloud_init: Vec<u8>,
    installation: Option<String>,
    credentials: Option<egress_provider::ProxyCredentials>,
) -> CreateRequest {
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
        credentials,
        // A pool's members are spread apart where the backend can: on one node they would
        // share one exit.
        spread_group: proxy.pool().map(|m| m.pool_uid.to_owned()),
    }
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

/// The name of every reconcile's root span; the log formatter recognises it to write
/// controller-runtime's keys on the lines inside it.
pub const RECONCILE_SPAN: &str = "Reconcile Proxy";

/// One reconcile of one Proxy, in its `Reconcile Proxy` span (spec/core.md §9.3).
pub async fn reconcile(proxy: Arc<Proxy>, ctx: Arc<Context>) -> Result<ControllerAction, ReconcileError> {
    let span = tracing::info_span!(
        "Reconcile Proxy",
        otel.kind = "internal",
        k8s.namespace.name = %proxy.namespace().unwrap_or_default(),
        k8s.object.name = %proxy.name_any(),
        reconcile.id = %reconcile_id(),
        reconcile.requeue_after = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let queued = queue_key(&proxy);
    let worker = ctx.metrics.start();
    let working = ctx.metrics.queue().started(&queued);
    let started = std::time::Instant::now();
    // A panic is caught, counted and retried as a failed reconcile, as controller-runtime does:
    // one bad Proxy must not take down the worker pool.
    let run = std::panic::AssertUnwindSafe(reconcile_in_span(&proxy, &ctx, &span).instrument(span.clone()));
    let (result, panicked) = match futures::FutureExt::catch_unwind(run).await {
        Ok(result) => (result, false),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            tracing::error!(parent: &span, panic = %what, "reconcile panicked");
            (Err(ReconcileError::Panicked(what)), true)
        }
    };
    let counted = match &result {
        Ok(Requeue::After(_)) => ReconcileResult::RequeueAfter,
        Ok(Requeue::Never) => ReconcileResult::Success,
        Ok(Requeue::Error(_)) | Err(_) => ReconcileResult::Error,
    };
    ctx.metrics.finished(started.elapsed(), counted, panicked);
    drop((worker, working));
    if let Ok(Requeue::After(delay)) = &result {
        ctx.metrics.queue().retried(&queued, *delay);
    }
    match &result {
        Ok(Requeue::After(d)) => {
            span.record("reconcile.requeue_after", d.as_secs_f64());
        }
        Ok(Requeue::Never) => {}
        // A failure the workqueue retries is an error of this reconcile, whatever its source.
        Ok(Requeue::Error(_)) | Err(_) => {
            span.record("otel.status_code", "error");
        }
    }
    let result = result.and_then(|requeue| match requeue {
        Requeue::After(d) => Ok(ControllerAction::requeue(d)),
        Requeue::Never => Ok(ControllerAction::await_change()),
        Requeue::Error(why) => Err(ReconcileError::Backoff {
            why,
            status_write: None,
        }),
    });
    if result.is_ok() {
        ctx.succeeded(&key(&proxy));
    }
    result
}

async fn reconcile_in_span(proxy: &Proxy, ctx: &Context, root: &tracing::Span) -> Result<Requeue, ReconcileError> {
    let namespace = proxy.namespace().unwrap_or_default();
    let name = proxy.name_any();
    let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &namespace);
    let path = if proxy.metadata.deletion_timestamp.is_some() {
        Some(tracing::info_span!("reconcile.delete", otel.kind = "internal"))
    } else if proxy.spec.mode == egress_api::Mode::Managed {
        Some(tracing::info_span!("reconcile.managed", otel.kind = "internal"))
    } else {
        // The external path does no I/O and has no span.
        None
    };
    let pass = match path {
        Some(span) => run_pass(proxy, ctx, &api, root).instrument(span).await,
        None => run_pass(proxy, ctx, &api, root).await,
    };
    // The status flush runs on every exit, errors included (with nothing decided, the fetched
    // status is flushed, which writes nothing).
    let status = match &pass {
        Ok(outcome) => outcome.status.clone(),
        Err(_) => proxy.status.clone().unwrap_or_default(),
    };
    let flushed = flush_status(&api, proxy, &status)
        .instrument(tracing::info_span!("status.patch", otel.kind = "internal"))
        .await;
    let outcome = pass?;
    // Events follow a status that was written; after a failed flush the next pass says it again.
    if flushed.is_ok() {
        publish_events(ctx, proxy, &outcome).await;
    }
    match &outcome.note {
        Some(Note::SkipCleanup { provider_id }) => tracing::info!(
            proxy = %name, namespace = %namespace, providerID = %provider_id, provider = %proxy.spec.provider,
            "skip-cleanup annotation set; abandoning the instance"
        ),
        Some(Note::UnreachableButCleaned { provider_id, get_error }) => tracing::info!(
            proxy = %name, namespace = %namespace, providerID = %provider_id, error = %get_error,
            "instance unreachable but cleanup succeeded; removing the finalizer"
        ),
        Some(Note::LeftToItsOwner { provider_id, owner }) => tracing::warn!(
            proxy = %name, namespace = %namespace, providerID = %provider_id, owner = %owner,
            "the instance is marked as another Proxy's; removing the finalizer without deleting it"
        ),
        Some(Note::Adopted { provider_id, previous }) => tracing::info!(
            proxy = %name, namespace = %namespace, providerID = %provider_id, previousSpecHash = %previous,
            "adopted the instance from another operator's spec hash; not replaced"
        ),
        None => {}
    }
    match (outcome.requeue, flushed) {
        (requeue, Ok(())) => Ok(requeue),
        // A failed status write is added to the reconcile's own error, if it has one.
        (Requeue::Error(why), Err(e)) => Err(ReconcileError::Backoff {
            why,
            status_write: Some(Box::new(e)),
        }),
        (_, Err(e)) => Err(e),
    }
}

/// The steps of one pass until the decision ends it.
async fn run_pass(
    proxy: &Proxy,
    ctx: &Context,
    api: &Api<Proxy>,
    root: &tracing::Span,
) -> Result<Outcome, ReconcileError> {
    let provider: Option<Arc<dyn Provider>> = ctx.providers.get(&proxy.spec.provider).cloned();
    let uid = proxy.uid().unwrap_or_default();
    let lookup = ctx.credentials.as_ref().map(|c| c.lookup(proxy));
    let input = Input {
        proxy,
        provider_configured: provider.is_some(),
        configured_providers: &ctx.provider_names,
        verdict: ctx.health.verdict_for(proxy),
        exit: ctx.exits.finding(proxy),
        credentials_cached: matches!(lookup, Some(crate::proxy::credentials::Lookup::Found(_))),
        credentials_refused: match lookup {
            Some(crate::proxy::credentials::Lookup::Refused(refusal)) => Some(refusal),
            _ => None,
        },
        address_missing_since: ctx.address_missing_since(&uid),
        external_refused: ctx.external.refusal(proxy),
        installation: ctx.installation.as_deref(),
        now: Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let mut pass = Pass {
        proxy,
        ctx,
        api,
        provider,
        cx: OpCtx::with_cancel(ctx.shutdown.child_token()).with_timeout(ctx.timings.pass_deadline),
        facts: Facts::default(),
        rv: proxy.resource_version().unwrap_or_default(),
        finalizers: proxy.finalizers().to_vec(),
    };
    let ended = pass.steps(&input, root).await;
    // The pass outlived its deadline: a provider call was cut short by it, or would have been
    // (a reconcile timeout, as controller-runtime counts one).
    if pass.cx.interrupted() == Some(Interrupted::DeadlineExceeded) {
        ctx.metrics.timed_out();
    }
    ended
}

/// One pass over one Proxy: what it acts with, and what it has learned and written so far.
struct Pass<'a> {
    proxy: &'a Proxy,
    ctx: &'a Context,
    api: &'a Api<Proxy>,
    /// The Proxy's provider entry, when the config has it.
    provider: Option<Arc<dyn Provider>>,
    /// The context of its provider calls: cancelled at shutdown, and ending at the pass's
    /// deadline ([`Timings::pass_deadline`]).
    cx: OpCtx,
    /// The results of the actions so far, which the decision reads.
    facts: Facts,
    /// The resourceVersion of the pass's last write (at first, of the copy it started from).
    rv: String,
    /// The finalizers as last written.
    finalizers: Vec<String>,
}

impl Pass<'_> {
    /// The steps of the pass until the decision ends it, each action performed as the decision
    /// names it.
    async fn steps(&mut self, input: &Input<'_>, root: &tracing::Span) -> Result<Outcome, ReconcileError> {
        let ctx = self.ctx;
        let mut replace_span: Option<tracing::Span> = None;
        for _ in 0..MAX_STEPS {
            let action = match next(input, &self.facts, &ctx.timings) {
                Next::Done(o) => {
                    let uid = self.proxy.uid().unwrap_or_default();
                    ctx.saw_instance(&uid, self.facts.get.as_ref(), &input.now);
                    return Ok(o);
                }
                Next::Do(a) => a,
            };
            // The steps of a replacement share one `reconcile.replaceInstance` span, a sibling of
            // `reconcile.managed` under `Reconcile Proxy`.
            let step_span = if replacing(input, &self.facts) {
                replace_span
                    .get_or_insert_with(
                        || tracing::info_span!(parent: root, "reconcile.replaceInstance", otel.kind = "internal"),
                    )
                    .clone()
            } else {
                tracing::Span::current()
            };
            self.perform(action).instrument(step_span).await?;
        }
        Err(ReconcileError::Runaway)
    }

    /// The provider to call. The decision asks for a call only when the entry exists.
    fn provider(&self) -> Result<&Arc<dyn Provider>, ReconcileError> {
        self.provider.as_ref().ok_or_else(|| ReconcileError::NotConfigured {
            provider: self.proxy.spec.provider.clone(),
        })
    }

    /// Writes `patch` into the Proxy's metadata on the pass's last resourceVersion.
    async fn write(&mut self, patch: serde_json::Value, what: &'static str) -> Result<(), ReconcileError> {
        self.rv = write_metadata(self.api, &self.proxy.name_any(), &self.rv, patch, what).await?;
        Ok(())
    }

    /// Performs one action and records its result in the facts.
    async fn perform(&mut self, action: Action) -> Result<(), ReconcileError> {
        let (proxy, ctx) = (self.proxy, self.ctx);
        match action {
            Action::AddFinalizer => {
                self.finalizers.push(FINALIZER.into());
                self.write(json!({"finalizers": self.finalizers}), "finalizer").await?;
                self.facts.finalizer_added = true;
            }
            Action::RemoveFinalizer => self.remove_finalizer().await?,
            Action::WriteSpecHash(hash) => {
                // A value kept from an adoption describes an instance this one replaces: gone too.
                let annotations = json!({ANNOTATION_SPEC_HASH: hash, ANNOTATION_PREVIOUS_SPEC_HASH: null});
                self.write(json!({"annotations": annotations}), "spec-hash annotation")
                    .await?;
                self.facts.spec_hash_written = Some(hash);
            }
            Action::AdoptInstance { hash, previous } => {
                let annotations = json!({ANNOTATION_SPEC_HASH: hash, ANNOTATION_PREVIOUS_SPEC_HASH: previous});
                self.write(json!({"annotations": annotations}), "spec-hash annotation (adoption)")
                    .await?;
                self.facts.spec_hash_written = Some(hash);
                self.facts.adopted_from = Some(previous);
            }
            Action::ReadSecret(r) => {
                let namespace = proxy.namespace().unwrap_or_default();
                self.facts.secret = Some(crate::proxy::secret::read_cloud_init(&ctx.client, &namespace, &r).await);
            }
            Action::Get(id) => {
                let answer = self.provider()?.get(&self.cx, &id).await.map_err(|e| failure(&e));
                self.facts.get = Some(answer);
            }
            Action::PrepareCredentials { gone } => {
                // Before a create, and like it on a proven-current copy: a pass on a stale copy
                // would rotate the credentials of the instance a previous pass just made.
                ensure_current(self.api, proxy, &proxy.name_any(), &mut self.rv).await?;
                self.facts.credentials =
                    Some(crate::proxy::credentials::prepare(&ctx.client, proxy, gone.as_ref()).await);
            }
            Action::GetBound(id) => {
                let answer = self.provider()?.get(&self.cx, &id).await.map_err(|e| failure(&e));
                self.facts.bound_instance = Some((id, answer));
            }
            Action::BindCredentials(id) => {
                self.facts.credentials_bound = Some(crate::proxy::credentials::bind(&ctx.client, proxy, &id).await);
            }
            Action::CheckCredentials(id) => {
                self.facts.credentials_checked = Some(crate::proxy::credentials::check(&ctx.client, proxy, &id).await);
            }
            Action::Create {
                cloud_init,
                credentials,
            } => self.create(cloud_init, credentials).await?,
            Action::Delete(id) => {
                let answer = self.provider()?.delete(&self.cx, &id).await.map_err(|e| failure(&e));
                self.facts.delete = Some(answer);
            }
            Action::MarkInstallation { id, installation } => {
                let answer = self
                    .provider()?
                    .mark_installation(&self.cx, &id, &installation)
                    .await
                    .map_err(|e| failure(&e));
                log_mark(&id, &installation, &answer);
                self.facts.marked = Some(answer);
            }
        }
        Ok(())
    }

    /// Removes the finalizer; the Proxy may be gone already once it was the last.
    async fn remove_finalizer(&mut self) -> Result<(), ReconcileError> {
        self.finalizers.retain(|f| f != FINALIZER);
        match self.write(json!({"finalizers": self.finalizers}), "finalizer").await {
            Ok(()) => {}
            // Removing the last finalizer may have let the object go already.
            Err(ReconcileError::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        self.facts.finalizer_removed = true;
        Ok(())
    }

    /// Creates the instance on a proven-current copy of the Proxy, if the provider entry's
    /// create budget has room; else the create is deferred.
    async fn create(
        &mut self,
        cloud_init: Vec<u8>,
        credentials: Option<egress_provider::ProxyCredentials>,
    ) -> Result<(), ReconcileError> {
        let (proxy, ctx) = (self.proxy, self.ctx);
        ensure_current(self.api, proxy, &proxy.name_any(), &mut self.rv).await?;
        // NB: the budget is asked after the freshness check, so a pass on a stale copy
        // (a 409 there) spends no token, and before the provider, so a create over the
        // budget costs the backend nothing.
        if let Err(deferral) = ctx
            .create_budgets
            .try_take(&proxy.spec.provider, &proxy.uid().unwrap_or_default())
        {
            tracing::debug!(
                provider = %proxy.spec.provider,
                wait = ?deferral.wait,
                "create waits for the provider entry's create budget"
            );
            self.facts.create_deferred = Some(deferral);
            return Ok(());
        }
        let request = create_request(proxy, cloud_init, ctx.installation.clone(), credentials);
        let answer = self
            .provider()?
            .create(&self.cx, &request)
            .await
            .map_err(|e| failure(&e));
        self.facts.create = Some(answer);
        Ok(())
    }
}

/// Logs how marking instance `id` with `installation` went. A failure is a warning and nothing
/// more: the Proxy goes on as it would have, and its next pass marks again.
fn log_mark(id: &egress_provider::ProviderId, installation: &str, answer: &Result<(), ProviderFailure>) {
    match answer {
        Ok(()) => tracing::debug!(providerID = %id, installation, "marked the instance with the installation"),
        Err(f) => tracing::warn!(
            providerID = %id, installation, class = f.class.label(), error = %f.message,
            "marking the instance with the installation failed; the next pass tries again"
        ),
    }
}

/// A pass can start from a cached copy older than this reconciler's own last write (one queued
/// by an earlier event runs before the write's watch event arrives), and a create decided on it
/// would create again what a pass just made. Unless this pass wrote the object itself, a write
/// that changes nothing but names the copy's resourceVersion proves it current first: a stale
/// one gets 409, and the retry reads a newer copy.
async fn ensure_current(api: &Api<Proxy>, proxy: &Proxy, name: &str, rv: &mut String) -> Result<(), ReconcileError> {
    if proxy.resource_version().as_deref() == Some(rv.as_str()) {
        *rv = write_metadata(api, name, rv, json!({}), "freshness check before a create").await?;
    }
    Ok(())
}

/// Publishes the pass's Events. A failure to publish is logged; it never fails the reconcile.
async fn publish_events(ctx: &Context, proxy: &Proxy, outcome: &Outcome) {
    let before = proxy.status.clone().unwrap_or_default();
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    let mut events = crate::proxy::events::derive(
        &before,
        &outcome.status,
        outcome.note.as_ref(),
        &outcome.requeue,
        deleting,
    );
    events.extend(outcome.marked.as_ref().map(crate::proxy::events::installation_marked));
    if events.is_empty() {
        return;
    }
    let reference = kube::Resource::object_ref(proxy, &());
    let namespace = proxy.namespace().unwrap_or_else(|| "default".into());
    for e in events {
        crate::events::post(&ctx.client, &ctx.instance, &reference, &namespace, &e).await;
    }
}

/// Sends the status as a merge patch against the fetched status, only when it changed. A Proxy
/// that is gone (its last finalizer just went) is not an error.
async fn flush_status(api: &Api<Proxy>, base: &Proxy, status: &egress_api::ProxyStatus) -> Result<(), ReconcileError> {
    // No status and an empty one are the same thing: nothing to write.
    let before = serde_json::to_value(base.status.clone().unwrap_or_default()).unwrap_or_default();
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
pub fn error_policy(proxy: Arc<Proxy>, error: &ReconcileError, ctx: Arc<Context>) -> ControllerAction {
    let delay = ctx.backoff(key(&proxy));
    ctx.metrics.queue().retried(&queue_key(&proxy), delay);
    let conflict = matches!(error, ReconcileError::Kube { source: kube::Error::Api(s), .. } if s.code == 409);
    if conflict {
        // The pass started from a copy the cache had not yet updated; the retry reads a newer
        // one. Routine with optimistic writes, so not worth a warning.
        tracing::debug!(proxy = %proxy.name_any(), namespace = ?proxy.namespace(), retry_in = ?delay, "reconcile raced a newer version; retrying");
    } else {
        tracing::warn!(proxy = %proxy.name_any(), namespace = ?proxy.namespace(), error = %error, retry_in = ?delay, "reconcile failed");
    }
    ControllerAction::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::{LABEL_POOL, ProxySpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn a_pool_member_is_created_in_its_pools_spread_group() {
        let mut proxy = Proxy::new("eu-x1y2z", ProxySpec::default());
        proxy.metadata.uid = Some("proxy-uid".into());
        let group = |p: &Proxy| create_request(p, Vec::new(), None, None).spread_group;
        assert_eq!(group(&proxy), None, "a Proxy of its own");
        proxy.metadata.labels = Some([(LABEL_POOL.to_owned(), "eu".to_owned())].into());
        assert_eq!(group(&proxy), None, "a label alone makes no member");
        proxy.metadata.owner_references = Some(vec![OwnerReference {
            api_version: egress_api::API_VERSION.into(),
            kind: "ProxyPool".into(),
            name: "eu".into(),
            uid: "pool-uid".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        assert_eq!(group(&proxy).as_deref(), Some("pool-uid"));
    }
}
