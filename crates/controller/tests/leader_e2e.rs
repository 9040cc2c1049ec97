//! Leader election against egress-kube-testserver's Leases.

use std::time::Duration;

use egress_controller::leader::{ElectionTimings, Elector, LEASE_NAME};
use egress_kube_testserver::TestServer;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const LIVENESS: Duration = Duration::from_secs(20);

fn timings() -> ElectionTimings {
    ElectionTimings {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(800),
        retry_period: Duration::from_millis(100),
    }
}

async fn becomes(rx: &mut watch::Receiver<bool>, want: bool) {
    tokio::time::timeout(LIVENESS, rx.wait_for(|v| *v == want))
        .await
        .expect("leadership changes")
        .unwrap();
}

#[tokio::test]
async fn one_leader_then_a_takeover_after_the_lease_runs_out() {
    let server = TestServer::builder().namespace("system").start().await.unwrap();
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "system");
    let a_stop = CancellationToken::new();
    let (_a, mut a_rx) = Elector::new(api.clone(), LEASE_NAME, "a", timings()).run(a_stop.clone());
    becomes(&mut a_rx, true).await;

    // While a renews, b cannot take the lease.
    let mut b = Elector::new(api.clone(), LEASE_NAME, "b", timings());
    assert!(!b.try_acquire_or_renew().await.unwrap());

    // a stops without releasing; b takes over once the lease has run out.
    a_stop.cancel();
    let (_b, mut b_rx) = Elector::new(api.clone(), LEASE_NAME, "b", timings()).run(CancellationToken::new());
    becomes(&mut b_rx, true).await;
    let lease = api.get(LEASE_NAME).await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("b"));
    assert_eq!(lease.lease_transitions, Some(1));
    assert_eq!(lease.lease_duration_seconds, Some(1));

    // Someone else writes the lease: b notices it no longer leads.
    let intruder = json!({"spec": {"holderIdentity": "c", "renewTime": "2099-01-01T00:00:00.000000Z"}});
    api.patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(intruder))
        .await
        .unwrap();
    becomes(&mut b_rx, false).await;
}

#[tokio::test]
async fn two_candidates_starting_together_elect_one() {
    let server = TestServer::builder().namespace("system").start().await.unwrap();
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "system");
    let mut a = Elector::new(api.clone(), LEASE_NAME, "a", timings());
    let mut b = Elector::new(api.clone(), LEASE_NAME, "b", timings());
    let (ra, rb) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
    assert_ne!(ra.unwrap(), rb.unwrap(), "exactly one wins");
}
