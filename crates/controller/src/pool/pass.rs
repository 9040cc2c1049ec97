//! One pass over one ProxyPool (docs/pools.md#the-controller): it reads the pool's members from
//! the operator's Proxy cache and their leases from the lease store, runs the pure decision of
//! [`crate::pool::decide`], performs each step as one write to the API server
//! ([`crate::pool::writes`]) and flushes the pool's status. No step calls a backend: the Proxy
//! reconciler provisions each member as it provisions any Proxy.
//!
//! A pass, in the order of [`pass`]: the pool's finalizer; its members as the cache shows them,
//! once it shows the last pass's writes; a start time on draining members that lack one; their
//! leases; each member judged (`pool::watch`); the spec checked; the remediation gate;
//! the autoscaler's look; the plan and its writes; the Events; the status; and, for a pool
//! being deleted, its finalizer released once its members are gone.
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_api::{
    ANNOTATION_DRAINING_SINCE, ConditionStatus, FINALIZER, LABEL_POOL, PoolRole, Proxy, ProxyPool, ProxyPoolStatus,
};
use egress_discovery::Refusals;
use egress_lease::LeaseStore;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use crate::conditions::set_condition;
use crate::events::{self, Event};
use crate::exit_policy::ExitPolicy;
use crate::identity::{reconcile_id, reporting_instance};
use crate::pool::autoscale::Policy;
use crate::pool::autoscaler::Autoscaler;
use crate::pool::decide::{Desired, Plan, plan};
use crate::pool::member::Member;
use crate::pool::metrics::{PoolLabels, PoolMetrics, ScaleLabels};
use crate::pool::remediation::{DEFAULT_STARTUP_GRACE, Gate};
use crate::pool::shared_exit;
use crate::pool::view::{Look, at_rest, counts, desired, set_conditions, template_hash};
use crate::pool::watch::{HealthWatches, Watched};
use crate::pool::writes::{CreateFailures, Expected, MAX_WRITES, PoolError, Writer, kube_error, params};
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
/// While the cache does not show the last pass's writes, the pool is looked at again this soon.
const EXPECTATION_POLL: Duration = Duration::from_millis(200);
/// A pass with more steps than it may write looks again this soon for the rest.
const MORE_WRITES: Duration = Duration::from_millis(200);
/// A pool with `spec.autoscale` is looked at this often: its lease load is sampled then (a
/// refused request that concerns it brings the look sooner).
pub const AUTOSCALE_PERIOD: Duration = Duration::from_secs(5);
/// A pool being deleted whose members' instances are going (or that waits for the garbage
/// collector to free them) is looked at again this soon: their removal brings it no event.
const RELEASE_POLL: Duration = Duration::from_secs(1);
/// The finalizer the API server sets on an object deleted with `--cascade=orphan` until its
/// dependents are released.
const ORPHAN_FINALIZER: &str = "orphan";
/// The longest label value: a pool's name is one on each member.
const MAX_LABEL_VALUE: usize = 63;

/// What every pool pass shares.
pub struct PoolContext {
    pub client: Client,
    pub cache: ProxyCache,
    pub store: Arc<dyn LeaseStore>,
    pub metrics: PoolMetrics,
    /// Refused lease requests, counted by the discovery API (`None`: it is not served, and
    /// autoscale sizes pools by utilisation alone).
    pub(crate) refusals: Option<Arc<Refusals>>,
    /// The reporting instance of its Events.
    instance: String,
    expected: Mutex<HashMap<String, Expected>>,
    create_failures: CreateFailures,
    /// What the autoscaler remembers of each pool.
    autoscaler: Autoscaler,
    /// What this leader has seen of each pool's members' health.
    watches: HealthWatches,
    /// The operator's probe target as it answers the operator directly, when it is fetched.
    probe_target: Option<ProbeTarget>,
    /// Whether members whose exit was found wanting are kept from leases, and so replaced.
    exit_policy: ExitPolicy,
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
            create_failures: CreateFailures::default(),
            autoscaler: Autoscaler::default(),
            watches: HealthWatches::default(),
            probe_target: None,
            exit_policy: ExitPolicy::default(),
        }
    }

    /// Replaces members the discovery API does not offer for their exit under `policy`
    /// (`--exit-policy`): they are failed members to the pool.
    #[must_use]
    pub fn with_exit_policy(mut self, policy: ExitPolicy) -> Self {
        self.exit_policy = policy;
        self
    }

    /// Tells pools that stop remediation what fetching `target` directly found.
    #[must_use]
    pub fn with_probe_target(mut self, target: ProbeTarget) -> Self {
        self.probe_target = Some(target);
        self
    }
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

