//! The ProxyPool controller's I/O shell (docs/pools.md): it reads a pool's members from the
//! operator's Proxy cache and their leases from the lease store, runs the pure decision of
//! [`crate::pool::decide`], performs each step as one write to the API server (a new member, a
//! role label, a delete) and flushes the pool's status. No step calls a backend: the Proxy
//! reconciler provisions each member as it provisions any Proxy.
//!
//! Two things keep a pass from acting twice on one change:
//!
//! - **Expectations.** A pass remembers what it wrote (members made, roles changed, members
//!   deleted). The next pass plans only once the cache shows all of it, or [`EXPECTATION_TTL`]
//!   has passed; until then it looks again shortly. Without this a pass on a cache that has not
//!   yet seen a promotion would promote a second standby, and one that has not seen a create
//!   would create again.
//! - **A bound on the writes of one pass** ([`MAX_WRITES`]): a pool of thousands converges over
//!   several passes, each of them short.
//!
//! Long file: it is the one I/O shell of the pool decision: a pass's reads, its writes, Events,
//! the autoscaler's look and the status flush share the pass's context (the pure parts are in
//! `view`, `decide` and `autoscale`, the metrics in `metrics`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_api::served::Namespaces;
use egress_api::{
    ANNOTATION_DRAINING_SINCE, ConditionStatus, FINALIZER, LABEL_POOL, LABEL_POOL_ROLE, PoolRole, Proxy, ProxyPool,
    ProxyPoolStatus,
};
use egress_discovery::Refusals;
use egress_lease::LeaseStore;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::events::{self, Event};
use crate::identity::{FIELD_MANAGER, reconcile_id, reporting_instance};
use crate::pool::autoscale::{Load, LowSince, Policy, recommend, scale};
use crate::pool::decide::{Desired, Plan, Step, plan};
use crate::pool::member::Member;
use crate::pool::metrics::{CreateLabels, DrainLabels, PoolLabels, PoolMetrics, ScaleLabels};
use crate::pool::remediation::{self, Backoff, DEFAULT_STARTUP_GRACE, Gate, Observed, Watch, share};
use crate::pool::view::{
    Look, at_rest, counts, desired, drain_reason, health, member, new_member, remediation_condition, set_conditions,
    set_remediation, template_hash,
};
use crate::probe_target::ProbeTarget;
use crate::proxy_cache::ProxyCache;

/// A draining member's leases end when it is not told: while one has leases, its pool is
/// looked at again this often.
pub const DRAIN_POLL: Duration = Duration::from_secs(5);
/// A pool with nothing to wait for is looked at again after this (a member deleted outright,
/// without the watch event a finalizer gives, is noticed by then).
pub const RESYNC: Duration = Duration::from_secs(60);
/// How long a pass waits for the cache to show the previous pass's writes before it plans on
/// what it sees.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(30);
/// Writes one pass performs at most; the rest is the next pass's.
pub const MAX_WRITES: usize = 64;
/// A pool with `spec.autoscale` is looked at this often: its lease load is sampled then (a
/// refused request that concerns it brings the look sooner).
pub const AUTOSCALE_PERIOD: Duration = Duration::from_secs(5);
/// A pool is looked at for its refused lease requests at most this often.
pub const WAKE_GAP: Duration = Duration::from_secs(1);
/// Refused requests of this window count towards a pool's size.
pub const REFUSAL_WINDOW: Duration = Duration::from_secs(10);
/// The finalizer the API server sets on an object deleted with `--cascade=orphan` until its
/// dependents are released.
const ORPHAN_FINALIZER: &str = "orphan";
/// The longest label value: a pool's name is one on each member.
const MAX_LABEL_VALUE: usize = 63;

/// What a pass wrote and waits to see in the cache, per pool UID.
#[derive(Debug, Default)]
struct Expected {
    /// Members made (their names as the API server gave them).
    created: Vec<String>,
    /// Members whose role was changed, and to what.
    roles: Vec<(String, PoolRole)>,
    deleted: Vec<String>,
    /// The pool's generation after the autoscaler wrote its `replicas`: a pass on an older
    /// copy of the pool would plan for the old number (and drain what was just made for the
    /// new one).
    pool_generation: Option<i64>,
    since: Option<Instant>,
}

