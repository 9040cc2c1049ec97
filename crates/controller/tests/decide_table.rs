//! The reconciler's decision table: every branch of spec/core.md §3 (and the rows of the Go
//! operator's action table), driven through whole passes against a scripted world.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use egress_api::{
    ANNOTATION_SKIP_CLEANUP, ANNOTATION_SPEC_HASH, CloudInit, ConditionStatus, Endpoint, FINALIZER, Mode, Phase,
    Placement, Proxy, ProxySpec, ProxyStatus, SecretRef, conditions, reasons,
};
use egress_controller::conditions::set_condition;
use egress_controller::create_budget::Deferral;
use egress_controller::proxy::credentials::{Prepared, Refusal, Serving};
use egress_controller::proxy::decide::{
    Action, Facts, Input, Marked, Next, Note, Outcome, ProviderFailure, Requeue, Timings, next,
};
use egress_controller::proxy::secret::SecretProblem;
use egress_controller::proxy::spec_hash::spec_hash;
use egress_controller::proxy::status::Verdict;
use egress_provider::{Credentials, ErrorClass, Instance, InstanceState, ProviderId, ProxyCredentials};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn at(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
}

const CLOUD_INIT: &str = "#cloud-config\n";

/// A Managed Proxy with its finalizer, an instance `id-1` recorded and its hash current.
fn proxy() -> Proxy {
    let spec = ProxySpec {
        provider: "kvm-home".into(),
        placement: Some(Placement {
            zone: "hv1".into(),
            ..Default::default()
        }),
        cloud_init: Some(CloudInit {
            inline: Some(CLOUD_INIT.into()),
            secret_ref: None,
        }),
        ..Default::default()
    };
    let mut p = Proxy::new("p", spec);
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some("uid-1".into());
    p.metadata.generation = Some(1);
    p.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let hash = spec_hash(&p.spec, CLOUD_INIT.as_bytes());
    p.metadata.annotations = Some([(ANNOTATION_SPEC_HASH.to_string(), hash)].into());
    p.status = Some(ProxyStatus {
        provider_id: "id-1".into(),
        ..Default::default()
    });
    p
}

fn instance(state: InstanceState) -> Instance {
    let ip = (state == InstanceState::Running).then_some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)));
    Instance {
        id: ProviderId::new("id-1"),
        ip,
        state,
        uid: "uid-1".into(),
        created_at: None,
        installation: None,
    }
}

fn fail(class: ErrorClass, message: &str) -> ProviderFailure {
    ProviderFailure {
        class,
        message: message.into(),
    }
}

/// What the world answers in this pass. `None` means the call must not happen.
#[derive(Clone, Default)]
struct World {
    configured: bool,
    names: Vec<String>,
    verdict: Option<Verdict>,
    secret: Option<Result<Vec<u8>, SecretProblem>>,
    get: Option<Result<Instance, ProviderFailure>>,
    create: Option<Result<ProviderId, ProviderFailure>>,
    delete: Option<Result<(), ProviderFailure>>,
    /// The answers of the credentials Secret's reads, in order.
    credentials: Vec<Result<Prepared, SecretProblem>>,
    /// The provider's answer for the instance the credentials Secret names.
    bound_get: Option<Result<Instance, ProviderFailure>>,
    bind: Option<Result<(), SecretProblem>>,
    /// Whether the credential cache shows the Secret serving the recorded instance.
    cached: bool,
    /// Why the cache refuses an External Proxy's user Secret, if it does.
    refused: Option<Refusal>,
    /// The answer of the running instance's credentials check.
    check: Option<Result<Serving, SecretProblem>>,
    /// Since when earlier passes found the instance without an address.
    missing_since: Option<Time>,
    /// The reconciler's waits; the defaults when `None`.
    timings: Option<Timings>,
    /// Why an External Proxy is refused (namespace or destination), as the reconciler found.
    external_refused: Option<egress_controller::proxy::destinations::Refused>,
    /// The create budget had no room: the create is deferred, not made.
    deferred: Option<Deferral>,
    /// The installation the operator runs as.
    installation: Option<&'static str>,
    /// The provider's answer to marking the instance with the installation.
    mark: Option<Result<(), ProviderFailure>>,
}

fn world() -> World {
    World {
        configured: true,
        ..Default::default()
    }
}

fn short(a: &Action) -> &'static str {
    match a {
        Action::AddFinalizer => "AddFinalizer",
        Action::RemoveFinalizer => "RemoveFinalizer",
        Action::WriteSpecHash(_) => "WriteSpecHash",
        Action::AdoptInstance { .. } => "AdoptInstance",
        Action::ReadSecret(_) => "ReadSecret",
        Action::Get(_) => "Get",
        Action::Create { .. } => "Create",
        Action::Delete(_) => "Delete",
        Action::PrepareCredentials { .. } => "PrepareCredentials",
        Action::GetBound(_) => "GetBound",
        Action::BindCredentials(_) => "BindCredentials",
        Action::CheckCredentials(_) => "CheckCredentials",
        Action::MarkInstallation { .. } => "MarkInstallation",
    }
}

/// Runs one pass to its end: the actions in order and the outcome.
fn run(proxy: &Proxy, w: &World) -> (Vec<&'static str>, Vec<Action>, Outcome) {
    let input = Input {
        proxy,
        provider_configured: w.configured,
        configured_providers: &w.names,
        verdict: w.verdict,
        exit: egress_controller::proxy::exit_findings::ExitFinding::Off,
        credentials_cached: w.cached,
        credentials_refused: w.refused.clone(),
        address_missing_since: w.missing_since.clone(),
        external_refused: w.external_refused.clone(),
        installation: w.installation,
        now: at(1000),
    };
    let mut facts = Facts::default();
    let mut actions = Vec::new();
    let mut secret_reads = w.credentials.iter();
    for _ in 0..16 {
        match next(&input, &facts, &w.timings.unwrap_or_default()) {
            Next::Done(o) => return (actions.iter().map(short).collect(), actions, o),
            Next::Do(a) => {
                match &a {
                    Action::AddFinalizer => facts.finalizer_added = true,
                    Action::RemoveFinalizer => facts.finalizer_removed = true,
                    Action::WriteSpecHash(h) => facts.spec_hash_written = Some(h.clone()),
                    Action::AdoptInstance { hash, previous } => {
                        facts.spec_hash_written = Some(hash.clone());
                        facts.adopted_from = Some(previous.clone());
                    }
                    Action::ReadSecret(_) => facts.secret = Some(w.secret.clone().expect("unexpected secret read")),
                    Action::Get(_) => facts.get = Some(w.get.clone().expect("unexpected Get")),
                    Action::Create { .. } => match w.deferred {
                        Some(deferral) => facts.create_deferred = Some(deferral),
                        None => facts.create = Some(w.create.clone().expect("unexpected Create")),
                    },
                    Action::Delete(_) => facts.delete = Some(w.delete.clone().expect("unexpected Delete")),
                    Action::PrepareCredentials { .. } => {
                        facts.credentials = Some(secret_reads.next().expect("unexpected PrepareCredentials").clone());
                    }
                    Action::GetBound(id) => {
                        facts.bound_instance = Some((id.clone(), w.bound_get.clone().expect("unexpected GetBound")));
                    }
                    Action::BindCredentials(_) => {
                        facts.credentials_bound = Some(w.bind.clone().expect("unexpected BindCredentials"));
                    }
                    Action::CheckCredentials(_) => {
                        facts.credentials_checked = Some(w.check.clone().expect("unexpected CheckCredentials"));
                    }
                    Action::MarkInstallation { .. } => {
                        facts.marked = Some(w.mark.clone().expect("unexpected MarkInstallation"));
                    }
                }
                actions.push(a);
            }
        }
    }
    panic!("the pass did not end within 16 steps: {actions:?}");
}

fn provisioned(o: &Outcome) -> Option<(ConditionStatus, String)> {
    provisioned_of(&o.status)
}

fn provisioned_of(status: &ProxyStatus) -> Option<(ConditionStatus, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::PROVISIONED)
        .map(|c| (c.status, c.reason.clone()))
}

/// The Provisioned condition whole: status, reason and message.
fn provisioned_in_full(o: &Outcome) -> (ConditionStatus, &str, &str) {
    let c = o
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::PROVISIONED)
        .expect("a Provisioned condition");
    (c.status, c.reason.as_str(), c.message.as_str())
}

fn healthy(o: &Outcome) -> Option<ConditionStatus> {
    o.status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::HEALTHY)
        .map(|c| c.status)
}

const SECS: fn(u64) -> Requeue = |s| Requeue::After(Duration::from_secs(s));

// ---- managed path --------------------------------------------------------------------------

#[test]
fn a_missing_finalizer_is_added_in_a_pass_of_its_own() {
    let mut p = proxy();
    p.metadata.finalizers = None;
    let (actions, _, o) = run(&p, &world());
    assert_eq!(actions, ["AddFinalizer"]);
    assert_eq!(o.requeue, SECS(1));
}

#[test]
fn a_latched_permanent_error_waits_for_a_spec_change() {
    let mut p = proxy();
    let status = p.status.as_mut().unwrap();
    set_condition(
        &mut status.conditions,
        conditions::PROVISIONED,
        ConditionStatus::False,
        reasons::PERMANENT_ERROR,
        "bad image",
        Some(1),
        &at(0),
    );
    let (actions, _, o) = run(&p, &world());
    assert!(actions.is_empty(), "no provider call while latched: {actions:?}");
    assert_eq!(
        (o.requeue.clone(), o.status.phase),
        (Requeue::Never, Some(Phase::Failed))
    );
    // A new generation releases the latch.
    p.metadata.generation = Some(2);
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["Get"]);
    assert_eq!(o.status.phase, Some(Phase::Running));
}

