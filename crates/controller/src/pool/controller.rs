//! The ProxyPool controller's loop: the pools watched in the namespaces served, their members'
//! changes taken from the shared Proxy cache, and the pools a refused lease request concerns;
//! each change brings a [`pass`](crate::pool::pass) over its pool.

use std::sync::Arc;
use std::time::Duration;

use egress_api::ProxyPool;
use egress_api::served::Namespaces;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use tokio_util::sync::CancellationToken;

use crate::pool::pass::{PoolContext, reconcile};
use crate::pool::writes::PoolError;

/// A pool is looked at for its refused lease requests at most this often.
pub const WAKE_GAP: Duration = Duration::from_secs(1);

/// The queue's answer to a failed pass: look again in a second (a conflict is routine: the
/// pass read a pool the cache had not yet updated).
pub fn error_policy(pool: Arc<ProxyPool>, error: &PoolError, _: Arc<PoolContext>) -> Action {
    let conflict = matches!(error, PoolError::Kube { source: kube::Error::Api(s), .. } if s.code == 409);
    if conflict {
        tracing::debug!(pool = %pool.name_any(), "pool pass raced a newer version; retrying");
    } else {
        tracing::warn!(pool = %pool.name_any(), namespace = ?pool.namespace(), error = %error, "pool pass failed");
    }
    Action::requeue(Duration::from_secs(1))
}

/// The ProxyPool controller: watches the pools of `namespaces` and takes their members'
/// changes from the shared Proxy cache, so a member's failure reaches its pool with no watch of
/// its own. Returns the future that runs it until `shutdown`. When the ProxyPool resource is
/// not installed (a cluster that did not apply the new CRD), it says so once and runs nothing.
pub async fn run(ctx: Arc<PoolContext>, namespaces: Namespaces, shutdown: CancellationToken) {
    use futures::StreamExt;
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::{Controller, WatchStreamExt, watcher};

    // Whether the resource is installed is asked where the operator may list pools.
    let pools: Api<ProxyPool> = match namespaces.names().and_then(|n| n.first()) {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let one = kube::api::ListParams::default().limit(1);
    let probe = pools.list(&one);
    match tokio::select! {
        _ = shutdown.cancelled() => return,
        r = probe => r,
    } {
        Err(kube::Error::Api(s)) if s.code == 404 => {
            tracing::warn!(
                "the ProxyPool resource is not installed (apply deploy/crds); pools are not served until the operator restarts with it"
            );
            shutdown.cancelled().await;
            return;
        }
        // Anything else (RBAC, a slow server) the controller's watch reports and retries.
        _ => {}
    }
    let members = ctx.cache.subscribe();
    // A refused lease request may be a pool's to answer (one scaled to zero waits for it):
    // the pools refused are looked at, each at most once per WAKE_GAP.
    let refusals = ctx.refusals.clone();
    let refused = futures::stream::unfold(refusals.map(|r| (r.subscribe(), r, false)), |state| async move {
        let (mut rx, refusals, rest) = state?;
        if rest {
            // Refusals meanwhile mark the channel, and are taken together after the gap.
            tokio::time::sleep(WAKE_GAP).await;
        }
        rx.changed().await.ok()?;
        let pools: Vec<ObjectRef<ProxyPool>> = refusals
            .take_refused()
            .iter()
            .filter_map(|key| key.split_once('/'))
            .map(|(ns, name)| ObjectRef::new(name).within(ns))
            .collect();
        Some((futures::stream::iter(pools), Some((rx, refusals, true))))
    })
    .flatten();
    let (reader, writer) = reflector::store();
    let watched = egress_api::served::watch(ctx.client.clone(), &namespaces, watcher::Config::default(), |_| {})
        .reflect(writer)
        .applied_objects();
    Controller::for_stream(watched, reader)
        .owns_stream(members)
        .reconcile_on(refused)
        .with_config(kube::runtime::controller::Config::default().concurrency(2))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            use kube::runtime::controller::Error;
            match result {
                Ok(_) | Err(Error::ReconcilerFailed(..) | Error::ObjectNotFound(_)) => {}
                Err(e) => tracing::warn!(error = %e, "ProxyPool controller error"),
            }
        })
        .await;
}