impl Expected {
    fn seen_in(&self, pool: &ProxyPool, members: &HashMap<String, &Proxy>) -> bool {
        self.pool_generation
            .is_none_or(|g| pool.metadata.generation.is_some_and(|seen| seen >= g))
            && self.created.iter().all(|n| members.contains_key(n))
            && self
                .deleted
                .iter()
                .all(|n| members.get(n).is_none_or(|p| p.metadata.deletion_timestamp.is_some()))
            && self
                .roles
                .iter()
                .all(|(n, role)| members.get(n).is_none_or(|p| p.pool().map(|m| m.role) == Some(*role)))
    }
}

/// What the autoscaler remembers of a pool between looks. A new leader starts afresh: a
/// scale-down waits a whole delay again, a scale-up loses nothing.
#[derive(Debug, Default)]
struct AutoscaleMemory {
    low: Option<LowSince>,
    /// The last time the autoscaler raised the pool: refusals before it were answered by it.
    last_up: Option<Instant>,
    /// The look that found every member the pool asks for Ready after one that did not.
    complete_since: Option<Instant>,
    /// The last look found members the pool asks for not yet Ready.
    incomplete: bool,
}

/// What every pool pass shares.
pub struct PoolContext {
    pub client: Client,
    pub cache: ProxyCache,
    pub store: Arc<dyn LeaseStore>,
    pub metrics: PoolMetrics,
    /// Refused lease requests, counted by the discovery API (`None`: it is not served, and
    /// autoscale sizes pools by utilisation alone).
    refusals: Option<Arc<Refusals>>,
    /// The reporting instance of its Events.
    instance: String,
    expected: Mutex<HashMap<String, Expected>>,
    /// The last create that failed, per pool UID, until a create succeeds.
    create_failures: Mutex<HashMap<String, String>>,
    autoscale: Mutex<HashMap<String, AutoscaleMemory>>,
    /// What this leader has seen of each pool's members' health, per pool UID.
    watches: Mutex<HashMap<String, HealthWatch>>,
    /// The operator's probe target as it answers the operator directly, when it is fetched.
    probe_target: Option<ProbeTarget>,
}

impl std::fmt::Debug for PoolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolContext").finish_non_exhaustive()
    }
}

impl PoolContext {
    pub fn new(
        client: Client,
        cache: ProxyCache,
        store: Arc<dyn LeaseStore>,
        metrics: PoolMetrics,
        refusals: Option<Arc<Refusals>>,
    ) -> Self {
        Self {
            client,
            cache,
            store,
            metrics,
            refusals,
            instance: reporting_instance(),
            expected: Mutex::default(),
            create_failures: Mutex::default(),
            autoscale: Mutex::default(),
            watches: Mutex::default(),
            probe_target: None,
        }
    }

    /// Tells pools that stop remediation what fetching `target` directly found.
    #[must_use]
    pub fn with_probe_target(mut self, target: ProbeTarget) -> Self {
        self.probe_target = Some(target);
        self
    }
}

/// A pass that failed; the queue retries it with backoff.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("writing {what}: {source}")]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

fn kube_error(what: &'static str) -> impl FnOnce(kube::Error) -> PoolError {
    move |source| PoolError::Kube { what, source }
}

/// One pass over one pool, in its `Reconcile ProxyPool` span.
pub async fn reconcile(pool: Arc<ProxyPool>, ctx: Arc<PoolContext>) -> Result<Action, PoolError> {
    let span = tracing::info_span!(
        "Reconcile ProxyPool",
        otel.kind = "internal",
        k8s.namespace.name = %pool.namespace().unwrap_or_default(),
        k8s.object.name = %pool.name_any(),
        reconcile.id = %reconcile_id(),
        pool.steps = tracing::field::Empty,
    );
    pass(&pool, &ctx, &span).instrument(span.clone()).await
}

