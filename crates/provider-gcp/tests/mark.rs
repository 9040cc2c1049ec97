//! The gcp provider's `mark_installation` against the fake Compute server: what the suite
//! cannot see (the setLabels request, its fingerprint, the wait for its operation, a label
//! written by someone else between the read and the write).

mod support;

use std::time::Duration;

use egress_conformance::CallKind;
use egress_provider::{ErrorClass, LABEL_INSTALLATION, OpCtx, Provider, ProviderId};
use egress_provider_gcp::{GcpProvider, WireOptions};
use support::fake::{DEFAULT_OPERATION_TIME, FakeCompute};
use support::{GcpBackend, ZONE, request_in};

fn cx() -> OpCtx {
    OpCtx::background().with_timeout(Duration::from_secs(30))
}

/// A created instance, moved on the fake's clock until its insert is done, and its name.
async fn made(b: &GcpBackend, p: &GcpProvider, uid: &str) -> (ProviderId, String) {
    let req = request_in(uid, ZONE);
    let id = p.create(&cx(), &req).await.expect("create");
    b.fake.advance(DEFAULT_OPERATION_TIME);
    (id, req.name)
}

/// The labels and fingerprint the fake holds for `name`.
fn labels_of(fake: &FakeCompute, name: &str) -> (std::collections::BTreeMap<String, String>, String) {
    fake.with(|w| {
        let vm = w.vm(name).expect("the instance");
        (vm.labels.clone(), vm.label_fingerprint.clone())
    })
}

#[tokio::test]
async fn a_mark_sends_every_label_with_the_fingerprint_read_and_waits_for_its_operation() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let (id, name) = made(&b, &p, "mark-1").await;
    let (before, fingerprint) = labels_of(&b.fake, &name);
    p.mark_installation(&cx(), &id, "blue").await.expect("mark");

    let seen = b.fake.with(|w| w.seen());
    let set = seen
        .iter()
        .position(|s| s.method == "POST" && s.path.ends_with(&format!("/instances/{name}/setLabels")))
        .expect("a setLabels request");
    let body = seen[set].body.clone().expect("a body");
    let mut want = before.clone();
    want.insert(LABEL_INSTALLATION.to_owned(), "blue".to_owned());
    assert_eq!(
        body["labels"],
        serde_json::json!(want),
        "every label, the installation's added"
    );
    assert_eq!(body["labelFingerprint"], fingerprint.as_str());
    // The operation was read until done before the mark returned.
    assert!(
        seen[set + 1..]
            .iter()
            .any(|s| s.method == "GET" && s.path.contains("/operations/")),
        "the setLabels operation was not waited for: {seen:?}"
    );
    let (after, new_fingerprint) = labels_of(&b.fake, &name);
    assert_eq!(after, want);
    assert_ne!(
        new_fingerprint, fingerprint,
        "the fake gives changed labels a new fingerprint"
    );
    assert_eq!(p.get(&cx(), &id).await.unwrap().installation.as_deref(), Some("blue"));
}

#[tokio::test]
async fn a_label_written_between_the_read_and_the_write_is_kept_and_the_mark_retried() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let (id, name) = made(&b, &p, "mark-2").await;
    // Someone labels the instance while the mark's setLabels is on its way.
    let gate = b.fake.interceptor().freeze(CallKind("setLabels"));
    let meddle = async {
        gate.entered().await;
        b.fake.with(|w| {
            w.vm(&name)
                .expect("the instance")
                .labels
                .insert("team".into(), "crawl".into());
            w.relabelled(&name);
        });
        gate.release();
    };
    let during = cx();
    let (marked, ()) = tokio::join!(p.mark_installation(&during, &id, "blue"), meddle);
    let e = marked.expect_err("a stale fingerprint");
    assert_eq!(e.class(), ErrorClass::Transient, "{e}");
    assert_eq!(
        labels_of(&b.fake, &name).0.get("team").map(String::as_str),
        Some("crawl")
    );
    // The next mark reads again: both labels stay.
    p.mark_installation(&cx(), &id, "blue").await.expect("the retried mark");
    let (labels, _) = labels_of(&b.fake, &name);
    assert_eq!(
        (
            labels.get("team").map(String::as_str),
            labels.get(LABEL_INSTALLATION).map(String::as_str)
        ),
        (Some("crawl"), Some("blue"))
    );
}

#[tokio::test]
async fn another_installations_mark_written_meanwhile_is_never_replaced() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let (id, name) = made(&b, &p, "mark-3").await;
    let gate = b.fake.interceptor().freeze(CallKind("setLabels"));
    let meddle = async {
        gate.entered().await;
        b.fake.with(|w| {
            w.vm(&name)
                .expect("the instance")
                .labels
                .insert(LABEL_INSTALLATION.into(), "green".into());
            w.relabelled(&name);
        });
        gate.release();
    };
    let during = cx();
    let (marked, ()) = tokio::join!(p.mark_installation(&during, &id, "blue"), meddle);
    assert_eq!(marked.expect_err("a stale fingerprint").class(), ErrorClass::Transient);
    let e = p
        .mark_installation(&cx(), &id, "blue")
        .await
        .expect_err("another installation's instance");
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert_eq!(
        labels_of(&b.fake, &name).0.get(LABEL_INSTALLATION).map(String::as_str),
        Some("green")
    );
}

#[tokio::test]
async fn an_instance_whose_insert_still_runs_is_not_yet_markable_and_a_missing_one_is_not_found() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    b.fake.with(|w| w.stall_inserts(true));
    let id = p.create(&cx(), &request_in("mark-4", ZONE)).await.expect("create");
    let e = p
        .mark_installation(&cx(), &id, "blue")
        .await
        .expect_err("no instance yet");
    assert_eq!(e.class(), ErrorClass::Transient, "{e}");
    let never = ProviderId::new(format!("zones/{ZONE}/instances/proxy-never-made"));
    let e = p
        .mark_installation(&cx(), &never, "blue")
        .await
        .expect_err("never made");
    assert_eq!(e.class(), ErrorClass::NotFound, "{e}");
    let seen = b.fake.with(|w| w.seen());
    assert!(
        !seen.iter().any(|s| s.path.ends_with("/setLabels")),
        "a setLabels was sent for an instance that is not there: {seen:?}"
    );
}