/// The steps of one pass, each a method of [`Pass`] (or of the health watch, the plan and the
/// writer it hands on to), in the order the module's documentation gives.
async fn pass(pool: &ProxyPool, ctx: &PoolContext, span: &tracing::Span) -> Result<Action, PoolError> {
    let p = Pass::new(ctx, pool);
    let version = match p.hold().await? {
        Held::Go(version) => version,
        Held::Stop(action) => return Ok(action),
    };
    let cached = ctx.cache.store().state();
    let Some(found) = p.members(&cached) else {
        return Ok(Action::requeue(EXPECTATION_POLL));
    };
    p.stamp_draining(&found.live).await?;
    let (leases, leases_known) = p.leases(&found.live).await;
    let hash = template_hash(&pool.spec.template);
    let policy = pool.spec.autoscale.as_ref().map(Policy::from_spec).transpose();
    let asked = desired(&pool.spec, p.deleting).and_then(|d| policy.clone().map(|_| d));
    let exit_holders = shared_exit::holders(&found.live, cached.iter().map(AsRef::as_ref));
    let look = Look {
        hash: &hash,
        now: p.now,
        grace: asked.as_ref().map_or(DEFAULT_STARTUP_GRACE, |d| d.startup_grace),
        exit_policy: ctx.exit_policy,
        exit_holders: &exit_holders,
    };
    let mut watched = ctx.watches.judge(pool, &found.live, &leases, &look);
    let leased = p.record_leases(&watched.members, leases_known);
    let mut status = p.status(&watched);
    let mut desired = match p.valid(asked) {
        Ok(d) => d,
        Err((reason, why)) => return p.refuse(&mut status, reason, &why).await,
    };
    let (gate, gate_event) = ctx.watches.gate(
        pool,
        &desired,
        &watched.members,
        probe_target_note(ctx, pool),
        p.now,
        &mut status,
    );
    let mut events = std::mem::take(&mut watched.events);
    events.extend(gate_event);
    ctx.metrics
        .record_remediation(&p.labels, &gate, &watched.backoff, p.now);
    let mut wrote = Expected::default();
    let policy = policy.ok().flatten();
    if let Some((replicas, note)) = p.autoscaled(policy.as_ref(), &gate, &watched.members, leases_known, leased) {
        wrote.pool_generation = p.write_replicas(replicas, note, version, desired.replicas).await?;
        desired.replicas = replicas;
    }
    let decided = planned(&desired, &watched, &gate);
    span.record("pool.steps", decided.steps.len());
    p.writer(&desired, &hash, &watched.members)
        .perform(&decided.steps, &mut wrote, &mut events)
        .await?;
    p.expect(&decided, wrote);
    for e in &events {
        p.post(e).await;
    }
    let settled = decided.steps.is_empty() && at_rest(&desired, &watched.members);
    p.conclude(&mut status, &desired, settled).await?;
    if p.deleting && found.live.is_empty() {
        return p.release(found.going).await;
    }
    Ok(Action::requeue(next_look(pool, &decided, &watched.members)))
}

/// Whether a pass goes on after [`Pass::hold`], and with which version of the pool.
enum Held {
    /// On, writing the pool's spec against this resourceVersion.
    Go(Option<String>),
    /// Done: the pool is being deleted and its finalizer is gone, or the garbage collector
    /// still has to free its members.
    Stop(Action),
}

/// A pool's members as the cache shows them.
struct Found<'a> {
    /// Those not being deleted: the ones the pass plans with.
    live: Vec<&'a Proxy>,
    /// Those being deleted.
    going: usize,
}

/// One pass over one pool: what it acts with.
struct Pass<'a> {
    ctx: &'a PoolContext,
    pool: &'a ProxyPool,
    namespace: String,
    name: String,
    uid: String,
    /// `<namespace>/<name>`, as refusals and the autoscaler key the pool.
    key: String,
    pools: Api<ProxyPool>,
    proxies: Api<Proxy>,
    deleting: bool,
    labels: PoolLabels,
    /// When the pass started.
    now: Timestamp,
}