async fn pass(pool: &ProxyPool, ctx: &PoolContext, span: &tracing::Span) -> Result<Action, PoolError> {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let uid = pool.uid().unwrap_or_default();
    let pools: Api<ProxyPool> = Api::namespaced(ctx.client.clone(), &namespace);
    let proxies: Api<Proxy> = Api::namespaced(ctx.client.clone(), &namespace);
    let deleting = pool.metadata.deletion_timestamp.is_some();
    let finalizers = pool.finalizers();
    if deleting && finalizers.iter().any(|f| f == ORPHAN_FINALIZER) {
        // `--cascade=orphan`: the garbage collector frees the members, which stay as plain
        // Proxies; the pool's own finalizer goes once it has.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if deleting && !finalizers.iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    // The version a write of the pool's spec is made against (the finalizer's write makes a
    // new one).
    let mut version = pool.resource_version();
    if !deleting && !finalizers.iter().any(|f| f == FINALIZER) {
        let mut list = finalizers.to_vec();
        list.push(FINALIZER.into());
        let patch = json!({"metadata": {"finalizers": list, "resourceVersion": version}});
        let patched = pools
            .patch(&name, &params(), &Patch::Merge(patch))
            .await
            .map_err(kube_error("the pool's finalizer"))?;
        version = patched.resource_version();
    }

    let now = Timestamp::now();
    let hash = template_hash(&pool.spec.template);
    // Members as the cache has them; those being deleted are gone as far as planning goes.
    let all: Vec<Arc<Proxy>> = ctx.cache.store().state();
    let mine: Vec<&Proxy> = all
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|p| p.pool().is_some_and(|m| m.pool_uid == uid))
        .collect();
    let by_name: HashMap<String, &Proxy> = mine.iter().map(|p| (p.name_any(), *p)).collect();
    {
        let mut expected = ctx.expected.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = expected.get(&uid) {
            let waited = e.since.is_some_and(|s| s.elapsed() >= EXPECTATION_TTL);
            if !e.seen_in(pool, &by_name) && !waited {
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            if waited && !e.seen_in(pool, &by_name) {
                tracing::info!("the cache did not show this pool's last writes in time; planning on what it shows");
            }
            expected.remove(&uid);
        }
    }
    let going = mine.iter().filter(|p| p.metadata.deletion_timestamp.is_some()).count();
    let live: Vec<&Proxy> = mine
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();

    // A draining member without its start time (labelled by hand) gets one now.
    for p in &live {
        if p.pool().is_some_and(|m| m.role == PoolRole::Draining)
            && !p.annotations().contains_key(ANNOTATION_DRAINING_SINCE)
        {
            let patch = json!({"metadata": {"annotations": {ANNOTATION_DRAINING_SINCE: now.to_string()}}});
            proxies
                .patch(&p.name_any(), &params(), &Patch::Merge(patch))
                .await
                .map_err(kube_error("a member's draining time"))?;
        }
    }
    let ids: Vec<String> = live.iter().map(|p| format!("{namespace}/{}", p.name_any())).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let pool_labels = PoolLabels {
        namespace: namespace.clone(),
        pool: name.clone(),
    };
    let (leases, leases_known): (Vec<usize>, bool) = match ctx.store.active_leases(&id_refs).await {
        Ok(l) => (l, true),
        Err(e) => {
            // Unknown leases: count one each, so no draining member goes before its timeout.
            tracing::info!(error = %e, "reading the members' leases failed; assuming each holds one");
            (vec![1; ids.len()], false)
        }
    };
    let policy = pool.spec.autoscale.as_ref().map(Policy::from_spec).transpose();
    let asked = desired(&pool.spec, deleting).and_then(|d| policy.clone().map(|_| d));
    let look = Look {
        hash: &hash,
        now,
        grace: asked.as_ref().map_or(DEFAULT_STARTUP_GRACE, |d| d.startup_grace),
    };
    let watched = watch_members(ctx, pool, &live, &leases, &look);
    let members = watched.members;

    let leased: i64 = members.iter().map(|(_, m)| i64::from(m.leases)).sum();
    if leases_known {
        let capacity: i64 = members
            .iter()
            .filter(|(_, m)| m.role == PoolRole::Active && m.ready)
            .map(|(p, _)| i64::from(p.spec.effective_max_leases().max(0)))
            .sum();
        ctx.metrics.leases.get_or_create(&pool_labels).set(leased);
        ctx.metrics.capacity.get_or_create(&pool_labels).set(capacity);
    }

    let generation = pool.metadata.generation;
    let now_time = Time(now);
    let mut status = counts(&members);
    status.failed_creations = i32::try_from(watched.backoff.failed_creations).unwrap_or(i32::MAX);
    status.observed_generation = generation;
    status.selector = format!("{LABEL_POOL}={name}");
    status.conditions = pool.status.clone().unwrap_or_default().conditions;

    let mut desired = match asked {
        Ok(d) => d,
        Err(why) => {
            crate::conditions::set_condition(
                &mut status.conditions,
                "ReplicaFailure",
                ConditionStatus::True,
                "InvalidSpec",
                &why,
                generation,
                &now_time,
            );
            flush_status(&pools, pool, &status).await?;
            return Ok(Action::await_change());
        }
    };
    if name.len() > MAX_LABEL_VALUE {
        let why = format!(
            "the pool's name is {} characters; a member carries it as a label value, at most {MAX_LABEL_VALUE}",
            name.len()
        );
        crate::conditions::set_condition(
            &mut status.conditions,
            "ReplicaFailure",
            ConditionStatus::True,
            "InvalidName",
            &why,
            generation,
            &now_time,
        );
        flush_status(&pools, pool, &status).await?;
        return Ok(Action::await_change());
    }

    let reference = kube::Resource::object_ref(pool, &());
    let mut events = watched.events;
    let gate = gate(ctx, pool, &desired, &members, now, &mut status, &mut events);
    ctx.metrics
        .record_remediation(&pool_labels, &gate, &watched.backoff, now);
    let mut wrote = Expected::default();
    let key = format!("{namespace}/{name}");
    let autoscaled = match policy {
        Ok(Some(policy)) if !deleting => {
            if let Some(r) = &ctx.refusals {
                r.watch_pool(&key, &name, &pool.spec.template.spec.attributes);
            }
            // With the leases unknown there is nothing to go on: no look, and nothing forgotten.
            // While failed members are not replaced, the pool does not grow either.
            (leases_known && gate.allows())
                .then(|| autoscale(ctx, pool, &policy, &members, u64::try_from(leased).unwrap_or(0)))
                .flatten()
        }
        _ => {
            forget_autoscale(ctx, &uid, &key);
            None
        }
    };
    if let Some((replicas, note)) = autoscaled {
        let patch = json!({"metadata": {"resourceVersion": version}, "spec": {"replicas": replicas}});
        let patched = pools
            .patch(&name, &params(), &Patch::Merge(patch))
            .await
            .map_err(kube_error("the pool's replicas"))?;
        written(ctx, &uid, desired.replicas, replicas, Instant::now());
        wrote.pool_generation = patched.metadata.generation;
        let direction = if replicas > desired.replicas { "up" } else { "down" };
        ctx.metrics
            .scaled
            .get_or_create(&ScaleLabels {
                namespace: namespace.clone(),
                pool: name.clone(),
                direction,
            })
            .inc();
        // Posted now: a later step that fails must not lose the record of a write made.
        events::post(
            &ctx.client,
            &ctx.instance,
            &reference,
            &namespace,
            &Event::normal("Scaled", note),
        )
        .await;
        desired.replicas = replicas;
    }

    let mut decided: Plan = plan(
        &desired,
        &members.iter().map(|(_, m)| m.clone()).collect::<Vec<_>>(),
        gate.allows(),
    );
    // Look again when a member's grace ends, and when the gate may open by itself.
    for after in [watched.next_judgement, gate.wait()].into_iter().flatten() {
        decided.recheck_in(after);
    }
    span.record("pool.steps", decided.steps.len());
    let writer = Writer {
        ctx,
        pool,
        proxies: &proxies,
        hash: &hash,
        labels: &pool_labels,
        members: members.iter().map(|(_, m)| (m.name.as_str(), m)).collect(),
        desired: &desired,
        deleting,
        now,
    };
    writer.perform(&decided.steps, &mut wrote, &mut events).await?;
    let more = decided.steps.len() > MAX_WRITES;
    let settled = decided.steps.is_empty() && at_rest(&desired, &members);
    if !decided.steps.is_empty() || wrote.pool_generation.is_some() {
        wrote.since = Some(Instant::now());
        ctx.expected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.clone(), wrote);
    }
    for e in &events {
        events::post(&ctx.client, &ctx.instance, &reference, &namespace, e).await;
    }

    let failure = ctx
        .create_failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&uid)
        .cloned();
    set_conditions(
        &mut status,
        &desired,
        settled,
        failure.as_deref(),
        generation,
        &now_time,
    );
    flush_status(&pools, pool, &status).await?;

    if deleting && live.is_empty() && going > 0 {
        // The last members' instances are going; the pool goes after them. (Their removal
        // brings no event the pool sees, so it looks again shortly.)
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if deleting && live.is_empty() {
        let kept: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        let patch = json!({"metadata": {"finalizers": kept}});
        match pools.patch(&name, &params(), &Patch::Merge(patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(PoolError::Kube {
                    what: "the pool's finalizer",
                    source,
                });
            }
        }
        ctx.expected.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
        // A pool that is gone keeps no series.
        ctx.metrics.leases.remove(&pool_labels);
        ctx.metrics.capacity.remove(&pool_labels);
        ctx.create_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
        forget_autoscale(ctx, &uid, &key);
        ctx.watches.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
        ctx.metrics.forget_remediation(&pool_labels);
        return Ok(Action::await_change());
    }
    let draining_with_leases = members
        .iter()
        .any(|(_, m)| m.role == PoolRole::Draining && m.leases > 0);
    let mut next = decided.recheck.unwrap_or(RESYNC).min(RESYNC);
    if draining_with_leases {
        next = next.min(DRAIN_POLL);
    }
    if pool.spec.autoscale.is_some() {
        next = next.min(AUTOSCALE_PERIOD);
    }
    if more {
        next = Duration::from_millis(200);
    }
    Ok(Action::requeue(next))
}

