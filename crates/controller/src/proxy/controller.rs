//! The Proxy controller's loop: what puts a Proxy on the reconcile queue (a change of it in the
//! shared cache, a change of a cloud-init Secret it uses or of the credentials Secret it names,
//! a health event) and the workers that run a [`reconcile`] for each.

use std::sync::Arc;

use egress_api::{LABEL_CLOUD_INIT, Proxy};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use crate::proxy::context::{Context, DEFAULT_CONCURRENCY};
use crate::proxy::reconciler::{error_policy, queue_key, reconcile};

/// How the Proxy controller is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// The namespaces whose cloud-init Secrets are watched (`--proxy-namespace`): those of the
    /// Proxies the cache holds.
    pub namespaces: egress_api::served::Namespaces,
    /// Proxies reconciled at once (3, as the Go operator); one key is never reconciled twice at
    /// the same time.
    pub concurrency: u16,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            namespaces: egress_api::served::Namespaces::All,
            concurrency: DEFAULT_CONCURRENCY,
        }
    }
}

/// The External Proxies in `proxies` a credentials Secret watch event concerns: those whose
/// `secretRef` names that Secret, or, after a re-list (anything may have changed meanwhile),
/// all of those with a `secretRef`.
fn credential_users(
    proxies: &kube::runtime::reflector::Store<Proxy>,
    event: &kube::runtime::watcher::Event<Secret>,
) -> Vec<kube::runtime::reflector::ObjectRef<Proxy>> {
    use kube::runtime::watcher::Event;
    let secret = match event {
        Event::Apply(s) | Event::Delete(s) => Some((s.namespace().unwrap_or_default(), s.name_any())),
        Event::InitDone => None,
        Event::Init | Event::InitApply(_) => return Vec::new(),
    };
    proxies
        .state()
        .iter()
        .filter(|p| p.spec.credentials_type() == egress_api::CredentialsType::Secret)
        .filter(|p| secret.is_none() || crate::proxy::credentials::CredentialCache::secret_of(p) == secret)
        .map(|p| kube::runtime::reflector::ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// Runs the Proxy controller: takes Proxies from the shared cache, watches cloud-init Secrets (a
/// changed Secret enqueues the Proxies in its namespace that reference it, so a content change
/// replaces their instances without waiting for the drift poll), follows the credential cache
/// (a changed credentials Secret, its annotations included, enqueues the External Proxies that
/// name it, so a refusal starts or ends at once), and takes health events (a Proxy whose verdict
/// changed). Returns the future that runs it until `shutdown`; the caches must be kept running
/// beside it.
pub fn run(
    ctx: Arc<Context>,
    config: ControllerConfig,
    cache: crate::proxy_cache::ProxyCache,
    health_events: impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<Proxy>> + Send + 'static,
    shutdown: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send {
    use futures::StreamExt;
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::{Controller, WatchStreamExt, watcher};

    let lookup = cache.store();
    // Every trigger puts its Proxy on the queue, as the queue metrics count it.
    let queue = ctx.metrics.queue().clone();
    let (on_change, on_secret, on_health, on_credentials, on_gone) =
        (queue.clone(), queue.clone(), queue.clone(), queue.clone(), queue);
    let changes = cache.subscribe().inspect(move |p| {
        if let Ok(p) = p {
            on_change.added(&queue_key(p));
        }
    });
    let health_events = health_events.inspect(move |r| on_health.added(&ref_key(r)));
    // The credential cache tells of each Secret change once its store holds it, so the pass it
    // triggers sees the change. Without a cache the sender is dropped and the stream ends.
    let (tell, credential_events) = futures::channel::mpsc::unbounded();
    if let Some(credentials) = &ctx.credentials {
        let proxies = cache.store();
        credentials.observe(Arc::new(move |event| {
            for r in credential_users(&proxies, event) {
                // Fails only once the controller is gone.
                let _ = tell.unbounded_send(r);
            }
        }));
    }
    let credential_events = credential_events.inspect(move |r| on_credentials.added(&ref_key(r)));
    let triggers = futures::stream::select(health_events, credential_events);
    let controller = Controller::for_stream(changes, cache.store());
    let labelled = watcher::Config::default().labels(&format!("{LABEL_CLOUD_INIT}=true"));
    let secrets = egress_api::served::watch(ctx.client.clone(), &config.namespaces, labelled, |_: &mut Secret| {})
        .touched_objects();
    controller
        .watches_stream(secrets, move |secret: Secret| {
            let namespace = secret.namespace();
            let name = secret.name_any();
            lookup
                .state()
                .into_iter()
                .filter(|p| p.namespace() == namespace)
                .filter(|p| {
                    p.spec
                        .cloud_init
                        .as_ref()
                        .and_then(|c| c.secret_ref.as_ref())
                        .is_some_and(|r| r.name == name)
                })
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .inspect(|r| on_secret.added(&ref_key(r)))
                .collect::<Vec<_>>()
        })
        .reconcile_on(triggers)
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(move |result| {
            let on_gone = on_gone.clone();
            async move {
                use kube::runtime::controller::Error;
                match result {
                    // A Proxy gone when its turn came leaves the queue without a reconcile.
                    Err(Error::ObjectNotFound(r)) => on_gone.forget(&ref_key(&r)),
                    // Failed reconciles are logged by error_policy.
                    Ok(_) | Err(Error::ReconcilerFailed(..)) => {}
                    // A failing watch (of Secrets, say, when RBAC forbids it) must be visible.
                    Err(e) => tracing::warn!(error = %e, "Proxy controller error"),
                }
            }
        })
}

fn ref_key<K: kube::runtime::reflector::Lookup>(r: &kube::runtime::reflector::ObjectRef<K>) -> String {
    format!("{}/{}", r.namespace.as_deref().unwrap_or_default(), r.name)
}