impl<'a> Pass<'a> {
    fn new(ctx: &'a PoolContext, pool: &'a ProxyPool) -> Self {
        let namespace = pool.namespace().unwrap_or_default();
        let name = pool.name_any();
        Self {
            ctx,
            pool,
            uid: pool.uid().unwrap_or_default(),
            key: format!("{namespace}/{name}"),
            pools: Api::namespaced(ctx.client.clone(), &namespace),
            proxies: Api::namespaced(ctx.client.clone(), &namespace),
            deleting: pool.metadata.deletion_timestamp.is_some(),
            labels: PoolLabels {
                namespace: namespace.clone(),
                pool: name.clone(),
            },
            namespace,
            name,
            now: Timestamp::now(),
        }
    }

    /// The pool's finalizer: put on a pool that lacks it, which gives the version its spec is
    /// written against. A pool being deleted without it is done with; one deleted with
    /// `--cascade=orphan` waits for the garbage collector to free its members, which stay as
    /// plain Proxies (the pool's own finalizer goes once it has).
    async fn hold(&self) -> Result<Held, PoolError> {
        let finalizers = self.pool.finalizers();
        if self.deleting && finalizers.iter().any(|f| f == ORPHAN_FINALIZER) {
            return Ok(Held::Stop(Action::requeue(RELEASE_POLL)));
        }
        let held = finalizers.iter().any(|f| f == FINALIZER);
        if self.deleting && !held {
            return Ok(Held::Stop(Action::await_change()));
        }
        let version = self.pool.resource_version();
        if self.deleting || held {
            return Ok(Held::Go(version));
        }
        let mut list = finalizers.to_vec();
        list.push(FINALIZER.into());
        let patch = json!({"metadata": {"finalizers": list, "resourceVersion": version}});
        let patched = self
            .pools
            .patch(&self.name, &params(), &Patch::Merge(patch))
            .await
            .map_err(kube_error("the pool's finalizer"))?;
        Ok(Held::Go(patched.resource_version()))
    }

