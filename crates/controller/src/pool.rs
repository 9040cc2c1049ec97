//! The ProxyPool controller's I/O shell (docs/pools.md): it reads a pool's members from the
//! operator's Proxy cache and their leases from the lease store, runs the pure decision of
//! [`crate::pool_decide`], performs each step as one write to the API server (a new member, a
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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_api::{
    ANNOTATION_DRAINING_SINCE, API_VERSION, ATTRIBUTE_POOL, ConditionStatus, FINALIZER, LABEL_POOL,
    LABEL_POOL_ROLE, LABEL_POOL_TEMPLATE_HASH, Phase, PoolRole, Proxy, ProxyPool, ProxyPoolSpec, ProxyPoolStatus,
    ProxyTemplate, conditions, reasons,
};
use egress_lease::LeaseStore;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::events::ProxyEvent;
use crate::pool_decide::{Desired, Member, Plan, Step, plan};
use crate::proxy_cache::ProxyCache;
use crate::reconciler::{FIELD_MANAGER, post_event, reconcile_id};

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
/// `drainTimeout` when the pool does not say.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
/// The finalizer the API server sets on an object deleted with `--cascade=orphan` until its
/// dependents are released.
const ORPHAN_FINALIZER: &str = "orphan";
/// The longest label value: a pool's name is one on each member.
const MAX_LABEL_VALUE: usize = 63;

/// The pool's spec with every default applied, or what is wrong with it. A pool being deleted
/// wants no members: they drain, then go.
///
/// # Errors
///
/// A duration the schema let through that Go's parser refuses (an overflow), as `field: why`.
pub fn desired(spec: &ProxyPoolSpec, deleting: bool) -> Result<Desired, String> {
    let duration = |field: &str, text: Option<&str>| {
        text.map(egress_go_decode::parse_duration)
            .transpose()
            .map_err(|e| format!("spec.{field}: {e}"))
    };
    let max_age = duration("maxAge", spec.max_age.as_deref())?;
    let drain_timeout = duration("drainTimeout", spec.drain_timeout.as_deref())?.unwrap_or(DEFAULT_DRAIN_TIMEOUT);
    let strategy = spec.strategy.clone().unwrap_or_default();
    let count = |n: i32| u32::try_from(n).unwrap_or(0);
    Ok(Desired {
        replicas: if deleting { 0 } else { count(spec.replicas) },
        standby: if deleting { 0 } else { count(spec.standby) },
        max_age,
        drain_timeout,
        max_surge: count(strategy.max_surge.unwrap_or(1)),
        max_unavailable: count(strategy.max_unavailable.unwrap_or(0)),
        paused: spec.paused || deleting,
    })
}

/// The template's hash, as the members' [`LABEL_POOL_TEMPLATE_HASH`]: the first 10 hex digits
/// of the SHA-256 of its JSON. Defaults are part of the parsed template, so writing a default
/// out or leaving it implicit makes no rollout.
pub fn template_hash(template: &ProxyTemplate) -> String {
    let digest = Sha256::digest(serde_json::to_vec(template).unwrap_or_default());
    digest[..5].iter().map(|b| format!("{b:02x}")).collect()
}