/// What a pass's steps are written with: each step is one write to the API server.
struct Writer<'a> {
    ctx: &'a PoolContext,
    pool: &'a ProxyPool,
    proxies: &'a Api<Proxy>,
    hash: &'a str,
    labels: &'a PoolLabels,
    /// The members as planned on, by name.
    members: HashMap<&'a str, &'a Member>,
    desired: &'a Desired,
    deleting: bool,
    now: Timestamp,
}

impl Writer<'_> {
    /// Performs the first [`MAX_WRITES`] of `steps`, noting in `wrote` what the cache should show
    /// next and in `events` what happened. A create the API server refuses is kept for
    /// `ReplicaFailure` and the other steps go on (a promotion must not wait for it).
    async fn perform(&self, steps: &[Step], wrote: &mut Expected, events: &mut Vec<Event>) -> Result<(), PoolError> {
        let mut create_failed = false;
        for step in steps.iter().take(MAX_WRITES) {
            match step {
                Step::Create(role) => match self.create(*role).await {
                    Ok((name, event)) => {
                        events.push(event);
                        wrote.created.push(name);
                    }
                    Err(why) => {
                        if !create_failed {
                            events.push(Event::warning("MemberCreateFailed", why));
                        }
                        create_failed = true;
                    }
                },
                Step::Promote(member) => {
                    if let Some(event) = self.promote(member).await? {
                        events.push(event);
                        wrote.roles.push((member.clone(), PoolRole::Active));
                    }
                }
                Step::Drain(member) => {
                    if let Some(event) = self.drain(member).await? {
                        events.push(event);
                        wrote.roles.push((member.clone(), PoolRole::Draining));
                    }
                }
                Step::Delete(member) => {
                    events.push(self.delete(member).await?);
                    wrote.deleted.push(member.clone());
                }
            }
        }
        Ok(())
    }

    /// A new member in `role`: its name and Event, or why the API server refused it.
    async fn create(&self, role: PoolRole) -> Result<(String, Event), String> {
        let uid = self.pool.uid().unwrap_or_default();
        let failures = &self.ctx.create_failures;
        match self
            .proxies
            .create(&post_params(), &new_member(self.pool, role, self.hash))
            .await
        {
            Ok(made) => {
                failures.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
                self.ctx
                    .metrics
                    .creates
                    .get_or_create(&CreateLabels {
                        namespace: self.labels.namespace.clone(),
                        pool: self.labels.pool.clone(),
                        role: role.as_str(),
                    })
                    .inc();
                let note = format!("created {} member {}", role.as_str(), made.name_any());
                Ok((made.name_any(), Event::normal("MemberCreated", note)))
            }
            Err(e) => {
                let why = format!("creating a member: {e}");
                failures
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(uid, why.clone());
                Err(why)
            }
        }
    }

    /// A standby made active; its Event, none when it is gone already.
    async fn promote(&self, member: &str) -> Result<Option<Event>, PoolError> {
        let patch = json!({"metadata": {
            "labels": {LABEL_POOL_ROLE: PoolRole::Active.as_str()},
            "annotations": {ANNOTATION_DRAINING_SINCE: null}}});
        if !patch_member(self.proxies, member, patch).await? {
            return Ok(None);
        }
        self.ctx.metrics.promotions.get_or_create(self.labels).inc();
        Ok(Some(Event::normal(
            "Promoted",
            format!("standby {member} now takes leases"),
        )))
    }

    /// A member drained; its Event, none when it is gone already.
    async fn drain(&self, member: &str) -> Result<Option<Event>, PoolError> {
        let reason = self
            .members
            .get(member)
            .map_or("scale_down", |m| drain_reason(m, self.desired, self.deleting));
        let patch = json!({"metadata": {
            "labels": {LABEL_POOL_ROLE: PoolRole::Draining.as_str()},
            "annotations": {ANNOTATION_DRAINING_SINCE: self.now.to_string()}}});
        if !patch_member(self.proxies, member, patch).await? {
            return Ok(None);
        }
        self.ctx
            .metrics
            .drains
            .get_or_create(&DrainLabels {
                namespace: self.labels.namespace.clone(),
                pool: self.labels.pool.clone(),
                reason,
            })
            .inc();
        let note = format!(
            "{member} gets no new leases ({}); it goes when its leases end, at most {}s from now",
            reason.replace('_', " "),
            self.desired.drain_timeout.as_secs()
        );
        Ok(Some(Event::normal("Draining", note)))
    }

    /// A member deleted (or gone already); its Event, with why a draining one went.
    async fn delete(&self, member: &str) -> Result<Event, PoolError> {
        match self.proxies.delete(member, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(PoolError::Kube {
                    what: "a member's delete",
                    source,
                });
            }
        }
        let why = match self.members.get(member) {
            Some(m) if m.role == PoolRole::Draining && m.leases == 0 => " (its leases ended)",
            Some(m) if m.role == PoolRole::Draining => " (its drain timeout passed)",
            _ => "",
        };
        Ok(Event::normal("MemberDeleted", format!("deleted member {member}{why}")))
    }
}