#[test]
fn an_unconfigured_provider_fails_without_a_latch_and_names_what_exists() {
    let w = World {
        configured: false,
        names: vec!["kubernetes".into(), "kvm2-home".into()],
        ..world()
    };
    let (actions, _, o) = run(&proxy(), &w);
    assert!(actions.is_empty());
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::PROVIDER_NOT_CONFIGURED.into()))
    );
    let message = &o.status.conditions[0].message;
    assert!(
        message.contains("provider \"kvm-home\" is not configured (configured: kubernetes, kvm2-home)"),
        "{message}"
    );
    assert_eq!((o.requeue, o.status.phase), (Requeue::Never, Some(Phase::Failed)));

    // After a restart whose config has the entry, the same generation goes on: its instance is
    // observed, and the condition and the phase follow it.
    let mut p = proxy();
    p.status = Some(o.status);
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["Get"]);
    assert_eq!(o.status.phase, Some(Phase::Running));
    assert_eq!(provisioned(&o), Some((ConditionStatus::True, reasons::RUNNING.into())));
}

fn with_secret(mut p: Proxy) -> Proxy {
    p.spec.cloud_init = Some(CloudInit {
        inline: None,
        secret_ref: Some(SecretRef {
            name: "s".into(),
            key: "userdata".into(),
        }),
    });
    p
}

#[test]
fn an_unreadable_cloud_init_secret_is_a_cloud_init_error_and_not_latched() {
    let w = World {
        secret: Some(Err(SecretProblem::Unusable(
            "secret \"s\" not found or not labelled".into(),
        ))),
        ..world()
    };
    let (actions, _, o) = run(&with_secret(proxy()), &w);
    assert_eq!(actions, ["ReadSecret"]);
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::CLOUD_INIT_ERROR.into()))
    );
    assert_eq!((o.requeue, o.status.phase), (SECS(120), Some(Phase::Pending)));
}

#[test]
fn a_new_proxy_writes_its_hash_then_creates() {
    let mut p = with_secret(proxy());
    p.status = None;
    p.metadata.annotations = None;
    let w = World {
        secret: Some(Ok("from-secret".into())),
        create: Some(Ok(ProviderId::new("id-9"))),
        ..world()
    };
    let (actions, all, o) = run(&p, &w);
    assert_eq!(actions, ["ReadSecret", "WriteSpecHash", "Create"]);
    assert_eq!(all[1], Action::WriteSpecHash(spec_hash(&p.spec, b"from-secret")));
    assert_eq!(
        all[2],
        Action::Create {
            cloud_init: "from-secret".into(),
            credentials: None,
        }
    );
    assert_eq!(o.status.provider_id, "id-9");
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::PROVISIONING.into()))
    );
    assert_eq!((o.requeue, o.status.phase), (SECS(10), Some(Phase::Provisioning)));
}

#[test]
fn create_failures_by_class() {
    let mut p = proxy();
    p.status = None;
    let rows = [
        (
            ErrorClass::QuotaExceeded,
            SECS(300),
            Some(Phase::Pending),
            Some(reasons::QUOTA_EXCEEDED),
        ),
        (
            ErrorClass::Permanent,
            Requeue::Never,
            Some(Phase::Failed),
            Some(reasons::PERMANENT_ERROR),
        ),
        (ErrorClass::Transient, Requeue::Error("boom".into()), None, None),
        (ErrorClass::NotFound, Requeue::Error("boom".into()), None, None),
    ];
    for (class, requeue, phase, reason) in rows {
        let w = World {
            create: Some(Err(fail(class, "boom"))),
            ..world()
        };
        let (actions, _, o) = run(&p, &w);
        assert_eq!(actions, ["Create"], "{class:?}");
        assert_eq!(o.requeue, requeue, "{class:?}");
        assert_eq!(o.status.phase, phase, "{class:?}");
        assert_eq!(provisioned(&o).map(|(_, r)| r), reason.map(str::to_string), "{class:?}");
    }
    // The permanent error is latched for this generation.
    let w = World {
        create: Some(Err(fail(ErrorClass::Permanent, "no such image"))),
        ..world()
    };
    let (_, _, o) = run(&p, &w);
    assert_eq!(o.status.conditions[0].observed_generation, Some(1));
}

#[test]
fn observing_the_instance_by_state() {
    let rows = [
        (
            InstanceState::Provisioning,
            vec!["Get"],
            SECS(10),
            Phase::Provisioning,
            ConditionStatus::False,
            "",
        ),
        (
            InstanceState::Running,
            vec!["Get"],
            SECS(120),
            Phase::Running,
            ConditionStatus::True,
            "10.0.0.7",
        ),
        (
            InstanceState::Stopped,
            vec!["Get", "Delete"],
            SECS(10),
            Phase::Provisioning,
            ConditionStatus::False,
            "",
        ),
        (
            InstanceState::Terminated,
            vec!["Get", "Delete"],
            SECS(10),
            Phase::Provisioning,
            ConditionStatus::False,
            "",
        ),
    ];
    for (state, want, requeue, phase, prov, ip) in rows {
        let w = World {
            get: Some(Ok(instance(state))),
            delete: Some(Ok(())),
            ..world()
        };
        let (actions, _, o) = run(&proxy(), &w);
        assert_eq!(actions, want, "{state:?}");
        assert_eq!((o.requeue.clone(), o.status.phase), (requeue, Some(phase)), "{state:?}");
        assert_eq!(provisioned(&o).unwrap().0, prov, "{state:?}");
        assert_eq!(o.status.ip, ip, "{state:?}");
        assert_eq!(
            o.status.provider_id, "id-1",
            "{state:?}: the id is kept until Get says NotFound"
        );
    }
}

#[test]
fn health_verdicts_set_ready_or_unhealthy() {
    for (healthy_now, phase, cond) in [
        (true, Phase::Ready, ConditionStatus::True),
        (false, Phase::Unhealthy, ConditionStatus::False),
    ] {
        let w = World {
            verdict: Some(Verdict {
                healthy: healthy_now,
                latency: std::time::Duration::from_millis(37),
                auth_refused: false,
            }),
            get: Some(Ok(instance(InstanceState::Running))),
            ..world()
        };
        let (_, _, o) = run(&proxy(), &w);
        assert_eq!(o.status.phase, Some(phase));
        assert_eq!(healthy(&o), Some(cond));
        assert_eq!(o.status.latency_millis, Some(37));
    }
}

#[test]
fn a_vanished_instance_is_created_again_in_the_same_pass() {
    let w = World {
        get: Some(Err(fail(ErrorClass::NotFound, "gone"))),
        create: Some(Ok(ProviderId::new("id-2"))),
        ..world()
    };
    let (actions, _, o) = run(&proxy(), &w);
    assert_eq!(actions, ["Get", "Create"]);
    assert_eq!(o.status.provider_id, "id-2");
    assert_eq!(o.requeue, SECS(10));
}

#[test]
fn a_transient_get_error_leaves_a_ready_proxy_ready() {
    let mut p = proxy();
    let w = World {
        verdict: Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(5),
            auth_refused: false,
        }),
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    p.status = Some(run(&p, &w).2.status);
    assert_eq!(p.status.as_ref().unwrap().phase, Some(Phase::Ready));
    let w = World {
        get: Some(Err(fail(ErrorClass::Transient, "timeout"))),
        ..w
    };
    let (_, _, o) = run(&p, &w);
    assert_eq!(o.requeue, Requeue::Error("timeout".into()));
    assert_eq!(Some(o.status), p.status, "the status is untouched");
}

#[test]
fn steady_state_changes_nothing() {
    let mut p = proxy();
    let w = World {
        verdict: Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(5),
            auth_refused: false,
        }),
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    p.status = Some(run(&p, &w).2.status);
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["Get"]);
    assert_eq!(
        Some(o.status),
        p.status,
        "a second pass with the same facts writes no status"
    );
}

#[test]
fn without_a_verdict_yet_the_recorded_one_stands() {
    // A new leader's health engine has no verdict yet: the Ready Proxy stays Ready, unwritten.
    let mut p = proxy();
    let w = World {
        verdict: Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(5),
            auth_refused: false,
        }),
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    p.status = Some(run(&p, &w).2.status);
    let w = World { verdict: None, ..w };
    let (_, _, o) = run(&p, &w);
    assert_eq!(Some(o.status), p.status, "the status is untouched");
    // A fresh Proxy without one shows Running: up, not yet probed.
    let (_, _, o) = run(&proxy(), &w);
    assert_eq!(o.status.phase, Some(Phase::Running));
    assert_eq!(healthy(&o), None);
}

