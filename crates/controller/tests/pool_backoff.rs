//! Failed creations slow a pool down (docs/pools.md#when-failures-are-widespread): a pool of 1
//! on the in-memory reference provider whose every instance runs but never passes a probe, run
//! pass by pass for an hour on a clock the test moves (a pass a second), through the same pure
//! parts the controller's pass composes: each member judged (`pool::view::member`), the watch
//! that counts failed creations, the gate, and the plan. Every create is a real call to the
//! reference provider, counted there.

mod common;

use std::time::Duration;

use egress_api::{
    ANNOTATION_DRAINING_SINCE, ConditionStatus, LABEL_POOL_ROLE, Phase, PoolRole, Proxy, ProxyPool, ProxyStatus,
    conditions, reasons,
};
use egress_conformance::BackendHooks as _;
use egress_conformance::memory::{INSERT, MemoryBackend, MemoryProvider, MemoryTarget};
use egress_controller::pool::decide::{Step, plan};
use egress_controller::pool::remediation::{BACKOFF_CAP, Observed, Watch, delay, share};
use egress_controller::pool::view::{Look, desired, health, member, new_member, template_hash};
use egress_provider::{OpCtx, Provider, ProviderId};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

const GRACE: Duration = Duration::from_secs(60);
const HOUR: i64 = 3600;

/// A member as the simulated cluster has it: its Proxy (never Ready: phase `Unhealthy` from its
/// instance's start) and its instance.
struct Simulated {
    proxy: Proxy,
    instance: ProviderId,
}

fn pool() -> ProxyPool {
    let mut p: ProxyPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "dud", "namespace": "crawl", "uid": "pool-uid"},
        "spec": {"replicas": 1, "startupGrace": "60s", "template": {"spec": {"provider": "mem"}}}
    }))
    .unwrap();
    p.metadata.namespace = Some("crawl".into());
    p
}

/// Makes member `n` in `role` at `now`: the reference provider creates its instance, which
/// runs at once and fails every probe.
async fn make(provider: &MemoryProvider, pool: &ProxyPool, role: PoolRole, n: usize, now: Timestamp) -> Simulated {
    let mut proxy = new_member(pool, role, &template_hash(&pool.spec.template));
    proxy.metadata.name = Some(format!("dud-{n}"));
    proxy.metadata.uid = Some(format!("uid-{n}"));
    proxy.metadata.creation_timestamp = Some(Time(now));
    let request = common::mem_request(&format!("uid-{n}"), "crawl", &format!("dud-{n}"));
    let instance = provider.create(&OpCtx::background(), &request).await.unwrap();
    let mut status = ProxyStatus {
        phase: Some(Phase::Unhealthy),
        provider_id: instance.to_string(),
        ..Default::default()
    };
    egress_controller::conditions::set_condition(
        &mut status.conditions,
        conditions::PROVISIONED,
        ConditionStatus::True,
        reasons::RUNNING,
        "running",
        None,
        &Time(now),
    );
    proxy.status = Some(status);
    Simulated { proxy, instance }
}

/// When each instance was created, over an hour of passes.
async fn an_hour_of_passes() -> (Vec<i64>, usize) {
    let backend = MemoryBackend::new();
    let provider = MemoryProvider::new("mem", MemoryTarget::config(&backend), backend.clone(), vec![]);
    let pool = pool();
    let wanted = desired(&pool.spec, false).unwrap();
    let hash = template_hash(&pool.spec.template);
    let mut watch = Watch::default();
    let mut members: Vec<Simulated> = Vec::new();
    let mut created_at = Vec::new();
    for second in 0..HOUR {
        let now = Timestamp::from_second(second).unwrap();
        let look = Look {
            hash: &hash,
            now,
            grace: wanted.startup_grace,
            exit_policy: Default::default(),
            exit_holders: &Default::default(),
        };
        let judged: Vec<_> = members
            .iter()
            .map(|s| {
                let role = s.proxy.pool().unwrap().role;
                let proven = watch.proven(&s.proxy.name_any());
                (member(&s.proxy, role, 0, proven, &look), health(&s.proxy, proven, now))
            })
            .collect();
        let observed: Vec<Observed<'_>> = judged.iter().map(|(m, h)| Observed::of(m, h)).collect();
        watch.observe(&observed, now);
        let list: Vec<_> = judged.into_iter().map(|(m, _)| m).collect();
        let gate = watch.gate(share(wanted.max_unhealthy, &list), wanted.startup_grace, now);
        for step in plan(&wanted, &list, gate.allows()).steps {
            match step {
                Step::Create(role) => {
                    let n = created_at.len();
                    members.push(make(&provider, &pool, role, n, now).await);
                    created_at.push(second);
                }
                Step::Drain(name) => {
                    let s = members.iter_mut().find(|s| s.proxy.name_any() == name).unwrap();
                    let labels = s.proxy.metadata.labels.get_or_insert_default();
                    labels.insert(LABEL_POOL_ROLE.into(), PoolRole::Draining.as_str().into());
                    s.proxy
                        .metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(ANNOTATION_DRAINING_SINCE.into(), now.to_string());
                }
                Step::Delete(name) => {
                    let i = members.iter().position(|s| s.proxy.name_any() == name).unwrap();
                    let gone = members.remove(i);
                    provider.delete(&OpCtx::background(), &gone.instance).await.unwrap();
                }
                Step::Promote(_) => panic!("a pool without standbys promotes nothing"),
            }
        }
    }
    let log = backend.call_log().await.unwrap();
    (created_at, log.iter().filter(|c| c.kind == INSERT).count())
}

#[tokio::test]
async fn instances_that_never_become_ready_are_made_less_and_less_often() {
    let (created_at, inserts) = an_hour_of_passes().await;
    assert_eq!(inserts, created_at.len(), "every create reached the reference provider");
    // Each failed creation waits its grace to be judged, then the backoff: 30 s, doubling, at
    // most 15 minutes. Judged every grace without it, the pool would make one a minute.
    let gaps: Vec<i64> = created_at.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, gap) in gaps.iter().enumerate() {
        let failed_in_a_row = u32::try_from(i + 1).unwrap();
        let wanted = (GRACE + delay(failed_in_a_row)).as_secs();
        assert!(
            u64::try_from(*gap).unwrap() >= wanted,
            "creates at {created_at:?}: gap {i} is {gap}s, under {wanted}s"
        );
    }
    assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "the gaps only grow: {gaps:?}");
    assert_eq!(
        created_at,
        [0, 90, 210, 390, 690, 1230, 2190, 3150],
        "an hour makes 8 instances, not 60"
    );
    assert_eq!(
        gaps.last().copied(),
        Some(i64::try_from((GRACE + BACKOFF_CAP).as_secs()).unwrap())
    );
}