    /// The pool's members in `cached`, once the cache shows what the last pass wrote (or it has
    /// waited [`EXPECTATION_TTL`] for it); `None` until then.
    fn members<'p>(&self, cached: &'p [Arc<Proxy>]) -> Option<Found<'p>> {
        let mine: Vec<&Proxy> = cached
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| p.namespace().as_deref() == Some(self.namespace.as_str()))
            .filter(|p| p.pool().is_some_and(|m| m.pool_uid == self.uid))
            .collect();
        let by_name: HashMap<String, &Proxy> = mine.iter().map(|p| (p.name_any(), *p)).collect();
        let mut expected = self.ctx.expected.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = expected.get(&self.uid) {
            let waited = e.since.is_some_and(|s| s.elapsed() >= EXPECTATION_TTL);
            if !e.seen_in(self.pool, &by_name) && !waited {
                return None;
            }
            if waited && !e.seen_in(self.pool, &by_name) {
                tracing::info!("the cache did not show this pool's last writes in time; planning on what it shows");
            }
            expected.remove(&self.uid);
        }
        drop(expected);
        // Members being deleted are gone as far as planning goes.
        let going = mine.iter().filter(|p| p.metadata.deletion_timestamp.is_some()).count();
        let live = mine
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        Some(Found { live, going })
    }

    /// A draining member without its start time (labelled by hand) gets one now.
    async fn stamp_draining(&self, live: &[&Proxy]) -> Result<(), PoolError> {
        for p in live {
            if p.pool().is_some_and(|m| m.role == PoolRole::Draining)
                && !p.annotations().contains_key(ANNOTATION_DRAINING_SINCE)
            {
                let patch = json!({"metadata": {"annotations": {ANNOTATION_DRAINING_SINCE: self.now.to_string()}}});
                self.proxies
                    .patch(&p.name_any(), &params(), &Patch::Merge(patch))
                    .await
                    .map_err(kube_error("a member's draining time"))?;
            }
        }
        Ok(())
    }

    /// The `live` members' active leases, and whether the store told them: when it cannot,
    /// each member is taken to hold one, so no draining member goes before its timeout.
    async fn leases(&self, live: &[&Proxy]) -> (Vec<usize>, bool) {
        let ids: Vec<String> = live
            .iter()
            .map(|p| format!("{}/{}", self.namespace, p.name_any()))
            .collect();
        // Where the store keeps each member's leases: by its `pool` attribute.
        let placed: Vec<egress_lease::ProxyRef<'_>> = ids
            .iter()
            .zip(live)
            .map(|(id, p)| egress_lease::ProxyRef {
                id,
                pool: p.spec.attributes.get(egress_lease::POOL_KEY).map(String::as_str),
            })
            .collect();
        match self.ctx.store.active_leases(&placed).await {
            Ok(l) => (l, true),
            Err(e) => {
                tracing::info!(error = %e, "reading the members' leases failed; assuming each holds one");
                (vec![1; ids.len()], false)
            }
        }
    }

    /// The members' leases in all, recorded with the capacity of the Ready active ones when the
    /// store told them.
    fn record_leases(&self, members: &[(&Proxy, Member)], known: bool) -> i64 {
        let leased: i64 = members.iter().map(|(_, m)| i64::from(m.leases)).sum();
        if known {
            let capacity: i64 = members
                .iter()
                .filter(|(_, m)| m.role == PoolRole::Active && m.ready)
                .map(|(p, _)| i64::from(p.spec.effective_max_leases().max(0)))
                .sum();
            let metrics = &self.ctx.metrics;
            metrics.leases.get_or_create(&self.labels).set(leased);
            metrics.capacity.get_or_create(&self.labels).set(capacity);
        }
        leased
    }

    /// The pool's status from its judged members, its conditions as it has them.
    fn status(&self, watched: &Watched<'_>) -> ProxyPoolStatus {
        let mut status = counts(&watched.members);
        status.failed_creations = i32::try_from(watched.backoff.failed_creations).unwrap_or(i32::MAX);
        status.observed_generation = self.pool.metadata.generation;
        status.selector = format!("{LABEL_POOL}={}", self.name);
        status.conditions = self.pool.status.clone().unwrap_or_default().conditions;
        status
    }

    /// What the pool asks for, or why it cannot be served: the `ReplicaFailure` reason and
    /// message.
    fn valid(&self, asked: Result<Desired, String>) -> Result<Desired, (&'static str, String)> {
        let desired = asked.map_err(|why| ("InvalidSpec", why))?;
        if self.name.len() > MAX_LABEL_VALUE {
            let why = format!(
                "the pool's name is {} characters; a member carries it as a label value, at most {MAX_LABEL_VALUE}",
                self.name.len()
            );
            return Err(("InvalidName", why));
        }
        Ok(desired)
    }

    /// A pool that cannot be served says why (`ReplicaFailure`) and waits for a change.
    async fn refuse(&self, status: &mut ProxyPoolStatus, reason: &str, why: &str) -> Result<Action, PoolError> {
        set_condition(
            &mut status.conditions,
            "ReplicaFailure",
            ConditionStatus::True,
            reason,
            why,
            self.pool.metadata.generation,
            &Time(self.now),
        );
        flush_status(&self.pools, self.pool, status).await?;
        Ok(Action::await_change())
    }

    /// The autoscaler's look, for a pool with a `policy` that is not being deleted: the size
    /// its load asks for and the Event's note, when that is not its size. With the leases
    /// unknown there is nothing to go on: no look, and nothing forgotten. While failed members
    /// are not replaced, the pool does not grow either. A pool without a policy forgets what the
    /// autoscaler remembered of it.
    fn autoscaled(
        &self,
        policy: Option<&Policy>,
        gate: &Gate,
        members: &[(&Proxy, Member)],
        leases_known: bool,
        leased: i64,
    ) -> Option<(u32, String)> {
        match policy {
            Some(policy) if !self.deleting => {
                if let Some(r) = &self.ctx.refusals {
                    r.watch_pool(&self.key, &self.name, &self.pool.spec.template.spec.attributes);
                }
                (leases_known && gate.allows())
                    .then(|| {
                        self.ctx.autoscaler.look(
                            self.pool,
                            policy,
                            members,
                            u64::try_from(leased).unwrap_or(0),
                            self.ctx.refusals.as_deref(),
                        )
                    })
                    .flatten()
            }
            _ => {
                self.ctx
                    .autoscaler
                    .forget(&self.uid, &self.key, self.ctx.refusals.as_deref());
                None
            }
        }
    }

    /// Writes the autoscaler's `replicas` (from `before`) against the pool's `version`, and
    /// posts its `Scaled` Event at once: a later step that fails must not lose the record of a
    /// write made. Returns the pool's generation after it.
    async fn write_replicas(
        &self,
        replicas: u32,
        note: String,
        version: Option<String>,
        before: u32,
    ) -> Result<Option<i64>, PoolError> {
        let patch = json!({"metadata": {"resourceVersion": version}, "spec": {"replicas": replicas}});
        let patched = self
            .pools
            .patch(&self.name, &params(), &Patch::Merge(patch))
            .await
            .map_err(kube_error("the pool's replicas"))?;
        self.ctx.autoscaler.written(&self.uid, before, replicas, Instant::now());
        let direction = if replicas > before { "up" } else { "down" };
        self.ctx
            .metrics
            .scaled
            .get_or_create(&ScaleLabels {
                namespace: self.namespace.clone(),
                pool: self.name.clone(),
                direction,
            })
            .inc();
        self.post(&Event::normal("Scaled", note)).await;
        Ok(patched.metadata.generation)
    }

    /// The writer of this pass's steps, for `desired` and the judged `members`.
    fn writer<'w>(&'w self, desired: &'w Desired, hash: &'w str, members: &'w [(&Proxy, Member)]) -> Writer<'w> {
        Writer {
            metrics: &self.ctx.metrics,
            failures: &self.ctx.create_failures,
            pool: self.pool,
            proxies: &self.proxies,
            hash,
            labels: &self.labels,
            members: members.iter().map(|(_, m)| (m.name.as_str(), m)).collect(),
            desired,
            deleting: self.deleting,
            now: self.now,
        }
    }

    /// Remembers what the pass wrote, for the next one to wait for.
    fn expect(&self, decided: &Plan, mut wrote: Expected) {
        if !decided.steps.is_empty() || wrote.pool_generation.is_some() {
            wrote.since = Some(Instant::now());
            self.ctx
                .expected
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(self.uid.clone(), wrote);
        }
    }

    /// Posts an Event about the pool.
    async fn post(&self, e: &Event) {
        let reference: ObjectReference = kube::Resource::object_ref(self.pool, &());
        events::post(&self.ctx.client, &self.ctx.instance, &reference, &self.namespace, e).await;
    }

    /// The pool's conditions set from what the pass found, and its status written when it
    /// changed.
    async fn conclude(&self, status: &mut ProxyPoolStatus, desired: &Desired, settled: bool) -> Result<(), PoolError> {
        let failure = self.ctx.create_failures.get(&self.uid);
        set_conditions(
            status,
            desired,
            settled,
            failure.as_deref(),
            self.pool.metadata.generation,
            &Time(self.now),
        );
        flush_status(&self.pools, self.pool, status).await
    }

    /// A pool being deleted whose members are all gone or going: once the last members'
    /// instances are gone too, its finalizer goes, and with it all this leader kept of it.
    async fn release(&self, going: usize) -> Result<Action, PoolError> {
        if going > 0 {
            // The last members' instances are going; the pool goes after them. (Their removal
            // brings no event the pool sees, so it looks again shortly.)
            return Ok(Action::requeue(RELEASE_POLL));
        }
        let kept: Vec<&String> = self.pool.finalizers().iter().filter(|f| *f != FINALIZER).collect();
        let patch = json!({"metadata": {"finalizers": kept}});
        match self.pools.patch(&self.name, &params(), &Patch::Merge(patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(PoolError::Kube {
                    what: "the pool's finalizer",
                    source,
                });
            }
        }
        self.ctx
            .expected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.uid);
        // A pool that is gone keeps no series.
        self.ctx.metrics.leases.remove(&self.labels);
        self.ctx.metrics.capacity.remove(&self.labels);
        self.ctx.create_failures.clear(&self.uid);
        self.ctx
            .autoscaler
            .forget(&self.uid, &self.key, self.ctx.refusals.as_deref());
        self.ctx.watches.forget(&self.uid);
        self.ctx.metrics.forget_remediation(&self.labels);
        Ok(Action::await_change())
    }
}

/// The plan for `desired` with the judged members, looking again when a member's grace ends
/// and when the gate may open by itself.
fn planned(desired: &Desired, watched: &Watched<'_>, gate: &Gate) -> Plan {
    let members: Vec<Member> = watched.members.iter().map(|(_, m)| m.clone()).collect();
    let mut decided = plan(desired, &members, gate.allows());
    for after in [watched.next_judgement, gate.wait()].into_iter().flatten() {
        decided.recheck_in(after);
    }
    decided
}

/// When to look at the pool again: when the plan says, at the latest after [`RESYNC`]; every
/// [`DRAIN_POLL`] while a draining member holds a lease, every [`AUTOSCALE_PERIOD`] with
/// autoscale, and at once for the steps beyond [`MAX_WRITES`].
fn next_look(pool: &ProxyPool, decided: &Plan, members: &[(&Proxy, Member)]) -> Duration {
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
    if decided.steps.len() > MAX_WRITES {
        next = MORE_WRITES;
    }
    next
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