/// Review M2: an instance whose own mark names another Proxy (its UID) is neither used,
/// replaced nor deleted, whatever its state or the spec; a UID in another case is the same UID,
/// and a provider that records none names nobody.
#[test]
fn m2_an_instance_marked_as_another_proxys_is_never_used_nor_deleted() {
    let theirs = |state| Instance {
        uid: "uid-2".into(),
        ..instance(state)
    };
    for (p, state) in [
        (proxy(), InstanceState::Running),
        (proxy(), InstanceState::Stopped),
        (changed_spec(), InstanceState::Running),
    ] {
        let w = World {
            get: Some(Ok(theirs(state))),
            delete: Some(Ok(())),
            ..world()
        };
        let (actions, _, o) = run(&p, &w);
        assert_eq!(actions, ["Get"], "{state:?}");
        assert_eq!(
            provisioned(&o),
            Some((ConditionStatus::False, "PermanentError".into())),
            "{state:?}"
        );
        let (_, _, message) = provisioned_in_full(&o);
        assert!(
            message.contains("marked as Proxy UID uid-2's, not this Proxy's (uid-1)"),
            "{message}"
        );
        assert_eq!(o.status.ip, "", "{state:?}: its address is not published");
    }
    for uid in ["UID-1", ""] {
        let w = World {
            get: Some(Ok(Instance {
                uid: uid.into(),
                ..instance(InstanceState::Running)
            })),
            ..world()
        };
        let (actions, _, o) = run(&proxy(), &w);
        assert_eq!(actions, ["Get"], "{uid:?}");
        assert_eq!(o.status.ip, "10.0.0.7", "{uid:?}: used");
    }
    // Deleting the Proxy lets go of it without deleting it.
    let w = World {
        get: Some(Ok(theirs(InstanceState::Running))),
        ..world()
    };
    let (actions, _, o) = run(&deleting(), &w);
    assert_eq!(actions, ["Get", "RemoveFinalizer"]);
    assert_eq!(
        o.note,
        Some(Note::LeftToItsOwner {
            provider_id: "id-1".into(),
            owner: "uid-2".into()
        })
    );
}

fn changed_spec() -> Proxy {
    let mut p = proxy();
    p.spec.port = 8080;
    p
}

#[test]
fn a_spec_change_deletes_the_old_instance_first() {
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        delete: Some(Ok(())),
        ..world()
    };
    let (actions, _, o) = run(&changed_spec(), &w);
    assert_eq!(
        actions,
        ["Get", "Delete"],
        "no create while the old instance, with the same name, exists"
    );
    assert_eq!(o.status.provider_id, "id-1");
    assert_eq!(o.status.ip, "");
    assert_eq!((o.requeue, o.status.phase), (SECS(10), Some(Phase::Provisioning)));
}

#[test]
fn a_spec_change_creates_once_the_old_instance_is_gone() {
    let p = changed_spec();
    let w = World {
        get: Some(Err(fail(ErrorClass::NotFound, "gone"))),
        create: Some(Ok(ProviderId::new("id-2"))),
        ..world()
    };
    let (actions, all, o) = run(&p, &w);
    assert_eq!(actions, ["Get", "WriteSpecHash", "Create"]);
    assert_eq!(all[1], Action::WriteSpecHash(spec_hash(&p.spec, CLOUD_INIT.as_bytes())));
    assert_eq!(o.status.provider_id, "id-2");
}

#[test]
fn replacement_failures_go_through_provider_failure() {
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        delete: Some(Err(fail(ErrorClass::QuotaExceeded, "rate limited"))),
        ..world()
    };
    let (_, _, o) = run(&changed_spec(), &w);
    assert_eq!(o.requeue, SECS(300));
    let w = World {
        get: Some(Err(fail(ErrorClass::Transient, "timeout"))),
        ..world()
    };
    let (_, _, o) = run(&changed_spec(), &w);
    assert_eq!(o.requeue, Requeue::Error("timeout".into()));
}

#[test]
fn an_instance_without_a_recorded_hash_is_adopted_not_replaced() {
    let mut p = proxy();
    p.metadata.annotations = None;
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["WriteSpecHash", "Get"]);
    assert_eq!(o.status.phase, Some(Phase::Running));
}

// ---- adoption of another operator's instances -----------------------------------------------

/// The Go operator's hash (its form is not this operator's) over the current spec.
const GO_HASH: &str = "9f2c41d07a";

/// A Proxy as another operator leaves it: its hash annotation, an instance recorded, and the
/// Provisioned condition observed at `observed` with the spec at `generation`.
fn foreign(generation: i64, observed: Option<i64>) -> Proxy {
    let mut p = proxy();
    p.metadata.generation = Some(generation);
    p.metadata.annotations = Some([(ANNOTATION_SPEC_HASH.to_string(), GO_HASH.to_string())].into());
    let status = p.status.as_mut().unwrap();
    set_condition(
        &mut status.conditions,
        conditions::PROVISIONED,
        ConditionStatus::True,
        reasons::RUNNING,
        "the instance is running",
        observed,
        &at(10),
    );
    status.ip = "10.0.0.7".into();
    p
}

#[test]
fn another_operators_instance_over_the_reconciled_spec_is_adopted_not_replaced() {
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    for p in [
        foreign(3, Some(3)),
        // No observedGeneration anywhere: only an unedited spec is safe to take as built.
        foreign(1, None),
    ] {
        let (actions, all, o) = run(&p, &w);
        assert_eq!(actions, ["AdoptInstance", "Get"], "{:?}", p.metadata.generation);
        assert_eq!(
            all[0],
            Action::AdoptInstance {
                hash: spec_hash(&p.spec, CLOUD_INIT.as_bytes()),
                previous: GO_HASH.into(),
            }
        );
        assert_eq!(
            (o.status.phase, o.status.ip.as_str()),
            (Some(Phase::Running), "10.0.0.7")
        );
        assert_eq!(
            o.note,
            Some(Note::Adopted {
                provider_id: "id-1".into(),
                previous: GO_HASH.into()
            })
        );
    }
}

#[test]
fn this_operators_hash_from_before_the_version_prefix_is_adopted_too() {
    // Its pre-version value of this very spec is adopted whatever the status says.
    let mut p = foreign(2, Some(1));
    let prefixed = spec_hash(&p.spec, CLOUD_INIT.as_bytes());
    let unprefixed = prefixed.trim_start_matches("v1:").to_owned();
    p.metadata.annotations = Some([(ANNOTATION_SPEC_HASH.to_string(), unprefixed)].into());
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    let (actions, _, _) = run(&p, &w);
    assert_eq!(actions, ["AdoptInstance", "Get"]);
}

#[test]
fn another_operators_instance_booting_after_its_create_is_adopted() {
    let mut p = foreign(3, Some(3));
    set_condition(
        &mut p.status.as_mut().unwrap().conditions,
        conditions::PROVISIONED,
        ConditionStatus::False,
        reasons::PROVISIONING,
        egress_controller::proxy::decide::WAITING_TO_RUN,
        Some(3),
        &at(20),
    );
    let w = World {
        get: Some(Ok(instance(InstanceState::Provisioning))),
        ..world()
    };
    let (actions, _, _) = run(&p, &w);
    assert_eq!(actions, ["AdoptInstance", "Get"]);
}

#[test]
fn another_operators_replacement_under_way_is_finished_not_adopted() {
    // It had marked the instance for replacement at this generation, and its Delete had not
    // gone through: the instance is older than the spec.
    let replacing = |mut p: Proxy| {
        set_condition(
            &mut p.status.as_mut().unwrap().conditions,
            conditions::PROVISIONED,
            ConditionStatus::False,
            reasons::PROVISIONING,
            "replacing the instance after a spec change",
            Some(3),
            &at(20),
        );
        p
    };
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        delete: Some(Ok(())),
        ..world()
    };
    let (actions, _, _) = run(&replacing(foreign(3, Some(3))), &w);
    assert_eq!(actions, ["Get", "Delete"]);
    // The same with this operator's own pre-version value of an older spec.
    let mut p = replacing(foreign(3, Some(3)));
    let mut older = p.spec.clone();
    older.port = 8080;
    let unprefixed = spec_hash(&older, CLOUD_INIT.as_bytes())
        .trim_start_matches("v1:")
        .to_owned();
    p.metadata.annotations = Some([(ANNOTATION_SPEC_HASH.to_string(), unprefixed)].into());
    let (actions, _, _) = run(&p, &w);
    assert_eq!(actions, ["Get", "Delete"]);
    // A Healthy condition at the current generation says nothing of how the instance was built.
    let mut p = foreign(3, Some(2));
    set_condition(
        &mut p.status.as_mut().unwrap().conditions,
        conditions::HEALTHY,
        ConditionStatus::True,
        reasons::PROBE_SUCCEEDED,
        "the proxy carried the probe",
        Some(3),
        &at(30),
    );
    let (actions, _, _) = run(&p, &w);
    assert_eq!(actions, ["Get", "Delete"]);
}

#[test]
fn another_operators_instance_whose_spec_was_edited_since_is_replaced() {
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        delete: Some(Ok(())),
        ..world()
    };
    // Edited after the other operator last reconciled it, or edited with nothing to say which
    // generation was seen: replaced, as the other operator would have done.
    for p in [foreign(3, Some(2)), foreign(2, None)] {
        let (actions, _, o) = run(&p, &w);
        assert_eq!(actions, ["Get", "Delete"], "{:?}", p.metadata.generation);
        assert_eq!(o.note, None);
        assert_eq!(provisioned(&o).unwrap().1, reasons::PROVISIONING);
    }
    // A value of this operator's own form that differs is a spec change, however reconciled.
    let mut p = foreign(3, Some(3));
    p.metadata.annotations = Some([(ANNOTATION_SPEC_HASH.to_string(), format!("v1:{}", "0".repeat(64)))].into());
    let (actions, _, _) = run(&p, &w);
    assert_eq!(actions, ["Get", "Delete"]);
}