/// The member Proxy a pool makes in `role`: named `<pool>-<5 random>` by the API server, with
/// the template's labels and annotations plus the pool's, the pool as its controller owner,
/// and the pool's name as the `pool` attribute (over one of the same key in the template).
pub fn new_member(pool: &ProxyPool, role: PoolRole, hash: &str) -> Proxy {
    let name = pool.name_any();
    let template = &pool.spec.template;
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels;
    labels.insert(LABEL_POOL.into(), name.clone());
    labels.insert(LABEL_POOL_TEMPLATE_HASH.into(), hash.into());
    labels.insert(LABEL_POOL_ROLE.into(), role.as_str().into());
    let mut spec = template.spec.clone();
    spec.attributes.insert(ATTRIBUTE_POOL.into(), name.clone());
    Proxy {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: pool.namespace(),
            labels: Some(labels),
            annotations: Some(meta.annotations).filter(|a| !a.is_empty()),
            owner_references: Some(vec![OwnerReference {
                api_version: API_VERSION.into(),
                kind: "ProxyPool".into(),
                name,
                uid: pool.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

/// Whether a member has failed: its proxy failed its probes past the thresholds, its
/// instance is lost, or it failed for good.
fn failed(proxy: &Proxy) -> bool {
    let status = proxy.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    let lost = proxy
        .condition(conditions::PROVISIONED)
        .is_some_and(|c| c.status == ConditionStatus::False && c.reason == reasons::INSTANCE_LOST);
    matches!(phase, Some(Phase::Unhealthy | Phase::Failed)) || lost
}

/// Time between two instants of the API's clock, none if `later` is earlier.
fn since(earlier: Timestamp, later: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or_default()
}

/// One member as the decision sees it.
pub fn member(proxy: &Proxy, role: PoolRole, hash: &str, leases: u32, now: Timestamp) -> Member {
    let created = proxy.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let draining_since = proxy
        .annotations()
        .get(ANNOTATION_DRAINING_SINCE)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .unwrap_or(now);
    Member {
        name: proxy.name_any(),
        role,
        current: proxy.labels().get(LABEL_POOL_TEMPLATE_HASH).map(String::as_str) == Some(hash),
        age: since(created, now),
        ready: proxy.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready),
        failed: failed(proxy),
        leases,
        draining_for: since(draining_since, now),
    }
}

/// The pool's counts from its members as planned on.
pub fn counts(members: &[(&Proxy, Member)]) -> ProxyPoolStatus {
    let n = |f: &dyn Fn(&Proxy, &Member) -> bool| {
        i32::try_from(members.iter().filter(|(p, m)| f(p, m)).count()).unwrap_or(i32::MAX)
    };
    let active = |m: &Member| m.role == PoolRole::Active;
    ProxyPoolStatus {
        replicas: n(&|_, m| active(m)),
        ready_replicas: n(&|_, m| active(m) && m.ready),
        available_replicas: n(&|p, m| active(m) && m.ready && p.spec.effective_max_leases() > 0),
        standby_ready: n(&|_, m| m.role == PoolRole::Standby && m.ready),
        updated_replicas: n(&|_, m| m.role != PoolRole::Draining && m.current),
        ..Default::default()
    }
}

/// The pool's conditions for `status` (its counts set), `desired`, whether the pass still has
/// work, and the last failed create.
fn set_conditions(
    status: &mut ProxyPoolStatus,
    desired: &Desired,
    settled: bool,
    create_failure: Option<&str>,
    generation: Option<i64>,
    now: &Time,
) {
    use crate::status::set_condition;
    let floor = i32::try_from(desired.replicas.saturating_sub(desired.max_unavailable)).unwrap_or(i32::MAX);
    let leasable = status.available_replicas;
    let list = &mut status.conditions;
    let (available, reason) = if leasable >= floor {
        (ConditionStatus::True, "MinimumMembersAvailable")
    } else {
        (ConditionStatus::False, "MinimumMembersUnavailable")
    };
    let message = format!(
        "{leasable} of {} members can be leased (at least {floor} wanted)",
        desired.replicas
    );
    set_condition(list, "Available", available, reason, &message, generation, now);
    let (progressing, reason, message) = match (desired.paused, settled) {
        (true, _) => (ConditionStatus::Unknown, "Paused", "rollouts and rotation are paused"),
        (false, true) => (ConditionStatus::True, "PoolSettled", "every member is up to date"),
        (false, false) => (ConditionStatus::True, "Rolling", "members are being made, promoted or drained"),
    };
    set_condition(list, "Progressing", progressing, reason, message, generation, now);
    match create_failure {
        Some(why) => set_condition(
            list,
            "ReplicaFailure",
            ConditionStatus::True,
            "CreateFailed",
            why,
            generation,
            now,
        ),
        None => set_condition(
            list,
            "ReplicaFailure",
            ConditionStatus::False,
            "NoFailure",
            "",
            generation,
            now,
        ),
    }
}

/// What a pass wrote and waits to see in the cache, per pool UID.
#[derive(Debug, Default)]
struct Expected {
    /// Members made (their names as the API server gave them).
    created: Vec<String>,
    /// Members whose role was changed, and to what.
    roles: Vec<(String, PoolRole)>,
    deleted: Vec<String>,
    since: Option<Instant>,
}

impl Expected {
    fn seen_in(&self, members: &HashMap<String, &Proxy>) -> bool {
        self.created.iter().all(|n| members.contains_key(n))
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

/// The pool controller's counters; the member gauges are read from the cache at scrape time
/// ([`register`]).
#[derive(Clone, Debug, Default)]
pub struct PoolMetrics {
    promotions: Family<PoolLabels, Counter>,
    drains: Family<DrainLabels, Counter>,
    creates: Family<CreateLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    namespace: String,
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DrainLabels {
    namespace: String,
    pool: String,
    /// `failed`, `rotation` (outdated: another template or past `maxAge`), `scale_down`,
    /// `pool_deleted`.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CreateLabels {
    namespace: String,
    pool: String,
    role: &'static str,
}

/// The members of every pool by role and readiness, counted from the cache at scrape time.
#[derive(Debug)]
struct MemberGauges(kube::runtime::reflector::Store<Proxy>);

impl prometheus_client::collector::Collector for MemberGauges {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric as _;
        let mut counts: BTreeMap<(String, String, &'static str, bool), i64> = BTreeMap::new();
        for p in self.0.state() {
            if let Some(m) = p.pool() {
                let key = (
                    p.namespace().unwrap_or_default(),
                    m.pool.to_owned(),
                    m.role.as_str(),
                    p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready),
                );
                *counts.entry(key).or_default() += 1;
            }
        }
        let family = encoder.encode_descriptor(
            "proxy_operator_pool_members",
            "Members of each ProxyPool by role (active, standby, draining) and whether they are Ready.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        let mut family = family;
        for ((namespace, pool, role, ready), n) in counts {
            let labels = [
                ("namespace", namespace),
                ("pool", pool),
                ("role", role.to_owned()),
                ("ready", ready.to_string()),
            ];
            let encoder = family.encode_family(&labels)?;
            prometheus_client::metrics::gauge::ConstGauge::new(n).encode(encoder)?;
        }
        Ok(())
    }
}

impl PoolMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the counters, and the member gauges read from `proxies` at scrape time.
    pub fn register(&self, registry: &mut Registry, proxies: kube::runtime::reflector::Store<Proxy>) {
        registry.register(
            "proxy_operator_pool_promotions",
            "Standbys promoted to active members, by pool.",
            self.promotions.clone(),
        );
        registry.register(
            "proxy_operator_pool_drains",
            "Members drained, by pool and reason (failed, rotation, scale_down, pool_deleted).",
            self.drains.clone(),
        );
        registry.register(
            "proxy_operator_pool_member_creates",
            "Members made, by pool and the role they were made in.",
            self.creates.clone(),
        );
        registry.register_collector(Box::new(MemberGauges(proxies)));
    }
}

/// What every pool pass shares.
pub struct PoolContext {
    pub client: Client,
    pub cache: ProxyCache,
    pub store: Arc<dyn LeaseStore>,
    pub metrics: PoolMetrics,
    /// The reporting instance of its Events.
    instance: String,
    expected: Mutex<HashMap<String, Expected>>,
    /// The last create that failed, per pool UID, until a create succeeds.
    create_failures: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for PoolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolContext").finish_non_exhaustive()
    }
}

impl PoolContext {
    pub fn new(client: Client, cache: ProxyCache, store: Arc<dyn LeaseStore>, metrics: PoolMetrics) -> Self {
        Self {
            client,
            cache,
            store,
            metrics,
            instance: std::env::var("POD_NAME").unwrap_or_else(|_| FIELD_MANAGER.into()),
            expected: Mutex::default(),
            create_failures: Mutex::default(),
        }
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

/// Why a member is drained, for the metric and the Event.
fn drain_reason(m: &Member, desired: &Desired, deleting: bool) -> &'static str {
    if deleting {
        "pool_deleted"
    } else if m.failed {
        "failed"
    } else if !m.current || desired.max_age.is_some_and(|a| m.age >= a) {
        "rotation"
    } else {
        "scale_down"
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
    if !deleting && !finalizers.iter().any(|f| f == FINALIZER) {
        let mut list = finalizers.to_vec();
        list.push(FINALIZER.into());
        let patch = json!({"metadata": {"finalizers": list, "resourceVersion": pool.resource_version()}});
        pools
            .patch(&name, &params(), &Patch::Merge(patch))
            .await
            .map_err(kube_error("the pool's finalizer"))?;
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
            if !e.seen_in(&by_name) && !waited {
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            if waited && !e.seen_in(&by_name) {
                tracing::info!("the cache did not show this pool's last writes in time; planning on what it shows");
            }
            expected.remove(&uid);
        }
    }
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
    let leases = match ctx.store.active_leases(&id_refs).await {
        Ok(l) => l,
        Err(e) => {
            // Unknown leases: count one each, so no draining member goes before its timeout.
            tracing::info!(error = %e, "reading the members' leases failed; assuming each holds one");
            vec![1; ids.len()]
        }
    };
    let members: Vec<(&Proxy, Member)> = live
        .iter()
        .zip(leases)
        .filter_map(|(p, n)| {
            let role = p.pool()?.role;
            Some((*p, member(p, role, &hash, u32::try_from(n).unwrap_or(u32::MAX), now)))
        })
        .collect();

    let generation = pool.metadata.generation;
    let now_time = Time(now);
    let mut status = counts(&members);
    status.observed_generation = generation;
    status.selector = format!("{LABEL_POOL}={name}");
    status.conditions = pool.status.clone().unwrap_or_default().conditions;

    let desired = match desired(&pool.spec, deleting) {
        Ok(d) => d,
        Err(why) => {
            crate::status::set_condition(
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
        crate::status::set_condition(
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

    let decided: Plan = plan(&desired, &members.iter().map(|(_, m)| m.clone()).collect::<Vec<_>>());
    span.record("pool.steps", decided.steps.len());
    let by_member: HashMap<&str, &Member> = members.iter().map(|(_, m)| (m.name.as_str(), m)).collect();
    let reference = kube::Resource::object_ref(pool, &());
    let pool_labels = PoolLabels {
        namespace: namespace.clone(),
        pool: name.clone(),
    };
    let mut wrote = Expected::default();
    let mut events = Vec::new();
    let mut create_failed = false;
    for step in decided.steps.iter().take(MAX_WRITES) {
        match step {
            Step::Create(role) => match proxies.create(&post_params(), &new_member(pool, *role, &hash)).await {
                Ok(made) => {
                    ctx.create_failures.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
                    ctx.metrics
                        .creates
                        .get_or_create(&CreateLabels {
                            namespace: namespace.clone(),
                            pool: name.clone(),
                            role: role.as_str(),
                        })
                        .inc();
                    events.push(normal("MemberCreated", format!("created {} member {}", role.as_str(), made.name_any())));
                    wrote.created.push(made.name_any());
                }
                Err(e) => {
                    // Kept for ReplicaFailure; the other steps go on (a promotion must not wait
                    // for a create the API server refuses).
                    let why = format!("creating a member: {e}");
                    ctx.create_failures.lock().unwrap_or_else(|p| p.into_inner()).insert(uid.clone(), why.clone());
                    if !create_failed {
                        events.push(warning("MemberCreateFailed", why));
                    }
                    create_failed = true;
                }
            },
            Step::Promote(member) => {
                let patch = json!({"metadata": {
                    "labels": {LABEL_POOL_ROLE: PoolRole::Active.as_str()},
                    "annotations": {ANNOTATION_DRAINING_SINCE: null}}});
                if patch_member(&proxies, member, patch).await? {
                    ctx.metrics.promotions.get_or_create(&pool_labels).inc();
                    events.push(normal("Promoted", format!("standby {member} now takes leases")));
                    wrote.roles.push((member.clone(), PoolRole::Active));
                }
            }
            Step::Drain(member) => {
                let reason = by_member
                    .get(member.as_str())
                    .map_or("scale_down", |m| drain_reason(m, &desired, deleting));
                let patch = json!({"metadata": {
                    "labels": {LABEL_POOL_ROLE: PoolRole::Draining.as_str()},
                    "annotations": {ANNOTATION_DRAINING_SINCE: now.to_string()}}});
                if patch_member(&proxies, member, patch).await? {
                    ctx.metrics
                        .drains
                        .get_or_create(&DrainLabels {
                            namespace: namespace.clone(),
                            pool: name.clone(),
                            reason,
                        })
                        .inc();
                    let note = format!(
                        "{member} gets no new leases ({}); it goes when its leases end, at most {}s from now",
                        reason.replace('_', " "),
                        desired.drain_timeout.as_secs()
                    );
                    events.push(normal("Draining", note));
                    wrote.roles.push((member.clone(), PoolRole::Draining));
                }
            }
            Step::Delete(member) => {
                match proxies.delete(member, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(source) => {
                        return Err(PoolError::Kube {
                            what: "a member's delete",
                            source,
                        });
                    }
                }
                let why = by_member.get(member.as_str()).map_or("", |m| {
                    if m.role == PoolRole::Draining {
                        if m.leases == 0 { " (its leases ended)" } else { " (its drain timeout passed)" }
                    } else {
                        ""
                    }
                });
                events.push(normal("MemberDeleted", format!("deleted member {member}{why}")));
                wrote.deleted.push(member.clone());
            }
        }
    }
    let more = decided.steps.len() > MAX_WRITES;
    let settled = decided.steps.is_empty();
    if !settled {
        wrote.since = Some(Instant::now());
        ctx.expected.lock().unwrap_or_else(|p| p.into_inner()).insert(uid.clone(), wrote);
    }
    for e in &events {
        post_event(&ctx.client, &ctx.instance, &reference, &namespace, e).await;
    }

    let failure = ctx.create_failures.lock().unwrap_or_else(|p| p.into_inner()).get(&uid).cloned();
    set_conditions(&mut status, &desired, settled, failure.as_deref(), generation, &now_time);
    flush_status(&pools, pool, &status).await?;

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
        ctx.create_failures.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
        return Ok(Action::await_change());
    }
    let draining_with_leases = members
        .iter()
        .any(|(_, m)| m.role == PoolRole::Draining && m.leases > 0);
    let mut next = decided.recheck.unwrap_or(RESYNC).min(RESYNC);
    if draining_with_leases {
        next = next.min(DRAIN_POLL);
    }
    if more {
        next = Duration::from_millis(200);
    }
    Ok(Action::requeue(next))
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

fn normal(reason: &'static str, note: String) -> ProxyEvent {
    ProxyEvent {
        warning: false,
        reason,
        note,
    }
}

fn warning(reason: &'static str, note: String) -> ProxyEvent {
    ProxyEvent {
        warning: true,
        reason,
        note,
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
    match api.patch_status(&pool.name_any(), &params(), &Patch::Merge(patch)).await {
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

/// The ProxyPool controller: watches pools (in `namespace`, or all) and takes their members'
/// changes from the shared Proxy cache, so a member's failure reaches its pool with no watch of
/// its own. Returns the future that runs it until `shutdown`. When the ProxyPool resource is
/// not installed (a cluster that did not apply the new CRD), it says so once and runs nothing.
pub async fn run(ctx: Arc<PoolContext>, namespace: Option<String>, shutdown: CancellationToken) {
    use futures::StreamExt;
    use kube::runtime::{Controller, watcher};

    let pools: Api<ProxyPool> = match &namespace {
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
    Controller::new(pools, watcher::Config::default())
        .owns_stream(members)
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
    use egress_api::{ProxySpec, TemplateMetadata};

    fn pool(spec: serde_json::Value) -> ProxyPool {
        let mut p = ProxyPool::new("eu", serde_json::from_value(spec).unwrap());
        p.metadata.namespace = Some("crawl".into());
        p.metadata.uid = Some("pool-uid".into());
        p
    }

    #[test]
    fn defaults_apply_and_a_deleted_pool_wants_no_members() {
        let spec = pool(json!({"replicas": 3, "standby": 1, "template": {"spec": {"provider": "p"}}})).spec;
        let d = desired(&spec, false).unwrap();
        assert_eq!(
            (d.replicas, d.standby, d.max_age, d.drain_timeout, d.max_surge, d.max_unavailable, d.paused),
            (3, 1, None, DEFAULT_DRAIN_TIMEOUT, 1, 0, false)
        );
        let d = desired(&spec, true).unwrap();
        assert_eq!((d.replicas, d.standby, d.paused), (0, 0, true));
        let mut spec = spec;
        spec.max_age = Some("1h30m".into());
        spec.drain_timeout = Some("90s".into());
        let d = desired(&spec, false).unwrap();
        assert_eq!((d.max_age, d.drain_timeout), (Some(Duration::from_secs(5400)), Duration::from_secs(90)));
        // The schema's pattern lets an overflow through; Go's parser does not.
        spec.max_age = Some("9999999999h".into());
        assert_eq!(
            desired(&spec, false).unwrap_err(),
            "spec.maxAge: time: invalid duration \"9999999999h\""
        );
    }

    #[test]
    fn the_template_hash_follows_the_template_not_how_it_was_written() {
        let a = pool(json!({"template": {"spec": {"provider": "p"}}}));
        let b = pool(json!({"template": {"spec": {"provider": "p", "port": 3128, "mode": "Managed"}}}));
        assert_eq!(template_hash(&a.spec.template), template_hash(&b.spec.template));
        assert_eq!(template_hash(&a.spec.template).len(), 10);
        let c = pool(json!({"template": {"spec": {"provider": "p", "port": 8080}}}));
        assert_ne!(template_hash(&a.spec.template), template_hash(&c.spec.template));
        let d = pool(json!({"template": {"metadata": {"labels": {"team": "x"}}, "spec": {"provider": "p"}}}));
        assert_ne!(template_hash(&a.spec.template), template_hash(&d.spec.template));
    }

    #[test]
    fn a_new_member_is_owned_labelled_and_carries_the_pool_attribute() {
        let mut p = pool(json!({"template": {"spec": {"provider": "p"}}}));
        p.spec.template = ProxyTemplate {
            metadata: Some(TemplateMetadata {
                labels: [("team".into(), "crawl".into()), (LABEL_POOL.into(), "spoof".into())].into(),
                annotations: [("note".into(), "hi".into())].into(),
            }),
            spec: ProxySpec {
                provider: "p".into(),
                attributes: [("pool".into(), "other".into()), ("geo".into(), "eu".into())].into(),
                ..Default::default()
            },
        };
        let m = new_member(&p, PoolRole::Standby, "abc");
        assert_eq!(m.metadata.generate_name.as_deref(), Some("eu-"));
        assert_eq!(m.metadata.namespace.as_deref(), Some("crawl"));
        let labels = m.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_POOL], "eu", "the pool's name wins over the template's");
        assert_eq!(labels[LABEL_POOL_TEMPLATE_HASH], "abc");
        assert_eq!(labels[LABEL_POOL_ROLE], "standby");
        assert_eq!(labels["team"], "crawl");
        assert_eq!(m.metadata.annotations.as_ref().unwrap()["note"], "hi");
        assert_eq!(m.spec.attributes["pool"], "eu");
        assert_eq!(m.spec.attributes["geo"], "eu");
        let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.api_version.as_str(), owner.uid.as_str(), owner.controller),
            ("ProxyPool", API_VERSION, "pool-uid", Some(true))
        );
        // What the Proxy reconciler and the lease path will take it for.
        let mut made = m.clone();
        made.metadata.name = Some("eu-x1y2z".into());
        let membership = made.pool().unwrap();
        assert_eq!((membership.pool, membership.pool_uid, membership.role), ("eu", "pool-uid", PoolRole::Standby));
    }

    #[test]
    fn a_member_fails_on_its_verdict_a_lost_instance_or_a_permanent_error() {
        let mut p = Proxy::new("m", ProxySpec::default());
        let phase = |p: &mut Proxy, ph: Phase| {
            p.status.get_or_insert_with(Default::default).phase = Some(ph);
        };
        phase(&mut p, Phase::Ready);
        assert!(!failed(&p));
        for bad in [Phase::Unhealthy, Phase::Failed] {
            phase(&mut p, bad);
            assert!(failed(&p), "{bad:?}");
        }
        phase(&mut p, Phase::Provisioning);
        assert!(!failed(&p));
        let now = Time(Timestamp::UNIX_EPOCH);
        crate::status::set_condition(
            &mut p.status.as_mut().unwrap().conditions,
            conditions::PROVISIONED,
            ConditionStatus::False,
            reasons::INSTANCE_LOST,
            "the instance is gone",
            None,
            &now,
        );
        assert!(failed(&p));
    }

    #[test]
    fn counts_and_conditions() {
        let proxy = |max: Option<i32>| Proxy::new("m", ProxySpec { max_leases: max, ..Default::default() });
        let m = |role, ready, current| Member {
            name: "m".into(),
            role,
            current,
            age: Duration::ZERO,
            ready,
            failed: false,
            leases: 0,
            draining_for: Duration::ZERO,
        };
        let (a, b) = (proxy(None), proxy(Some(0)));
        let members = [
            (&a, m(PoolRole::Active, true, true)),
            (&b, m(PoolRole::Active, true, false)),
            (&a, m(PoolRole::Active, false, true)),
            (&a, m(PoolRole::Standby, true, true)),
            (&a, m(PoolRole::Standby, false, true)),
            (&a, m(PoolRole::Draining, true, false)),
        ];
        let mut s = counts(&members);
        assert_eq!(
            (s.replicas, s.ready_replicas, s.available_replicas, s.standby_ready, s.updated_replicas),
            (3, 2, 1, 1, 4)
        );
        let desired = desired(&pool(json!({"replicas": 3, "template": {"spec": {"provider": "p"}}})).spec, false).unwrap();
        let now = Time(Timestamp::UNIX_EPOCH);
        set_conditions(&mut s, &desired, false, Some("creating a member: quota"), Some(4), &now);
        let get = |t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!((get("Available").status, get("Available").reason.as_str()), (ConditionStatus::False, "MinimumMembersUnavailable"));
        assert_eq!(get("Available").message, "1 of 3 members can be leased (at least 3 wanted)");
        assert_eq!(get("Progressing").reason, "Rolling");
        assert_eq!((get("ReplicaFailure").status, get("ReplicaFailure").message.as_str()), (ConditionStatus::True, "creating a member: quota"));
        assert_eq!(get("Available").observed_generation, Some(4));
    }
}