/// The autoscaler's look at a pool: the number of members its load wants now, and the Event's
/// note, when that differs from `spec.replicas`. Remembers the low run and the last raise.
fn autoscale(
    ctx: &PoolContext,
    pool: &ProxyPool,
    policy: &Policy,
    members: &[(&Proxy, Member)],
    leases: u64,
) -> Option<(u32, String)> {
    let uid = pool.uid().unwrap_or_default();
    let key = format!("{}/{}", pool.namespace().unwrap_or_default(), pool.name_any());
    let current = u32::try_from(pool.spec.replicas).unwrap_or(0);
    let now = Instant::now();
    let ready_actives = members
        .iter()
        .filter(|(_, m)| m.role == PoolRole::Active && m.ready && !m.failed)
        .count();
    let complete = ready_actives >= current as usize;
    let mut memory = ctx.autoscale.lock().unwrap_or_else(|p| p.into_inner());
    let memory = memory.entry(uid).or_default();
    if !complete {
        memory.incomplete = true;
    } else if std::mem::take(&mut memory.incomplete) {
        memory.complete_since = Some(now);
    }
    // Refusals count from the latest of: the window's start, the last raise (they made it),
    // and the look that found the pool complete again (those made while members were on
    // their way were waited out, not answered with more). While incomplete they do not count
    // at all (`Load::complete`).
    let window = now.checked_sub(REFUSAL_WINDOW).unwrap_or(now);
    let since = [memory.last_up, memory.complete_since]
        .into_iter()
        .flatten()
        .fold(window, Instant::max);
    let refusals = ctx.refusals.as_ref().map_or(0, |r| r.count_since(&key, since));
    let load = Load {
        leases,
        per_member: u32::try_from(pool.spec.template.spec.effective_max_leases()).unwrap_or(0),
        refusals,
        complete,
    };
    let recommendation = recommend(policy, current, &load);
    let scaled = scale(policy, current, recommendation, memory.low, now);
    if scaled.replicas == current {
        memory.low = scaled.low;
        return None;
    }
    // A change is remembered once it is written ([`written`]): a write that fails (a conflict
    // with a newer pool) leaves the next look the same refusals and the same low run.
    let note = format!(
        "autoscale: {current} → {} members ({} active leases, {} each at most, target {}%; {} lease requests refused)",
        scaled.replicas, load.leases, load.per_member, policy.target_utilization, load.refusals
    );
    Some((scaled.replicas, note))
}