// ---- external path -------------------------------------------------------------------------

#[test]
fn an_external_proxy_reflects_its_verdict_without_provider_calls() {
    let mut p = proxy();
    p.spec = ProxySpec {
        mode: Mode::External,
        endpoint: Some(Endpoint {
            host: "10.1.1.1".into(),
            port: None,
        }),
        ..Default::default()
    };
    p.status = None;
    let (actions, _, o) = run(&p, &world());
    assert!(actions.is_empty());
    assert_eq!(
        (o.status.ip.as_str(), o.status.phase),
        ("10.1.1.1", Some(Phase::Pending))
    );
    assert_eq!(provisioned(&o), None, "External proxies have no Provisioned condition");
    let w = World {
        verdict: Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(3),
            auth_refused: false,
        }),
        ..world()
    };
    let (_, _, o) = run(&p, &w);
    assert_eq!(
        (o.status.phase, healthy(&o)),
        (Some(Phase::Ready), Some(ConditionStatus::True))
    );
    p.spec.endpoint = None;
    let (_, _, o) = run(&p, &world());
    assert_eq!(o.status.phase, Some(Phase::Failed));
}

#[test]
fn an_external_proxy_at_an_internal_destination_is_failed_without_its_old_verdict() {
    let mut p = proxy();
    p.spec = ProxySpec {
        mode: Mode::External,
        endpoint: Some(Endpoint {
            host: "169.254.169.254".into(),
            port: None,
        }),
        ..Default::default()
    };
    // It was Ready before the operator refused internal destinations.
    let ready = World {
        verdict: Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(3),
            auth_refused: false,
        }),
        ..world()
    };
    let (_, _, before) = run(&p, &ready);
    p.status = Some(before.status);
    let w = World {
        external_refused: Some(egress_controller::proxy::destinations::Refused::Destination(
            "spec.endpoint.host names \"169.254.169.254\", a link-local address".into(),
        )),
        ..ready.clone()
    };
    let (actions, _, o) = run(&p, &w);
    assert!(actions.is_empty(), "nothing is dialled or called");
    assert_eq!(o.status.phase, Some(Phase::Failed));
    assert_eq!(healthy(&o), None, "no verdict stands");
    let (status, reason, message) = provisioned_in_full(&o);
    assert_eq!((status, reason), (ConditionStatus::False, reasons::DESTINATION_REFUSED));
    assert!(message.contains("169.254.169.254"), "{message}");
    assert_eq!(o.requeue, Requeue::Never);
    // Allowlisted after a restart: the refusal goes, and the verdict counts again.
    p.status = Some(o.status);
    let (_, _, o) = run(&p, &ready);
    assert_eq!(provisioned(&o), None, "External proxies have no Provisioned condition");
    assert_eq!(o.status.phase, Some(Phase::Ready));
}

#[test]
fn an_external_proxy_whose_secret_does_not_name_it_is_refused_until_it_does() {
    let mut p = proxy();
    p.spec = ProxySpec {
        mode: Mode::External,
        endpoint: Some(Endpoint {
            host: "10.1.1.1".into(),
            port: None,
        }),
        ..Default::default()
    };
    p.status = None;
    let refusal = Refusal::NotNamed {
        secret: "vendor".into(),
        proxy: "p".into(),
    };
    // Even a passing probe (from before the refusal) does not make it Ready.
    let passing = Some(Verdict {
        healthy: true,
        latency: std::time::Duration::from_millis(3),
        auth_refused: false,
    });
    let w = World {
        verdict: passing,
        refused: Some(refusal.clone()),
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert!(actions.is_empty());
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::CREDENTIALS_ERROR.into()))
    );
    let message = &o
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Provisioned")
        .unwrap()
        .message;
    assert_eq!(message, &refusal.to_string());
    assert!(
        message.contains("crawl.example.com/proxies") && message.contains("\"vendor\""),
        "{message}"
    );
    assert_eq!((o.status.phase, healthy(&o)), (Some(Phase::Failed), None));
    assert_eq!(o.requeue, Requeue::Never, "the Secret's change enqueues it");
    // The Secret names it now: the refusal goes, and the verdict counts again.
    p.status = Some(o.status);
    let w = World {
        verdict: passing,
        ..world()
    };
    let (_, _, o) = run(&p, &w);
    assert_eq!(provisioned(&o), None, "External proxies have no Provisioned condition");
    assert_eq!(
        (o.status.phase, healthy(&o)),
        (Some(Phase::Ready), Some(ConditionStatus::True))
    );
}

// ---- delete path ---------------------------------------------------------------------------

fn deleting() -> Proxy {
    let mut p = proxy();
    p.metadata.deletion_timestamp = Some(at(500));
    p
}

#[test]
fn deletion_without_our_finalizer_or_without_an_instance() {
    let mut p = deleting();
    p.metadata.finalizers = Some(vec!["someone.else/finalizer".into()]);
    let (actions, _, o) = run(&p, &world());
    assert!(actions.is_empty());
    assert_eq!(o.status.phase, Some(Phase::Deleting));
    let mut p = deleting();
    p.status = None;
    let (actions, _, o) = run(&p, &world());
    assert_eq!(actions, ["RemoveFinalizer"]);
    assert_eq!(o.requeue, Requeue::Never);
}

#[test]
fn skip_cleanup_releases_without_any_provider_call_even_when_unconfigured() {
    let mut p = deleting();
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANNOTATION_SKIP_CLEANUP.into(), "true".into());
    let w = World {
        configured: false,
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["RemoveFinalizer"]);
    assert_eq!(
        o.note,
        Some(Note::SkipCleanup {
            provider_id: "id-1".into()
        })
    );
}

#[test]
fn deletion_needs_the_provider() {
    let w = World {
        configured: false,
        ..world()
    };
    let (actions, _, o) = run(&deleting(), &w);
    assert!(actions.is_empty());
    assert_eq!(
        o.requeue,
        Requeue::Error("provider \"kvm-home\" is not configured; cannot clean up instance id-1".into())
    );
}

/// A name, the world, the actions expected, the requeue and the note.
type DeletionRow = (&'static str, World, Vec<&'static str>, Requeue, Option<Note>);

#[test]
fn deletion_by_what_get_and_delete_answer() {
    let rows: Vec<DeletionRow> = vec![
        (
            "gone",
            World {
                get: Some(Err(fail(ErrorClass::NotFound, "gone"))),
                ..world()
            },
            vec!["Get", "RemoveFinalizer"],
            Requeue::Never,
            None,
        ),
        (
            "there",
            World {
                get: Some(Ok(instance(InstanceState::Running))),
                delete: Some(Ok(())),
                ..world()
            },
            vec!["Get", "Delete"],
            SECS(10),
            None,
        ),
        (
            "unreachable but deleted",
            World {
                get: Some(Err(fail(ErrorClass::Permanent, "no such host"))),
                delete: Some(Ok(())),
                ..world()
            },
            vec!["Get", "Delete", "RemoveFinalizer"],
            Requeue::Never,
            Some(Note::UnreachableButCleaned {
                provider_id: "id-1".into(),
                get_error: "no such host".into(),
            }),
        ),
        (
            "unreachable and undeletable",
            World {
                get: Some(Err(fail(ErrorClass::Permanent, "no such host"))),
                delete: Some(Err(fail(ErrorClass::Permanent, "denied"))),
                ..world()
            },
            vec!["Get", "Delete"],
            Requeue::Error("no such host; denied".into()),
            None,
        ),
        (
            "get transient",
            World {
                get: Some(Err(fail(ErrorClass::Transient, "timeout"))),
                ..world()
            },
            vec!["Get"],
            Requeue::Error("timeout".into()),
            None,
        ),
        (
            "delete quota",
            World {
                get: Some(Ok(instance(InstanceState::Running))),
                delete: Some(Err(fail(ErrorClass::QuotaExceeded, "slow down"))),
                ..world()
            },
            vec!["Get", "Delete"],
            SECS(300),
            None,
        ),
        (
            "delete permanent never gives up",
            World {
                get: Some(Ok(instance(InstanceState::Running))),
                delete: Some(Err(fail(ErrorClass::Permanent, "denied"))),
                ..world()
            },
            vec!["Get", "Delete"],
            Requeue::Error("denied".into()),
            None,
        ),
    ];
    for (name, w, want, requeue, note) in rows {
        let (actions, _, o) = run(&deleting(), &w);
        assert_eq!(actions, want, "{name}");
        assert_eq!(o.requeue, requeue, "{name}");
        assert_eq!(o.note, note, "{name}");
        assert_eq!(o.status.phase, Some(Phase::Deleting), "{name}");
    }
}

// ---- rows added after review: failure classes on every provider call, and ordering ---------

fn ready_proxy() -> Proxy {
    let mut p = proxy();
    let w = World {
        verdict: Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(5),
            auth_refused: false,
        }),
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    p.status = Some(run(&p, &w).2.status);
    assert_eq!(p.status.as_ref().unwrap().phase, Some(Phase::Ready));
    p
}

