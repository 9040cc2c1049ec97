//! The first generation's health check: on the shared connection, a probe still out when the
//! round ends is abandoned (not cut off: the connection stays for the calls sharing it), and
//! until it returns the next rounds say so instead of stacking probes.

use egress_libvirt::testing as support;

use std::time::Duration;

use egress_conformance::CallKind;
use egress_libvirt::engine::Generation;
use egress_libvirt::engine::check::REASON_LIBVIRT_ERROR;
use egress_provider::{Checker, OpCtx, REASON_TIMEOUT};
use support::{FakeBackend, HOSTS};

#[tokio::test]
async fn a_slow_probe_is_abandoned_and_the_next_round_waits_for_it() {
    let b = FakeBackend::new(Generation::Kvm).await;
    let p = b.provider("kvm-home", b.config(false)).unwrap();
    let gate = b.interceptor.freeze(CallKind("ConnectGetLibVersion"));
    // The round ends while the first host's probe is held.
    let token = egress_provider::CancellationToken::new();
    let round = {
        let (p, cx) = (p.clone(), OpCtx::with_cancel(token.clone()));
        tokio::spawn(async move { p.check(&cx).await })
    };
    gate.entered().await;
    token.cancel();
    let first = round.await.unwrap();
    assert_eq!(first[0].name, HOSTS[0]);
    assert_eq!(first[0].reason, REASON_TIMEOUT, "{first:?}");
    // The next round finds that probe still out: no second probe of that host.
    let calls = b.interceptor.call_log().len();
    let second = p.check(&OpCtx::background()).await;
    assert_eq!(second[0].reason, REASON_TIMEOUT);
    assert!(second[0].message.contains("still waiting"), "{second:?}");
    // The other host was probed as usual.
    assert!(second[1].ready, "{second:?}");
    let probed = b.interceptor.call_log()[calls..]
        .iter()
        .filter(|c| c.kind.0 == "ConnectGetLibVersion")
        .count();
    assert_eq!(probed, 1, "only the second host was probed");
    // Once libvirt answers, the host reads ready again.
    gate.release();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = p.check(&OpCtx::background()).await;
        if status[0].ready {
            assert_eq!(status[0].details["poolCapacity"], "200.0GiB");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{status:?}");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn reasons_and_details_are_the_first_generations() {
    let b = FakeBackend::new(Generation::Kvm).await;
    let p = b.provider("kvm-home", b.config(false)).unwrap();
    b.interceptor.fail(
        CallKind("StoragePoolGetInfo"),
        egress_conformance::Fault::PermissionDenied,
        egress_conformance::Times::Once,
    );
    let status = p.check(&OpCtx::background()).await;
    let failed = status.iter().find(|s| !s.ready).expect("one host failed");
    assert_eq!(failed.reason, REASON_LIBVIRT_ERROR);
    // Details only from a probe that went through.
    assert!(!failed.details.contains_key("libvirtVersion"), "{failed:?}");
    let ok = status.iter().find(|s| s.ready).expect("one host ready");
    for key in [
        "libvirtVersion",
        "hostname",
        "poolState",
        "poolCapacity",
        "poolAvailable",
    ] {
        assert!(ok.details.contains_key(key), "{key}: {ok:?}");
    }
}