/// What this leader has seen of one pool's members' health, and announced of it.
#[derive(Debug, Default)]
struct HealthWatch {
    watch: Watch,
    /// The reason of the `RemediationAllowed` condition last announced with an Event.
    announced: Option<String>,
}

impl HealthWatch {
    /// A pool this leader has not looked at yet: its backoff and announced condition as its
    /// status has them, so a new leader neither forgets a backoff nor announces it again.
    fn from_status(status: Option<&ProxyPoolStatus>) -> Self {
        let Some(status) = status else {
            return Self::default();
        };
        let announced = status
            .conditions
            .iter()
            .find(|c| c.type_ == remediation::CONDITION)
            .map(|c| c.reason.clone());
        let backoff = Backoff {
            failed_creations: u32::try_from(status.failed_creations).unwrap_or(0),
            not_before: status.next_replacement_time.as_ref().map(|t| t.0),
        };
        Self {
            // Stopped, or recovering from it: the new leader's hold starts when it finds the
            // failure over.
            watch: Watch::resuming(
                backoff,
                matches!(announced.as_deref(), Some("TooManyUnhealthy" | "Recovering")),
            ),
            announced,
        }
    }
}

/// A pass's members as judged, and what their health changed.
struct Watched<'a> {
    members: Vec<(&'a Proxy, Member)>,
    backoff: Backoff,
    /// When the soonest member failing within its grace comes to be judged.
    next_judgement: Option<Duration>,
    /// A Warning naming the members this pass found never Ready within their grace.
    events: Vec<Event>,
}