#[test]
fn observing_failures_by_class() {
    let rows = [
        (
            ErrorClass::QuotaExceeded,
            SECS(300),
            Some(Phase::Pending),
            Some(reasons::QUOTA_EXCEEDED),
        ),
        (
            ErrorClass::Permanent,
            Requeue::Never,
            Some(Phase::Failed),
            Some(reasons::PERMANENT_ERROR),
        ),
    ];
    for (class, requeue, phase, reason) in rows {
        let w = World {
            get: Some(Err(fail(class, "backend says no"))),
            ..world()
        };
        let (actions, _, o) = run(&proxy(), &w);
        assert_eq!(actions, ["Get"], "{class:?}");
        assert_eq!((o.requeue.clone(), o.status.phase), (requeue, phase), "{class:?}");
        assert_eq!(provisioned(&o).map(|(_, r)| r), reason.map(str::to_string), "{class:?}");
    }
}

#[test]
fn a_stopped_instance_whose_delete_fails() {
    let p = ready_proxy();
    let stopped = World {
        get: Some(Ok(instance(InstanceState::Stopped))),
        ..world()
    };
    let quota = World {
        delete: Some(Err(fail(ErrorClass::QuotaExceeded, "slow down"))),
        ..stopped.clone()
    };
    let (_, _, o) = run(&p, &quota);
    assert_eq!(o.requeue, SECS(300));
    assert_eq!(o.status.ip, "");
    assert_eq!(healthy(&o), None, "no address, no health verdict");
    let permanent = World {
        delete: Some(Err(fail(ErrorClass::Permanent, "denied"))),
        ..stopped.clone()
    };
    let (_, _, o) = run(&p, &permanent);
    assert_eq!((o.requeue, o.status.phase), (Requeue::Never, Some(Phase::Failed)));
    let transient = World {
        delete: Some(Err(fail(ErrorClass::Transient, "timeout"))),
        ..stopped
    };
    let (_, _, o) = run(&p, &transient);
    assert_eq!(o.requeue, Requeue::Error("timeout".into()));
    assert_eq!(
        Some(o.status),
        p.status,
        "a transient failure leaves the fetched status, untouched"
    );
}

#[test]
fn a_vanished_instance_whose_create_fails_transiently_changes_nothing() {
    let p = ready_proxy();
    let w = World {
        get: Some(Err(fail(ErrorClass::NotFound, "gone"))),
        create: Some(Err(fail(ErrorClass::Transient, "timeout"))),
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["Get", "Create"]);
    assert_eq!(Some(o.status), p.status);
}

#[test]
fn replacement_failures_by_class() {
    let mut p = ready_proxy();
    p.spec.port = 8080;
    let old = World {
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    let rows = [
        (
            World {
                get: Some(Err(fail(ErrorClass::Permanent, "bad id"))),
                ..world()
            },
            Requeue::Never,
            Some(Phase::Failed),
        ),
        (
            World {
                delete: Some(Err(fail(ErrorClass::Permanent, "denied"))),
                ..old.clone()
            },
            Requeue::Never,
            Some(Phase::Failed),
        ),
    ];
    for (w, requeue, phase) in rows {
        let (_, _, o) = run(&p, &w);
        assert_eq!((o.requeue, o.status.phase), (requeue, phase));
    }
    let w = World {
        delete: Some(Err(fail(ErrorClass::Transient, "timeout"))),
        ..old
    };
    let (_, _, o) = run(&p, &w);
    assert_eq!(o.requeue, Requeue::Error("timeout".into()));
    assert_eq!(Some(o.status), p.status);
}

#[test]
fn more_deletion_rows() {
    let rows: Vec<DeletionRow> = vec![
        (
            "get quota",
            World {
                get: Some(Err(fail(ErrorClass::QuotaExceeded, "slow"))),
                ..world()
            },
            vec!["Get"],
            SECS(300),
            None,
        ),
        (
            "delete transient",
            World {
                get: Some(Ok(instance(InstanceState::Running))),
                delete: Some(Err(fail(ErrorClass::Transient, "reset"))),
                ..world()
            },
            vec!["Get", "Delete"],
            Requeue::Error("reset".into()),
            None,
        ),
        (
            "get permanent then delete quota",
            World {
                get: Some(Err(fail(ErrorClass::Permanent, "no such host"))),
                delete: Some(Err(fail(ErrorClass::QuotaExceeded, "slow"))),
                ..world()
            },
            vec!["Get", "Delete"],
            SECS(300),
            None,
        ),
    ];
    for (name, w, want, requeue, note) in rows {
        let (actions, _, o) = run(&deleting(), &w);
        assert_eq!(actions, want, "{name}");
        assert_eq!(o.requeue, requeue, "{name}");
        assert_eq!(o.note, note, "{name}");
    }
}

#[test]
fn the_provider_lookup_comes_before_the_secret_and_the_latch_before_both() {
    let w = World {
        configured: false,
        ..world()
    };
    let (actions, _, o) = run(&with_secret(proxy()), &w);
    assert!(
        actions.is_empty(),
        "no secret read for an unconfigured provider: {actions:?}"
    );
    assert_eq!(provisioned(&o).unwrap().1, reasons::PROVIDER_NOT_CONFIGURED);
    let mut latched = proxy();
    let status = latched.status.as_mut().unwrap();
    set_condition(
        &mut status.conditions,
        conditions::PROVISIONED,
        ConditionStatus::False,
        reasons::PERMANENT_ERROR,
        "bad image",
        Some(1),
        &at(0),
    );
    let (_, _, o) = run(&latched, &w);
    assert_eq!(
        o.status.conditions[0].message, "bad image",
        "the latch is kept as it was"
    );
}

#[test]
fn a_changed_secret_content_replaces_the_instance() {
    let p = with_secret(proxy());
    // The recorded hash was computed from the inline text; the Secret now says something else.
    let w = World {
        secret: Some(Ok("new content".into())),
        get: Some(Ok(instance(InstanceState::Running))),
        delete: Some(Ok(())),
        ..world()
    };
    let (actions, _, _) = run(&p, &w);
    assert_eq!(actions, ["ReadSecret", "Get", "Delete"]);
}

#[test]
fn an_unavailable_secret_is_retried_without_touching_the_status() {
    let p = with_secret(ready_proxy());
    let w = World {
        secret: Some(Err(SecretProblem::Unavailable("the API server timed out".into()))),
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["ReadSecret"]);
    assert_eq!(o.requeue, Requeue::Error("the API server timed out".into()));
    assert_eq!(Some(o.status), p.status);
}

#[test]
fn an_external_proxy_without_an_endpoint_is_latched_failed() {
    let mut p = proxy();
    p.spec = ProxySpec {
        mode: Mode::External,
        ..Default::default()
    };
    p.status = None;
    let (_, _, o) = run(&p, &world());
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::PERMANENT_ERROR.into()))
    );
    assert_eq!((o.requeue, o.status.phase), (Requeue::Never, Some(Phase::Failed)));
}

/// Item 54: a running instance that reports no address for a while (a guest-agent restart)
/// keeps its last address and Provisioned=True, and is polled at the provisioning period,
/// for 30 s from the first pass that found it without one; then it is booting. One that never
/// had an address shown is booting at once.
#[test]
fn a_running_instance_that_loses_its_address_keeps_it_for_the_grace_period() {
    let ready = ready_proxy();
    let shown = ready.status.clone().unwrap();
    let running_without_ip = Instance {
        ip: None,
        ..instance(InstanceState::Running)
    };
    for answer in [instance(InstanceState::Provisioning), running_without_ip] {
        // The first pass to see it, and one 29 s after: kept, as shown, still Ready.
        for since in [None, Some(at(1000 - 29))] {
            let w = World {
                get: Some(Ok(answer.clone())),
                missing_since: since.clone(),
                ..world()
            };
            let (actions, _, o) = run(&ready, &w);
            assert_eq!(actions, ["Get"]);
            assert_eq!(o.requeue, SECS(10), "{since:?}");
            assert_eq!(o.status.ip, shown.ip, "{since:?}");
            assert_eq!(o.status.phase, Some(Phase::Ready), "{since:?}");
            assert_eq!(provisioned(&o), provisioned_of(&shown), "{since:?}");
        }
        // 30 s after the first: booting, the address gone.
        let w = World {
            get: Some(Ok(answer.clone())),
            missing_since: Some(at(1000 - 30)),
            ..world()
        };
        let (_, _, o) = run(&ready, &w);
        assert_eq!(o.status.ip, "");
        assert_eq!(o.status.phase, Some(Phase::Provisioning));
        assert_eq!(provisioned(&o).map(|(s, _)| s), Some(ConditionStatus::False));
    }
    // Never had one shown: booting at once, whatever the memory says.
    let w = World {
        get: Some(Ok(instance(InstanceState::Provisioning))),
        missing_since: None,
        ..world()
    };
    let (_, _, o) = run(&proxy(), &w);
    assert_eq!((o.status.ip.as_str(), o.status.phase), ("", Some(Phase::Provisioning)));
}

