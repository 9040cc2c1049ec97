//! Leader election against egress-kube-testserver's Leases.

use std::time::Duration;

use egress_controller::leader::{ElectionTimings, Elector, LEASE_NAME};
use egress_kube_testserver::{Fault, TestServer, Verb};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const LIVENESS: Duration = Duration::from_secs(30);

/// Short, but with room for a busy two-core machine: a renewal takes milliseconds here.
fn timings() -> ElectionTimings {
    ElectionTimings {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    }
}

fn elector(api: &Api<Lease>, identity: &str) -> Elector {
    Elector::new(api.clone(), LEASE_NAME, identity, timings()).unwrap()
}

async fn becomes(rx: &mut watch::Receiver<bool>, want: bool) {
    tokio::time::timeout(LIVENESS, rx.wait_for(|v| *v == want))
        .await
        .expect("leadership changes")
        .unwrap();
}

async fn setup() -> (TestServer, Api<Lease>) {
    let server = TestServer::builder().namespace("system").start().await.unwrap();
    let api = Api::namespaced(server.client().unwrap(), "system");
    (server, api)
}

#[test]
fn inconsistent_timings_are_refused() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_s, api) = setup().await;
        let bad = ElectionTimings {
            renew_deadline: Duration::from_secs(5),
            ..timings()
        };
        let err = Elector::new(api, LEASE_NAME, "a", bad).unwrap_err();
        assert!(err.contains("lease duration > renew deadline > retry period"), "{err}");
    });
}

#[tokio::test]
async fn while_the_leader_renews_nobody_else_takes_the_lease() {
    let (_s, api) = setup().await;
    let (_a, mut a_rx) = elector(&api, "a").run(CancellationToken::new());
    becomes(&mut a_rx, true).await;
    // b campaigns while a keeps renewing, for well over two lease durations: waited out on a's
    // own writes (its renew time passing a mark), not on a timer. b never leads meanwhile.
    let (_b, b_rx) = elector(&api, "b").run(CancellationToken::new());
    let mark = k8s_openapi::jiff::Timestamp::now() + timings().lease_duration * 2 + Duration::from_millis(500);
    let renewed_past_mark = move |l: Option<&Lease>| {
        l.and_then(|l| l.spec.as_ref())
            .and_then(|s| s.renew_time.as_ref())
            .is_some_and(|t| t.0 >= mark)
    };
    tokio::time::timeout(
        LIVENESS,
        kube::runtime::wait::await_condition(api.clone(), LEASE_NAME, renewed_past_mark),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        !b_rx.has_changed().unwrap() && !*b_rx.borrow(),
        "b must not lead while a renews"
    );
    let holder = api.get(LEASE_NAME).await.unwrap().spec.unwrap().holder_identity;
    assert_eq!(holder.as_deref(), Some("a"));
    assert!(*a_rx.borrow());
}

#[tokio::test]
async fn a_takeover_after_the_leader_stops_and_loss_when_someone_else_writes_it() {
    let (_s, api) = setup().await;
    let a_stop = CancellationToken::new();
    let (_a, mut a_rx) = elector(&api, "a").run(a_stop.clone());
    becomes(&mut a_rx, true).await;
    a_stop.cancel();
    becomes(&mut a_rx, false).await;
    // a stopped without releasing; b takes over once the lease has run out.
    let (_b, mut b_rx) = elector(&api, "b").run(CancellationToken::new());
    becomes(&mut b_rx, true).await;
    let lease = api.get(LEASE_NAME).await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("b"));
    assert_eq!(lease.lease_transitions, Some(1));
    assert_eq!(lease.lease_duration_seconds, Some(3));
    // Someone else writes the lease: b notices it no longer leads.
    let intruder = json!({"spec": {"holderIdentity": "c", "renewTime": "2099-01-01T00:00:00.000000Z"}});
    api.patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(intruder))
        .await
        .unwrap();
    becomes(&mut b_rx, false).await;
}

#[tokio::test]
async fn a_leader_that_cannot_renew_steps_down_by_the_renew_deadline() {
    let (server, api) = setup().await;
    let (_a, mut a_rx) = elector(&api, "a").run(CancellationToken::new());
    becomes(&mut a_rx, true).await;
    server
        .faults()
        .inject(Fault::fail(Verb::Get, "leases", 500).times(10_000));
    becomes(&mut a_rx, false).await;
    server.faults().clear();
}

#[tokio::test]
async fn a_deleted_lease_is_not_free_while_its_holder_was_seen_renewing() {
    let (_s, api) = setup().await;
    let (_a, mut a_rx) = elector(&api, "a").run(CancellationToken::new());
    becomes(&mut a_rx, true).await;
    let mut b = elector(&api, "b");
    assert!(!b.try_acquire_or_renew().await.unwrap(), "b sees a holding");
    api.delete(LEASE_NAME, &Default::default()).await.unwrap();
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "a was seen renewing: b waits out the lease"
    );
}

#[tokio::test]
async fn two_candidates_starting_together_elect_one() {
    let (_s, api) = setup().await;
    let mut a = elector(&api, "a");
    let mut b = elector(&api, "b");
    let (ra, rb) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
    assert_ne!(ra.unwrap(), rb.unwrap(), "exactly one wins");
}