/// Judges the pool's `live` members (with their `leases`) with what this leader remembers of
/// them, and notes the pass in its [`Watch`]: the failed creations it counts lengthen the
/// pool's backoff, and a member that becomes Ready ends it.
fn watch_members<'a>(
    ctx: &PoolContext,
    pool: &ProxyPool,
    live: &[&'a Proxy],
    leases: &[usize],
    look: &Look<'_>,
) -> Watched<'a> {
    let uid = pool.uid().unwrap_or_default();
    let mut watches = ctx.watches.lock().unwrap_or_else(|p| p.into_inner());
    let watch = &mut watches
        .entry(uid)
        .or_insert_with(|| HealthWatch::from_status(pool.status.as_ref()))
        .watch;
    let mut members = Vec::with_capacity(live.len());
    let mut healths = Vec::with_capacity(live.len());
    for (p, n) in live.iter().zip(leases) {
        let Some(membership) = p.pool() else { continue };
        let proven = watch.proven(&p.name_any());
        healths.push(health(p, proven, look.now));
        let m = member(p, membership.role, u32::try_from(*n).unwrap_or(u32::MAX), proven, look);
        members.push((*p, m));
    }
    let observed: Vec<Observed<'_>> = members
        .iter()
        .zip(&healths)
        .map(|((_, m), h)| Observed::of(m, h))
        .collect();
    let never_ready = watch.observe(&observed, look.now);
    let backoff = watch.backoff();
    let mut events = Vec::new();
    if !never_ready.is_empty() {
        events.push(Event::warning(
            "MemberNeverReady",
            format!(
                "{} never became Ready within startupGrace {}s; {} failed creations in a row: the next member is made after {}s",
                never_ready.join(", "),
                look.grace.as_secs(),
                backoff.failed_creations,
                remediation::delay(backoff.failed_creations).as_secs()
            ),
        ));
    }
    Watched {
        members,
        backoff,
        next_judgement: remediation::next_judgement(&healths, look.grace),
        events,
    }
}

/// Whether the pass may replace failed members and make new ones: the gate, written into
/// `status` (`RemediationAllowed` and the counts), with its Event when it changed.
fn gate(
    ctx: &PoolContext,
    pool: &ProxyPool,
    desired: &Desired,
    members: &[(&Proxy, Member)],
    now: Timestamp,
    status: &mut ProxyPoolStatus,
    events: &mut Vec<Event>,
) -> Gate {
    let uid = pool.uid().unwrap_or_default();
    let list: Vec<Member> = members.iter().map(|(_, m)| m.clone()).collect();
    let share = share(desired.max_unhealthy, &list);
    let (gate, backoff) = {
        let mut watches = ctx.watches.lock().unwrap_or_else(|p| p.into_inner());
        let watch = &mut watches.entry(uid.clone()).or_default().watch;
        (watch.gate(share, desired.startup_grace, now), watch.backoff())
    };
    let condition = remediation_condition(&gate, desired, &backoff, probe_target_note(ctx, pool));
    events.extend(gate_event(ctx, &uid, &gate, &condition));
    set_remediation(
        status,
        &gate,
        &condition,
        &backoff,
        pool.metadata.generation,
        &Time(now),
    );
    gate
}