/// An instance that has gone the provisioning timeout (15 minutes by default) without an
/// address is replaced, whether it never had one or lost it; the message names the timeout.
/// With the timeout off (`--provisioning-timeout=0`) it waits for good, as in Go.
#[test]
fn an_instance_without_an_address_for_the_provisioning_timeout_is_replaced() {
    let running_without_ip = Instance {
        ip: None,
        ..instance(InstanceState::Running)
    };
    for (p, answer) in [
        (proxy(), instance(InstanceState::Provisioning)),
        (proxy(), running_without_ip.clone()),
        (ready_proxy(), instance(InstanceState::Provisioning)),
    ] {
        let w = World {
            get: Some(Ok(answer.clone())),
            delete: Some(Ok(())),
            missing_since: Some(at(1000 - 899)),
            ..world()
        };
        let (actions, _, o) = run(&p, &w);
        assert_eq!(actions, ["Get"], "one second short");
        assert_eq!(o.status.phase, Some(Phase::Provisioning));
        let w = World {
            missing_since: Some(at(1000 - 900)),
            ..w
        };
        let (actions, _, o) = run(&p, &w);
        assert_eq!(actions, ["Get", "Delete"]);
        assert_eq!(o.status.ip, "");
        assert_eq!(o.requeue, SECS(10));
        assert_eq!(
            provisioned_in_full(&o),
            (
                ConditionStatus::False,
                reasons::PROVISIONING,
                "the instance has had no address for 900s (the provisioning timeout); replacing it"
            )
        );
        let off = World {
            missing_since: Some(at(-100_000)),
            timings: Some(Timings {
                address_budget: None,
                ..Timings::default()
            }),
            ..w
        };
        let (actions, _, o) = run(&p, &off);
        assert_eq!(actions, ["Get"], "no timeout: waits for good");
        assert_eq!(o.status.phase, Some(Phase::Provisioning));
    }
}

#[test]
fn a_verdict_while_booting_is_ignored() {
    let w = World {
        verdict: Some(Verdict {
            healthy: true,
            latency: std::time::Duration::from_millis(5),
            auth_refused: false,
        }),
        get: Some(Ok(instance(InstanceState::Provisioning))),
        ..world()
    };
    let (_, _, o) = run(&proxy(), &w);
    assert_eq!(o.status.phase, Some(Phase::Provisioning));
    assert_eq!(healthy(&o), None);
    assert_eq!(o.status.latency_millis, None);
}

/// A Generated Proxy with no instance yet, its hash current.
fn generated() -> Proxy {
    let mut p = proxy();
    p.spec.credentials = Some(egress_api::Credentials {
        type_: egress_api::CredentialsType::Generated,
        secret_ref: None,
    });
    let hash = spec_hash(&p.spec, CLOUD_INIT.as_bytes());
    p.metadata.annotations = Some([(ANNOTATION_SPEC_HASH.to_string(), hash)].into());
    p.status = Some(ProxyStatus::default());
    p
}

fn minted() -> ProxyCredentials {
    ProxyCredentials::new(Credentials::generate(), "proxy-x-credentials")
}

#[test]
fn generated_credentials_are_prepared_before_the_create_and_bound_after_it() {
    let c = minted();
    let w = World {
        credentials: vec![Ok(Prepared::Ready(c.clone()))],
        create: Some(Ok(ProviderId::new("id-9"))),
        bind: Some(Ok(())),
        ..world()
    };
    let (actions, all, o) = run(&generated(), &w);
    assert_eq!(actions, ["PrepareCredentials", "Create", "BindCredentials"]);
    assert_eq!(
        all[1],
        Action::Create {
            cloud_init: CLOUD_INIT.into(),
            credentials: Some(c),
        }
    );
    assert_eq!(all[2], Action::BindCredentials(ProviderId::new("id-9")));
    assert_eq!(o.status.provider_id, "id-9");
    assert_eq!((o.requeue, o.status.phase), (SECS(10), Some(Phase::Provisioning)));
    // The status holds no credentials of any kind.
    let shown = serde_json::to_string(&o.status).unwrap();
    assert!(!shown.contains(all_password(&all)), "{shown}");
}

fn all_password(actions: &[Action]) -> &str {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Create {
                credentials: Some(c), ..
            } => Some(c.credentials.password()),
            _ => None,
        })
        .unwrap()
}

#[test]
fn a_proxy_without_generated_credentials_prepares_none() {
    let mut p = generated();
    p.spec.credentials = None;
    let hash = spec_hash(&p.spec, CLOUD_INIT.as_bytes());
    p.metadata.annotations = Some([(ANNOTATION_SPEC_HASH.to_string(), hash)].into());
    let w = World {
        create: Some(Ok(ProviderId::new("id-9"))),
        ..world()
    };
    let (actions, all, _) = run(&p, &w);
    assert_eq!(actions, ["Create"]);
    assert!(matches!(&all[0], Action::Create { credentials: None, .. }));
}

#[test]
fn a_credentials_secret_that_cannot_be_used_blocks_the_create_with_its_reason() {
    let w = World {
        credentials: vec![Err(SecretProblem::Unusable(
            "Secret \"s\" exists and is not owned by this Proxy".into(),
        ))],
        ..world()
    };
    let (actions, _, o) = run(&generated(), &w);
    assert_eq!(actions, ["PrepareCredentials"]);
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::CREDENTIALS_ERROR.into()))
    );
    assert_eq!(o.requeue, SECS(120));
}

#[test]
fn an_unanswered_credentials_read_or_bind_retries_and_changes_nothing() {
    let fetched = generated();
    let w = World {
        credentials: vec![Err(SecretProblem::Unavailable("reading Secret: timeout".into()))],
        ..world()
    };
    let (actions, _, o) = run(&fetched, &w);
    assert_eq!(actions, ["PrepareCredentials"]);
    assert!(matches!(o.requeue, Requeue::Error(_)));
    assert_eq!(Some(&o.status), fetched.status.as_ref());
    // The create succeeded but its credentials were not recorded: nothing is recorded either,
    // so the next pass creates again (the provider answers with this instance) and binds.
    let w = World {
        credentials: vec![Ok(Prepared::Ready(minted()))],
        create: Some(Ok(ProviderId::new("id-9"))),
        bind: Some(Err(SecretProblem::Unavailable("annotating Secret: timeout".into()))),
        ..world()
    };
    let (actions, _, o) = run(&fetched, &w);
    assert_eq!(actions, ["PrepareCredentials", "Create", "BindCredentials"]);
    assert!(matches!(o.requeue, Requeue::Error(_)));
    assert_eq!(o.status.provider_id, "");
}

#[test]
fn a_bound_instance_that_still_exists_keeps_its_credentials_and_is_adopted() {
    // The status write after the last create was lost (or a new leader took over): the Secret
    // names an instance the status does not record.
    let c = minted();
    let w = World {
        credentials: vec![Ok(Prepared::Bound {
            instance: ProviderId::new("id-9"),
            credentials: Some(c.clone()),
        })],
        bound_get: Some(Ok(instance(InstanceState::Provisioning))),
        create: Some(Ok(ProviderId::new("id-9"))),
        bind: Some(Ok(())),
        ..world()
    };
    let (actions, all, o) = run(&generated(), &w);
    assert_eq!(actions, ["PrepareCredentials", "GetBound", "Create", "BindCredentials"]);
    assert_eq!(all[0], Action::PrepareCredentials { gone: None });
    assert_eq!(all[1], Action::GetBound(ProviderId::new("id-9")));
    assert_eq!(
        all[2],
        Action::Create {
            cloud_init: CLOUD_INIT.into(),
            credentials: Some(c),
        }
    );
    assert_eq!(o.status.provider_id, "id-9");
}

#[test]
fn a_bound_instance_that_is_gone_gets_new_credentials() {
    let fresh = minted();
    let w = World {
        credentials: vec![
            Ok(Prepared::Bound {
                instance: ProviderId::new("id-9"),
                credentials: Some(minted()),
            }),
            Ok(Prepared::Ready(fresh.clone())),
        ],
        bound_get: Some(Err(fail(ErrorClass::NotFound, "no such instance"))),
        create: Some(Ok(ProviderId::new("id-10"))),
        bind: Some(Ok(())),
        ..world()
    };
    let (actions, all, o) = run(&generated(), &w);
    assert_eq!(
        actions,
        [
            "PrepareCredentials",
            "GetBound",
            "PrepareCredentials",
            "Create",
            "BindCredentials"
        ]
    );
    assert_eq!(
        all[2],
        Action::PrepareCredentials {
            gone: Some(ProviderId::new("id-9"))
        }
    );
    assert!(matches!(&all[3], Action::Create { credentials: Some(c), .. } if *c == fresh));
    assert_eq!(o.status.provider_id, "id-10");
}

#[test]
fn a_bound_instance_the_provider_cannot_answer_for_blocks_the_create() {
    let w = World {
        credentials: vec![Ok(Prepared::Bound {
            instance: ProviderId::new("id-9"),
            credentials: Some(minted()),
        })],
        bound_get: Some(Err(fail(ErrorClass::Transient, "hypervisor unreachable"))),
        ..world()
    };
    let (actions, _, o) = run(&generated(), &w);
    assert_eq!(actions, ["PrepareCredentials", "GetBound"]);
    assert!(matches!(o.requeue, Requeue::Error(_)), "{:?}", o.requeue);
}

#[test]
fn a_recorded_instance_seen_gone_is_named_when_preparing_its_successors_credentials() {
    let mut p = generated();
    p.status = Some(ProxyStatus {
        provider_id: "id-1".into(),
        ..Default::default()
    });
    let w = World {
        get: Some(Err(fail(ErrorClass::NotFound, "gone"))),
        credentials: vec![Ok(Prepared::Ready(minted()))],
        create: Some(Ok(ProviderId::new("id-2"))),
        bind: Some(Ok(())),
        ..world()
    };
    let (actions, all, o) = run(&p, &w);
    assert_eq!(actions, ["Get", "PrepareCredentials", "Create", "BindCredentials"]);
    assert_eq!(
        all[1],
        Action::PrepareCredentials {
            gone: Some(ProviderId::new("id-1"))
        }
    );
    assert_eq!(o.status.provider_id, "id-2");
}

