//! What a pool's members are to its controller, as pure functions (docs/pools.md): the pool's
//! spec with its defaults, the template hash, a new member Proxy, a member Proxy read into the
//! decision's [`Member`], and the pool's status and conditions from its members.

use std::collections::HashSet;
use std::time::Duration;

use egress_api::{
    ANNOTATION_DRAINING_SINCE, API_VERSION, ATTRIBUTE_POOL, ConditionStatus, LABEL_POOL, LABEL_POOL_ROLE,
    LABEL_POOL_TEMPLATE_HASH, Phase, PoolRole, Proxy, ProxyPool, ProxyPoolSpec, ProxyPoolStatus, ProxyTemplate,
    conditions, reasons,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ObjectMeta;
use sha2::{Digest, Sha256};

use crate::exit_policy::ExitPolicy;
use crate::pool::decide::Desired;
use crate::pool::member::Member;
use crate::pool::remediation::{
    Backoff, CONDITION, DEFAULT_MAX_UNHEALTHY, DEFAULT_STARTUP_GRACE, Gate, Health, MaxUnhealthy, condition, judge,
};

/// `drainTimeout` when the pool does not say.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// The pool's spec with every default applied, or what is wrong with it. A pool being deleted
/// wants no members: they drain, then go.
///
/// # Errors
///
/// A duration the schema let through that Go's parser refuses (an overflow), or a
/// `maxUnhealthy` it should have refused, as `field: why`.
pub fn desired(spec: &ProxyPoolSpec, deleting: bool) -> Result<Desired, String> {
    let duration = |field: &str, text: Option<&str>| {
        text.map(egress_go_decode::parse_duration)
            .transpose()
            .map_err(|e| format!("spec.{field}: {e}"))
    };
    let max_age = duration("maxAge", spec.max_age.as_deref())?;
    let drain_timeout = duration("drainTimeout", spec.drain_timeout.as_deref())?.unwrap_or(DEFAULT_DRAIN_TIMEOUT);
    let startup_grace = duration("startupGrace", spec.startup_grace.as_deref())?.unwrap_or(DEFAULT_STARTUP_GRACE);
    let max_unhealthy = spec
        .max_unhealthy
        .as_ref()
        .map(MaxUnhealthy::parse)
        .transpose()?
        .unwrap_or(DEFAULT_MAX_UNHEALTHY);
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
        max_unhealthy,
        startup_grace,
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

/// What a member's Proxy shows of its health at `now`, as the pool judges it; `proven` when
/// it has been Ready while the pool watched it.
pub fn health(proxy: &Proxy, proven: bool, now: Timestamp) -> Health {
    let phase = proxy.status.as_ref().and_then(|s| s.phase);
    let provisioned = proxy.condition(conditions::PROVISIONED);
    let lost = provisioned.is_some_and(|c| c.status == ConditionStatus::False && c.reason == reasons::INSTANCE_LOST);
    // Its instance first ran when `Provisioned` turned True; a Proxy failing its probes has
    // one, so the creation time only stands in for an object written by hand.
    let running_since = provisioned
        .filter(|c| c.status == ConditionStatus::True)
        .map(|c| c.last_transition_time.0)
        .or_else(|| proxy.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(now);
    Health {
        broken: lost || phase == Some(Phase::Failed),
        failing_probes: phase == Some(Phase::Unhealthy),
        proven: proven || phase == Some(Phase::Ready),
        running_for: since(running_since, now),
    }
}

/// Time between two instants of the API's clock, none if `later` is earlier.
fn since(earlier: Timestamp, later: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or_default()
}

/// What every member of one pass is judged against.
#[derive(Clone, Copy, Debug)]
pub struct Look<'a> {
    /// The current template's hash.
    pub hash: &'a str,
    pub now: Timestamp,
    /// The pool's startup grace.
    pub grace: Duration,
    /// Whether members whose exit was found wanting are kept from leases (and so replaced).
    pub exit_policy: ExitPolicy,
    /// The members that hold a shared exit ([`shared_exit::holders`](crate::pool::shared_exit::holders)): not replaced for it.
    pub exit_holders: &'a HashSet<String>,
}

/// One member as the decision sees it, with its `leases`; `proven` when it has been Ready
/// while the pool watched it.
pub fn member(proxy: &Proxy, role: PoolRole, leases: u32, proven: bool, look: &Look<'_>) -> Member {
    let now = look.now;
    let created = proxy.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let draining_since = proxy
        .annotations()
        .get(ANNOTATION_DRAINING_SINCE)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .unwrap_or(now);
    let name = proxy.name_any();
    let exit_refused = crate::exit_policy::refused(proxy, look.exit_policy) && !look.exit_holders.contains(&name);
    Member {
        name,
        role,
        current: proxy.labels().get(LABEL_POOL_TEMPLATE_HASH).map(String::as_str) == Some(look.hash),
        age: since(created, now),
        ready: proxy.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready) && !exit_refused,
        failed: judge(health(proxy, proven, now), look.grace).failed || exit_refused,
        exit_refused,
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
pub(crate) fn set_conditions(
    status: &mut ProxyPoolStatus,
    desired: &Desired,
    settled: bool,
    create_failure: Option<&str>,
    generation: Option<i64>,
    now: &Time,
) {
    use crate::conditions::set_condition;
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
        (false, false) => (
            ConditionStatus::True,
            "Rolling",
            "members are being made, promoted or drained",
        ),
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

/// The pool's failed members, its backoff and the `RemediationAllowed` condition for `gate`
/// (as [`remediation_condition`] words it).
pub(crate) fn set_remediation(
    status: &mut ProxyPoolStatus,
    gate: &Gate,
    condition: &(ConditionStatus, &'static str, String),
    backoff: &Backoff,
    generation: Option<i64>,
    now: &Time,
) {
    status.failed_members = i32::try_from(gate.share().failed).unwrap_or(i32::MAX);
    status.failed_creations = i32::try_from(backoff.failed_creations).unwrap_or(i32::MAX);
    status.next_replacement_time = backoff.remaining(now.0).and(backoff.not_before).map(Time);
    let (s, reason, message) = condition;
    crate::conditions::set_condition(&mut status.conditions, CONDITION, *s, reason, message, generation, now);
}

/// The `RemediationAllowed` condition for `gate`, with `note` (what the operator found fetching
/// the probe target itself) after a widespread failure's message.
pub(crate) fn remediation_condition(
    gate: &Gate,
    desired: &Desired,
    backoff: &Backoff,
    note: Option<String>,
) -> (ConditionStatus, &'static str, String) {
    let (s, reason, mut message) = condition(gate, desired.max_unhealthy, backoff, desired.startup_grace);
    if matches!(gate, Gate::TooManyUnhealthy(_)) {
        message.push_str(&note.unwrap_or_default());
    }
    (s, reason, message)
}

/// Whether the pool is as asked: `replicas` active and `standby` standby members, all Ready
/// and up to date, and none draining.
pub(crate) fn at_rest(desired: &Desired, members: &[(&Proxy, Member)]) -> bool {
    let in_date = |m: &Member| m.current && desired.max_age.is_none_or(|a| m.age < a);
    let with = |role| members.iter().filter(|(_, m)| m.role == role).count();
    members
        .iter()
        .all(|(_, m)| m.role != PoolRole::Draining && m.ready && in_date(m))
        && with(PoolRole::Active) == desired.replicas as usize
        && with(PoolRole::Standby) == desired.standby as usize
}

/// Why a member is drained, for the metric and the Event.
pub(crate) fn drain_reason(m: &Member, desired: &Desired, deleting: bool) -> &'static str {
    if deleting {
        "pool_deleted"
    } else if m.exit_refused {
        "exit_refused"
    } else if m.failed {
        "failed"
    } else if !m.current || desired.max_age.is_some_and(|a| m.age >= a) {
        "rotation"
    } else {
        "scale_down"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::{ProxySpec, TemplateMetadata};
    use serde_json::json;

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
            (
                d.replicas,
                d.standby,
                d.max_age,
                d.drain_timeout,
                d.max_surge,
                d.max_unavailable,
                d.paused
            ),
            (3, 1, None, DEFAULT_DRAIN_TIMEOUT, 1, 0, false)
        );
        assert_eq!(
            (d.max_unhealthy, d.startup_grace),
            (DEFAULT_MAX_UNHEALTHY, DEFAULT_STARTUP_GRACE)
        );
        let d = desired(&spec, true).unwrap();
        assert_eq!((d.replicas, d.standby, d.paused), (0, 0, true));
        let mut spec = spec;
        spec.max_age = Some("1h30m".into());
        spec.drain_timeout = Some("90s".into());
        let d = desired(&spec, false).unwrap();
        assert_eq!(
            (d.max_age, d.drain_timeout),
            (Some(Duration::from_secs(5400)), Duration::from_secs(90))
        );
        // The schema's pattern lets an overflow through; Go's parser does not.
        spec.max_unhealthy = Some(egress_api::IntOrString::Int(2));
        spec.startup_grace = Some("45s".into());
        let d = desired(&spec, false).unwrap();
        assert_eq!(
            (d.max_unhealthy, d.startup_grace),
            (MaxUnhealthy::Count(2), Duration::from_secs(45))
        );
        spec.max_age = Some("9999999999h".into());
        assert_eq!(
            desired(&spec, false).unwrap_err(),
            "spec.maxAge: time: invalid duration \"9999999999h\""
        );
        spec.max_age = None;
        spec.startup_grace = Some("9999999999h".into());
        assert_eq!(
            desired(&spec, false).unwrap_err(),
            "spec.startupGrace: time: invalid duration \"9999999999h\""
        );
        // A value the schema refuses, as an object that bypassed it would carry it.
        spec.startup_grace = None;
        spec.max_unhealthy = Some(egress_api::IntOrString::String("half".into()));
        assert!(desired(&spec, false).unwrap_err().starts_with("spec.maxUnhealthy: "));
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
            (
                owner.kind.as_str(),
                owner.api_version.as_str(),
                owner.uid.as_str(),
                owner.controller
            ),
            ("ProxyPool", API_VERSION, "pool-uid", Some(true))
        );
        // What the Proxy reconciler and the lease path will take it for.
        let mut made = m.clone();
        made.metadata.name = Some("eu-x1y2z".into());
        let membership = made.pool().unwrap();
        assert_eq!(
            (membership.pool, membership.pool_uid, membership.role),
            ("eu", "pool-uid", PoolRole::Standby)
        );
    }

    #[test]
    fn a_member_fails_on_a_lost_instance_or_a_permanent_error_at_once_and_on_its_probes_after_its_grace() {
        let t = |secs: i64| Time(Timestamp::from_second(secs).unwrap());
        let grace = Duration::from_secs(300);
        let mut p = Proxy::new("m", ProxySpec::default());
        p.metadata.creation_timestamp = Some(t(0));
        let phase = |p: &mut Proxy, ph: Phase| {
            p.status.get_or_insert_with(Default::default).phase = Some(ph);
        };
        let failed = |p: &Proxy, proven: bool, now: i64| judge(health(p, proven, t(now).0), grace).failed;
        // Its instance first ran at 100 s.
        phase(&mut p, Phase::Running);
        crate::conditions::set_condition(
            &mut p.status.as_mut().unwrap().conditions,
            conditions::PROVISIONED,
            ConditionStatus::True,
            reasons::RUNNING,
            "running",
            None,
            &t(100),
        );
        assert!(!failed(&p, false, 1000));
        phase(&mut p, Phase::Unhealthy);
        assert!(!failed(&p, false, 399), "within the grace from its first run");
        assert!(failed(&p, false, 400), "past it");
        assert!(failed(&p, true, 150), "once proven, at once");
        phase(&mut p, Phase::Ready);
        assert!(!failed(&p, false, 1000));
        assert!(health(&p, false, t(1000).0).proven, "Ready is proof");
        phase(&mut p, Phase::Failed);
        assert!(failed(&p, false, 100));
        phase(&mut p, Phase::Provisioning);
        crate::conditions::set_condition(
            &mut p.status.as_mut().unwrap().conditions,
            conditions::PROVISIONED,
            ConditionStatus::False,
            reasons::INSTANCE_LOST,
            "the instance is gone",
            None,
            &t(120),
        );
        assert!(failed(&p, false, 120));
    }

    #[test]
    fn a_ready_member_with_a_refused_exit_fails_under_enforce_only() {
        let t = Time(Timestamp::from_second(1000).unwrap());
        let mut p = Proxy::new("m", ProxySpec::default());
        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(0).unwrap()));
        let status = p.status.get_or_insert_with(Default::default);
        status.phase = Some(Phase::Ready);
        let none = HashSet::new();
        let look = |exit_policy| Look {
            hash: "h",
            now: t.0,
            grace: Duration::from_secs(300),
            exit_policy,
            exit_holders: &none,
        };
        let judged = |p: &Proxy, policy| member(p, PoolRole::Active, 0, true, &look(policy));
        let fine = judged(&p, ExitPolicy::Enforce);
        assert!(fine.ready && !fine.failed && !fine.exit_refused);
        for (status, refused) in [
            (ConditionStatus::Unknown, false),
            (ConditionStatus::True, false),
            (ConditionStatus::False, true),
        ] {
            crate::conditions::set_condition(
                &mut p.status.as_mut().unwrap().conditions,
                conditions::EXIT_VERIFIED,
                status,
                reasons::EXIT_SHARED,
                "",
                None,
                &t,
            );
            let enforced = judged(&p, ExitPolicy::Enforce);
            assert_eq!(
                (enforced.ready, enforced.failed, enforced.exit_refused),
                (!refused, refused, refused),
                "{status:?} under enforce"
            );
            let observed = judged(&p, ExitPolicy::Observe);
            assert!(observed.ready && !observed.failed, "{status:?} under observe");
        }
        let refused = judged(&p, ExitPolicy::Enforce);
        let spec = pool(json!({"replicas": 1, "template": {"spec": {"provider": "p"}}})).spec;
        let desired = desired(&spec, false).unwrap();
        assert_eq!(drain_reason(&refused, &desired, false), "exit_refused");
        assert_eq!(drain_reason(&refused, &desired, true), "pool_deleted");
    }

    #[test]
    fn counts_and_conditions() {
        let proxy = |max: Option<i32>| {
            Proxy::new(
                "m",
                ProxySpec {
                    max_leases: max,
                    ..Default::default()
                },
            )
        };
        let m = |role, ready, current| Member {
            name: "m".into(),
            role,
            current,
            age: Duration::ZERO,
            ready,
            failed: false,
            exit_refused: false,
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
            (
                s.replicas,
                s.ready_replicas,
                s.available_replicas,
                s.standby_ready,
                s.updated_replicas
            ),
            (3, 2, 1, 1, 4)
        );
        let desired = desired(
            &pool(json!({"replicas": 3, "template": {"spec": {"provider": "p"}}})).spec,
            false,
        )
        .unwrap();
        let now = Time(Timestamp::UNIX_EPOCH);
        set_conditions(&mut s, &desired, false, Some("creating a member: quota"), Some(4), &now);
        let get = |t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(
            (get("Available").status, get("Available").reason.as_str()),
            (ConditionStatus::False, "MinimumMembersUnavailable")
        );
        assert_eq!(
            get("Available").message,
            "1 of 3 members can be leased (at least 3 wanted)"
        );
        assert_eq!(get("Progressing").reason, "Rolling");
        assert_eq!(
            (get("ReplicaFailure").status, get("ReplicaFailure").message.as_str()),
            (ConditionStatus::True, "creating a member: quota")
        );
        assert_eq!(get("Available").observed_generation, Some(4));
    }
}