/// What fetching the probe target directly found, for a pool whose members probe it.
fn probe_target_note(ctx: &PoolContext, pool: &ProxyPool) -> Option<String> {
    let target = ctx.probe_target.as_ref()?;
    let url = pool
        .spec
        .template
        .spec
        .health_check
        .as_ref()
        .and_then(|h| h.url.as_deref());
    target.note_for(url.unwrap_or(target.url()))
}

/// The Event of a change of the `RemediationAllowed` condition, once per change: a Warning when
/// too many members have failed for any to be replaced, a Normal one when that and the
/// recovery after it end. (A backoff is announced by its `MemberNeverReady` Warning.)
fn gate_event(
    ctx: &PoolContext,
    uid: &str,
    gate: &Gate,
    (_, reason, message): &(ConditionStatus, &'static str, String),
) -> Option<Event> {
    let message = message.clone();
    let mut watches = ctx.watches.lock().unwrap_or_else(|p| p.into_inner());
    let watch = watches.get_mut(uid)?;
    let before = watch.announced.replace((*reason).to_owned());
    // Stopped, and not yet announced as resumed (a recovery after it included).
    let was_stopped = matches!(before.as_deref(), Some("TooManyUnhealthy" | "Recovering"));
    match gate {
        Gate::TooManyUnhealthy(_) if !was_stopped => Some(Event::warning("RemediationStopped", message)),
        Gate::Allowed(_) if was_stopped => Some(Event::normal("RemediationResumed", message)),
        _ => None,
    }
}

/// Forgets a pool's autoscale: its memory, and its refusals' count.
fn forget_autoscale(ctx: &PoolContext, uid: &str, key: &str) {
    ctx.autoscale.lock().unwrap_or_else(|p| p.into_inner()).remove(uid);
    if let Some(r) = &ctx.refusals {
        r.forget_pool(key);
    }
}

/// Remembers that the autoscaler wrote `replicas` over `before` (`now`): a low run ends, and a
/// raise answers the refusals before it.
fn written(ctx: &PoolContext, uid: &str, before: u32, replicas: u32, now: Instant) {
    let mut memory = ctx.autoscale.lock().unwrap_or_else(|p| p.into_inner());
    let memory = memory.entry(uid.to_owned()).or_default();
    memory.low = None;
    if replicas > before {
        memory.last_up = Some(now);
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Patches a member's metadata; `false` when it is gone already.
async fn patch_member(api: &Api<Proxy>, name: &str, patch: serde_json::Value) -> Result<bool, PoolError> {
    match api.patch(name, &params(), &Patch::Merge(patch)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(source) => Err(PoolError::Kube {
            what: "a member's role",
            source,
        }),
    }
}

/// Writes the pool's status when it changed (a merge patch against the one read).
async fn flush_status(api: &Api<ProxyPool>, pool: &ProxyPool, status: &ProxyPoolStatus) -> Result<(), PoolError> {
    let before = serde_json::to_value(pool.status.clone().unwrap_or_default()).unwrap_or_default();
    let after = serde_json::to_value(status).unwrap_or_default();
    if before == after {
        return Ok(());
    }
    let patch = json!({"status": crate::merge::diff(&before, &after)});
    match api
        .patch_status(&pool.name_any(), &params(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(PoolError::Kube {
            what: "the pool's status",
            source,
        }),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::Condition;

    /// A status whose `RemediationAllowed` condition has `reason`.
    fn status_with(reason: &str) -> ProxyPoolStatus {
        ProxyPoolStatus {
            conditions: vec![Condition {
                type_: remediation::CONDITION.into(),
                status: ConditionStatus::False,
                observed_generation: None,
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                reason: reason.into(),
                message: String::new(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_new_leader_holds_a_recovery_it_finds_stopped_or_under_way() {
        let grace = Duration::from_secs(60);
        let within = remediation::Share {
            failed: 1,
            members: 6,
            allowed: 2,
        };
        let now = Timestamp::UNIX_EPOCH;
        for (reason, holds) in [("TooManyUnhealthy", true), ("Recovering", true), ("BackingOff", false)] {
            let mut watch = HealthWatch::from_status(Some(&status_with(reason))).watch;
            let gate = watch.gate(within, grace, now);
            assert_eq!(gate.wait().is_some(), holds, "{reason}: {gate:?}");
            assert_eq!(
                HealthWatch::from_status(Some(&status_with(reason)))
                    .announced
                    .as_deref(),
                Some(reason)
            );
        }
    }
}