#[test]
fn a_bound_instance_the_provider_refuses_to_look_up_counts_as_gone() {
    let w = World {
        credentials: vec![
            Ok(Prepared::Bound {
                instance: ProviderId::new("edited by hand"),
                credentials: Some(minted()),
            }),
            Ok(Prepared::Ready(minted())),
        ],
        bound_get: Some(Err(fail(ErrorClass::Permanent, "not an id of this entry"))),
        create: Some(Ok(ProviderId::new("id-9"))),
        bind: Some(Ok(())),
        ..world()
    };
    let (actions, all, _) = run(&generated(), &w);
    assert_eq!(
        actions,
        [
            "PrepareCredentials",
            "GetBound",
            "PrepareCredentials",
            "Create",
            "BindCredentials"
        ]
    );
    assert_eq!(
        all[2],
        Action::PrepareCredentials {
            gone: Some(ProviderId::new("edited by hand"))
        }
    );
}

#[test]
fn a_bound_instance_whose_credentials_were_damaged_is_replaced_before_new_ones() {
    let w = World {
        credentials: vec![Ok(Prepared::Bound {
            instance: ProviderId::new("id-9"),
            credentials: None,
        })],
        bound_get: Some(Ok(instance(InstanceState::Running))),
        delete: Some(Ok(())),
        ..world()
    };
    let (actions, all, o) = run(&generated(), &w);
    assert_eq!(actions, ["PrepareCredentials", "GetBound", "Delete"]);
    assert_eq!(all[2], Action::Delete(ProviderId::new("id-9")));
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::PROVISIONING.into()))
    );
    assert_eq!((o.status.provider_id.as_str(), o.requeue), ("", SECS(10)));
}

#[test]
fn a_secret_that_names_yet_another_instance_when_read_again_ends_the_pass() {
    let w = World {
        credentials: vec![
            Ok(Prepared::Bound {
                instance: ProviderId::new("id-9"),
                credentials: Some(minted()),
            }),
            Ok(Prepared::Bound {
                instance: ProviderId::new("id-10"),
                credentials: Some(minted()),
            }),
        ],
        bound_get: Some(Err(fail(ErrorClass::NotFound, "gone"))),
        ..world()
    };
    let fetched = generated();
    let (actions, _, o) = run(&fetched, &w);
    assert_eq!(actions, ["PrepareCredentials", "GetBound", "PrepareCredentials"]);
    assert!(matches!(o.requeue, Requeue::Error(_)));
    assert_eq!(Some(&o.status), fetched.status.as_ref());
}

/// A Generated Proxy whose instance `id-1` is recorded and running.
fn generated_running() -> Proxy {
    let mut p = generated();
    p.status = Some(ProxyStatus {
        provider_id: "id-1".into(),
        ..Default::default()
    });
    p
}

#[test]
fn a_running_generated_instance_is_trusted_while_its_secret_serves_it() {
    // The cache shows it: no read.
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        cached: true,
        ..world()
    };
    let (actions, _, o) = run(&generated_running(), &w);
    assert_eq!(actions, ["Get"]);
    assert_eq!(o.status.phase, Some(Phase::Running));
    // The cache does not (yet): the API server is asked, and answers that it does.
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        check: Some(Ok(Serving::Yes)),
        ..world()
    };
    let (actions, all, o) = run(&generated_running(), &w);
    assert_eq!(actions, ["Get", "CheckCredentials"]);
    assert_eq!(all[1], Action::CheckCredentials(ProviderId::new("id-1")));
    assert_eq!(
        (o.status.phase, o.status.ip.as_str()),
        (Some(Phase::Running), "10.0.0.7")
    );
}

#[test]
fn a_running_instance_made_with_credentials_whose_bind_did_not_land_binds_them() {
    // A replacement on a provider whose ids come from the name: the status still named the id
    // when the bind after the create failed.
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        check: Some(Ok(Serving::Unbound)),
        bind: Some(Ok(())),
        ..world()
    };
    let (actions, all, o) = run(&generated_running(), &w);
    assert_eq!(actions, ["Get", "CheckCredentials", "BindCredentials"]);
    assert_eq!(all[2], Action::BindCredentials(ProviderId::new("id-1")));
    assert_eq!(o.status.phase, Some(Phase::Running));
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        check: Some(Ok(Serving::Unbound)),
        bind: Some(Err(SecretProblem::Unavailable("annotating Secret: timeout".into()))),
        ..world()
    };
    let fetched = generated_running();
    let (_, _, o) = run(&fetched, &w);
    assert!(matches!(o.requeue, Requeue::Error(_)));
    assert_eq!(Some(&o.status), fetched.status.as_ref());
}

#[test]
fn a_running_generated_instance_whose_secret_was_lost_is_replaced() {
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        check: Some(Ok(Serving::No)),
        delete: Some(Ok(())),
        ..world()
    };
    let (actions, all, o) = run(&generated_running(), &w);
    assert_eq!(actions, ["Get", "CheckCredentials", "Delete"]);
    assert_eq!(all[2], Action::Delete(ProviderId::new("id-1")));
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::PROVISIONING.into()))
    );
    let (_, _, message) = provisioned_in_full(&o);
    assert!(message.contains("credentials Secret"), "{message}");
    assert_eq!((o.status.provider_id.as_str(), o.status.ip.as_str()), ("id-1", ""));
    assert_eq!(o.requeue, SECS(10));
    // The check cannot be made: nothing changes, and it is retried.
    let fetched = generated_running();
    let w = World {
        get: Some(Ok(instance(InstanceState::Running))),
        check: Some(Err(SecretProblem::Unavailable("reading Secret: timeout".into()))),
        ..world()
    };
    let (actions, _, o) = run(&fetched, &w);
    assert_eq!(actions, ["Get", "CheckCredentials"]);
    assert!(matches!(o.requeue, Requeue::Error(_)));
    assert_eq!(Some(&o.status), fetched.status.as_ref());
}

#[test]
fn a_refusal_of_the_probes_credentials_is_its_own_healthy_reason() {
    let w = World {
        verdict: Some(Verdict {
            healthy: false,
            latency: std::time::Duration::from_millis(3),
            auth_refused: true,
        }),
        get: Some(Ok(instance(InstanceState::Running))),
        ..world()
    };
    let (_, _, o) = run(&proxy(), &w);
    let healthy = o
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::HEALTHY)
        .unwrap();
    assert_eq!(
        (healthy.status, healthy.reason.as_str()),
        (ConditionStatus::False, reasons::PROXY_AUTH_REQUIRED)
    );
    // Read back from the status (a new leader), it is the same verdict.
    let back = egress_controller::proxy::status::last_verdict(&o.status).unwrap();
    assert!(back.auth_refused && !back.healthy);
}

/// A Ready member of a ProxyPool: the pool label and the pool as its controller.
fn pool_member() -> Proxy {
    let mut p = ready_proxy();
    p.metadata.labels = Some([(egress_api::LABEL_POOL.to_string(), "fleet".to_string())].into());
    p.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: egress_api::API_VERSION.into(),
        kind: "ProxyPool".into(),
        name: "fleet".into(),
        uid: "uid-pool".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    p
}

/// docs/pools.md: a pool member's lost instance is not rebuilt by its reconciler (its pool
/// promotes a standby and deletes the member), so one failure makes one create. The loss is
/// reported, and the id kept so that no later pass creates either.
#[test]
fn a_pool_members_lost_instance_is_reported_not_rebuilt() {
    let budget = Timings {
        address_budget: Some(Duration::from_secs(900)),
        ..Timings::default()
    };
    let without_address = Instance {
        ip: None,
        ..instance(InstanceState::Running)
    };
    for (answer, missing_since, message) in [
        (
            Err(fail(ErrorClass::NotFound, "gone")),
            None,
            "the instance is gone; the pool replaces this member",
        ),
        (
            Ok(instance(InstanceState::Stopped)),
            None,
            "the instance stopped; the pool replaces this member",
        ),
        (
            Ok(instance(InstanceState::Terminated)),
            None,
            "the instance stopped; the pool replaces this member",
        ),
        (
            Ok(without_address),
            Some(at(1000 - 900)),
            "the instance has had no address for 900s (the provisioning timeout); the pool replaces this member",
        ),
    ] {
        let w = World {
            get: Some(answer),
            create: Some(Ok(ProviderId::new("id-2"))),
            delete: Some(Ok(())),
            missing_since,
            timings: Some(budget),
            ..world()
        };
        let (actions, _, o) = run(&pool_member(), &w);
        assert_eq!(actions, ["Get"], "{message}");
        assert_eq!(o.status.provider_id, "id-1", "{message}");
        assert_eq!(o.status.ip, "");
        assert_eq!(o.requeue, SECS(120));
        assert_eq!(
            provisioned_in_full(&o),
            (ConditionStatus::False, reasons::INSTANCE_LOST, message)
        );
        // A Proxy outside any pool rebuilds, as before; so does one that only has the label.
        let (actions, _, _) = run(&ready_proxy(), &w);
        assert_ne!(actions, ["Get"], "{message}");
        let mut labelled = pool_member();
        labelled.metadata.owner_references = None;
        let (actions, _, _) = run(&labelled, &w);
        assert_ne!(actions, ["Get"], "{message}");
    }
}

// ---- the create budget -----------------------------------------------------------------------

fn deferred(wait: Duration) -> Option<Deferral> {
    Some(Deferral { wait, per_minute: 3 })
}

#[test]
fn a_create_over_the_budget_waits_for_a_token_and_says_so() {
    let mut p = proxy();
    p.status = None;
    // The wait is shown in whole seconds, rounded up; the requeue is the wait itself.
    let rows = [
        (Duration::from_secs(20), "about 20s"),
        (Duration::from_millis(11_200), "about 12s"),
        (Duration::from_millis(1), "about 1s"),
    ];
    for (wait, shown) in rows {
        let w = World {
            deferred: deferred(wait),
            ..world()
        };
        let (actions, _, o) = run(&p, &w);
        assert_eq!(actions, ["Create"], "the create was asked for; the budget deferred it");
        assert_eq!(
            provisioned_in_full(&o),
            (
                ConditionStatus::False,
                reasons::CREATE_BUDGET,
                format!("waiting for provider entry \"kvm-home\"'s create budget (3 per minute); {shown}").as_str()
            )
        );
        assert_eq!(o.requeue, Requeue::After(wait));
        assert_eq!(o.status.phase, Some(Phase::Pending), "waiting is not failing");
        assert!(o.status.provider_id.is_empty() && o.status.ip.is_empty());
        assert_eq!(o.note, None);
    }
}

#[test]
fn a_deferred_create_is_never_latched() {
    let mut p = proxy();
    p.status = None;
    let w = World {
        deferred: deferred(Duration::from_secs(20)),
        ..world()
    };
    let (_, _, waiting) = run(&p, &w);
    // The next pass, on the status the wait wrote, with a token there: it creates.
    p.status = Some(waiting.status);
    let w = World {
        create: Some(Ok(ProviderId::new("id-9"))),
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["Create"]);
    assert_eq!(o.status.provider_id, "id-9");
    assert_eq!(
        provisioned(&o),
        Some((ConditionStatus::False, reasons::PROVISIONING.into()))
    );
    assert_eq!(o.status.phase, Some(Phase::Provisioning));
}

#[test]
fn a_vanished_instance_whose_create_waits_is_forgotten_and_unprobed() {
    let mut p = ready_proxy();
    p.status.as_mut().unwrap().ip = "10.0.0.7".into();
    let w = World {
        get: Some(Err(fail(ErrorClass::NotFound, "gone"))),
        deferred: deferred(Duration::from_secs(5)),
        ..world()
    };
    let (actions, _, o) = run(&p, &w);
    assert_eq!(actions, ["Get", "Create"]);
    assert_eq!(provisioned(&o).unwrap().1, reasons::CREATE_BUDGET);
    // The gone instance is not kept: the next pass goes straight to the create.
    assert!(
        o.status.provider_id.is_empty() && o.status.ip.is_empty(),
        "{:?}",
        o.status
    );
    assert_eq!(healthy(&o), None, "no instance, no verdict");
    assert_eq!(o.status.phase, Some(Phase::Pending));
}

#[test]
fn generated_credentials_prepared_before_a_deferred_create_are_kept_for_the_next() {
    let c = minted();
    // The pass that waits: the credentials are prepared (written to their Secret), then the
    // create is deferred; nothing is bound.
    let w = World {
        credentials: vec![Ok(Prepared::Ready(c.clone()))],
        deferred: deferred(Duration::from_secs(20)),
        ..world()
    };
    let (actions, _, waiting) = run(&generated(), &w);
    assert_eq!(actions, ["PrepareCredentials", "Create"]);
    assert_eq!(provisioned(&waiting).unwrap().1, reasons::CREATE_BUDGET);
    // The pass after it: the Secret, still bound to no instance, is read again and its
    // credentials reused (`credentials::plan` answers `Reuse`; its unit tests cover that), and
    // the instance is made with them.
    let mut p = generated();
    p.status = Some(waiting.status);
    let w = World {
        credentials: vec![Ok(Prepared::Ready(c.clone()))],
        create: Some(Ok(ProviderId::new("id-9"))),
        bind: Some(Ok(())),
        ..world()
    };
    let (actions, all, o) = run(&p, &w);
    assert_eq!(actions, ["PrepareCredentials", "Create", "BindCredentials"]);
    assert_eq!(
        all[1],
        Action::Create {
            cloud_init: CLOUD_INIT.into(),
            credentials: Some(c),
        }
    );
    assert_eq!(o.status.provider_id, "id-9");
}

// ---- the installation mark (issue 51) -----------------------------------------------------

/// What marking `id-1` with installation `blue` asks of the provider.
fn mark_blue() -> Action {
    Action::MarkInstallation {
        id: ProviderId::new("id-1"),
        installation: "blue".into(),
    }
}

fn marked_blue() -> Option<Marked> {
    Some(Marked {
        provider_id: "id-1".into(),
        installation: "blue".into(),
    })
}

/// An operator running as `blue`, its Proxy's instance running with the mark `mark`, and the
/// provider answering a mark with `answer`.
fn as_blue(mark: Option<&str>, answer: Option<Result<(), ProviderFailure>>) -> World {
    World {
        installation: Some("blue"),
        get: Some(Ok(Instance {
            installation: mark.map(str::to_owned),
            ..instance(InstanceState::Running)
        })),
        mark: answer,
        ..world()
    }
}

#[test]
fn an_unmarked_running_instance_is_marked_once_and_the_pass_ends_as_without_the_mark() {
    let (actions, all, o) = run(&proxy(), &as_blue(None, Some(Ok(()))));
    assert_eq!(actions, ["Get", "MarkInstallation"]);
    assert_eq!(all[1], mark_blue());
    assert_eq!(o.marked, marked_blue());
    let unmarking = World {
        installation: None,
        ..as_blue(None, None)
    };
    let (actions, _, plain) = run(&proxy(), &unmarking);
    assert_eq!(actions, ["Get"], "an operator without an installation marks nothing");
    assert_eq!(plain.marked, None);
    assert_eq!(
        (o.status, o.requeue),
        (plain.status, plain.requeue),
        "marking changed the pass's end"
    );
}

#[test]
fn an_instance_carrying_a_mark_is_left_alone_whoever_it_names() {
    // Another installation's instance is that installation's: never marked again.
    for mark in ["blue", "green"] {
        let (actions, _, o) = run(&proxy(), &as_blue(Some(mark), None));
        assert_eq!(actions, ["Get"], "{mark}");
        assert_eq!(o.marked, None, "{mark}");
        assert_eq!(o.status.phase, Some(Phase::Running), "{mark}");
    }
    // An empty mark is no mark.
    let (actions, _, _) = run(&proxy(), &as_blue(Some(""), Some(Ok(()))));
    assert_eq!(actions, ["Get", "MarkInstallation"]);
}

#[test]
fn a_failed_mark_blocks_nothing_and_the_next_pass_asks_again() {
    let (_, _, plain) = run(&proxy(), &as_blue(None, Some(Ok(()))));
    for class in [ErrorClass::Transient, ErrorClass::Permanent, ErrorClass::NotFound] {
        let (actions, _, o) = run(&proxy(), &as_blue(None, Some(Err(fail(class, "denied")))));
        assert_eq!(actions, ["Get", "MarkInstallation"], "{class:?}");
        assert_eq!(o.marked, None, "{class:?}: said to be marked");
        assert_eq!(
            (&o.status, &o.requeue),
            (&plain.status, &plain.requeue),
            "{class:?}: the failure changed the pass"
        );
        // The next pass knows nothing of this one: it asks again.
        let (again, _, _) = run(&proxy(), &as_blue(None, Some(Ok(()))));
        assert_eq!(again, ["Get", "MarkInstallation"], "{class:?}");
    }
}

#[test]
fn only_a_running_instance_of_this_proxy_is_marked() {
    for state in [
        InstanceState::Provisioning,
        InstanceState::Stopped,
        InstanceState::Terminated,
    ] {
        let w = World {
            get: Some(Ok(instance(state))),
            delete: Some(Ok(())),
            ..as_blue(None, None)
        };
        let (actions, _, o) = run(&proxy(), &w);
        assert!(!actions.contains(&"MarkInstallation"), "{state:?}: {actions:?}");
        assert_eq!(o.marked, None);
    }
    // Another Proxy's instance (review M2) is not this Proxy's to mark either.
    let w = World {
        get: Some(Ok(Instance {
            uid: "uid-2".into(),
            ..instance(InstanceState::Running)
        })),
        ..as_blue(None, None)
    };
    assert_eq!(run(&proxy(), &w).0, ["Get"]);
    // Nor is an instance being deleted with its Proxy, nor one being replaced.
    let w = World {
        delete: Some(Ok(())),
        ..as_blue(None, None)
    };
    assert_eq!(run(&deleting(), &w).0, ["Get", "Delete"]);
    assert_eq!(run(&changed_spec(), &w).0, ["Get", "Delete"]);
}

#[test]
fn an_adopted_instance_is_marked_in_the_same_pass_and_both_are_said() {
    let (actions, _, o) = run(&foreign(3, Some(3)), &as_blue(None, Some(Ok(()))));
    assert_eq!(actions, ["AdoptInstance", "Get", "MarkInstallation"]);
    assert_eq!(
        o.note,
        Some(Note::Adopted {
            provider_id: "id-1".into(),
            previous: GO_HASH.into()
        })
    );
    assert_eq!(o.marked, marked_blue());
}
