//! B. create.

use crate::hooks::BackendHooks as _;
use std::time::Duration;

use egress_provider::{ErrorClass, InstanceState, LABEL_MANAGED, LABEL_MANAGED_YES, LABEL_UID};

use crate::harness::{CaseResult, Scenario, require};
use crate::hooks::{Fault, SeedManaged, SeedSpec, Times};
use crate::target::{ConformanceTarget, CreateReturn, GcMark, Quota};

use super::{assert_class, assert_no_calls_since, calls_so_far, expect_err, expect_ok, owned, promptly, uid};

/// CT-B01 (CR3, GT7): the returned id alone lets a fresh provider over the same backend find the instance.
pub async fn ct_b01_id_is_self_contained<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let u = uid("b01");
    let id = expect_ok("create", s.provider().create(&s.cx(), &s.request(&u)).await);
    let fresh = s.provider();
    let inst = expect_ok("get on a fresh provider", fresh.get(&s.cx(), &id).await);
    assert_eq!(inst.uid, u, "the fresh provider read another UID");
    assert_eq!(inst.id, id);
    Ok(())
}

/// CT-B02 (CR1): a repeated create returns the same id and creates nothing more.
pub async fn ct_b02_create_is_idempotent<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let req = s.request(&uid("b02"));
    let p = s.provider();
    let a = expect_ok("first create", p.create(&s.cx(), &req).await);
    let b = expect_ok("second create", p.create(&s.cx(), &req).await);
    assert_eq!(a, b, "a repeated create returned another id");
    assert_one_instance_set(&s, &req.name).await
}

/// Asserts exactly one instance named `name` exists, and no secondary kind is duplicated.
async fn assert_one_instance_set<T: ConformanceTarget>(s: &Scenario<T>, name: &str) -> CaseResult {
    let inv = s.hooks().inventory().await?;
    let instances: Vec<_> = inv.iter().filter(|o| o.kind == "instance").collect();
    assert_eq!(
        instances.iter().filter(|o| o.owner == name).count(),
        1,
        "expected exactly one instance named {name}: {instances:?}"
    );
    assert_eq!(instances.len(), 1, "another instance appeared: {instances:?}");
    for kind in &s.fixtures.secondary_kinds {
        assert!(
            owned(&inv, name, kind).len() <= 1,
            "secondary {kind} duplicated: {inv:?}"
        );
    }
    Ok(())
}

/// CT-B03 (GN1, CR1): two concurrent creates of one name both succeed with one id and one instance.
pub async fn ct_b03_concurrent_creates_same_name<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let req = s.request(&uid("b03"));
    let p = s.provider();
    let gate = s.hooks().freeze(s.fixtures.calls.create_instance).await.ok();
    let (cx1, cx2) = (s.cx(), s.cx());
    let first = p.create(&cx1, &req);
    let second = p.create(&cx2, &req);
    let release = async {
        if let Some(g) = &gate {
            g.entered().await;
            // NB: the gate holds one call; this pause only gives the other
            // create time to reach the backend or the provider's own lock.
            tokio::time::sleep(Duration::from_millis(200)).await;
            g.release();
        }
    };
    let (a, b, ()) = tokio::join!(first, second, release);
    let a = expect_ok("first concurrent create", a);
    let b = expect_ok("second concurrent create", b);
    assert_eq!(a, b, "concurrent creates returned different ids");
    assert_one_instance_set(&s, &req.name).await
}

/// CT-B04 (CR1): create adopts an existing marked instance of the same name and UID.
pub async fn ct_b04_create_adopts_existing_by_name<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let req = s.request(&uid("b04"));
    s.hooks().seed(SeedSpec::marked(&req.name, &req.uid)).await?;
    let id = expect_ok(
        "create over a seeded instance",
        s.provider().create(&s.cx(), &req).await,
    );
    assert_eq!(id, s.id_for(&req.name), "create did not address the seeded instance");
    assert_one_instance_set(&s, &req.name).await
}

/// CT-B05 (CR2): the marks are on the instance from the call that creates it.
pub async fn ct_b05_marks_written_in_the_create_call<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(
        s.profile.gc_mark != GcMark::MarkWindow,
        "marks are written in a documented window",
    )?;
    let req = s.request(&uid("b05"));
    let p = s.provider();
    let check_marks = |inv: &[crate::hooks::BackendObject]| {
        let inst = owned(inv, &req.name, "instance");
        assert_eq!(inst.len(), 1, "no instance named {} after creating it", req.name);
        assert_eq!(
            inst[0].marks.get(LABEL_MANAGED).map(String::as_str),
            Some(LABEL_MANAGED_YES)
        );
        assert_eq!(inst[0].marks.get(LABEL_UID), Some(&req.uid));
    };
    let log_before = s.hooks().call_log().await?.len();
    expect_ok("create", p.create(&s.cx(), &req).await);
    check_marks(&s.hooks().inventory().await?);
    // A submit provider: nothing after the creating call may touch the instance.
    if s.profile.create_return == CreateReturn::Submit {
        let log = s.hooks().call_log().await?;
        let calls = &log[log_before..];
        let creating = calls
            .iter()
            .position(|c| c.kind == s.fixtures.calls.create_instance)
            .expect("the creating call is in the log");
        let later: Vec<_> = calls[creating + 1..]
            .iter()
            .filter(|c| c.target.contains(&req.name))
            .collect();
        assert!(
            later.is_empty(),
            "calls after the creating one touched the instance: {later:?}"
        );
    }
    Ok(())
}

/// CT-B06 (CR4): get right after create is never NotFound.
pub async fn ct_b06_get_after_create_is_not_notfound<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let lag = s.hooks().read_lag(Duration::from_secs(2)).await.is_ok();
    let p = s.provider();
    let id = expect_ok("create", p.create(&s.cx(), &s.request(&uid("b06"))).await);
    if let Err(e) = p.get(&s.cx(), &id).await {
        assert_ne!(
            e.class(),
            ErrorClass::NotFound,
            "get after create said NotFound (read lag {lag}): {e}"
        );
    }
    Ok(())
}

/// CT-B07 (CR7): a placement that can never work is Permanent, names field and value, and calls nothing.
pub async fn ct_b07_unsatisfiable_placement_rejected_before_backend<T: ConformanceTarget>(
    s: Scenario<T>,
) -> CaseResult {
    require(
        !s.fixtures.invalid_placements.is_empty(),
        "the provider ignores placement",
    )?;
    let p = s.provider();
    let before = calls_so_far(&s).await?;
    for (placement, field, value) in s.fixtures.invalid_placements.clone() {
        let mut req = s.request(&uid("b07"));
        req.placement = placement;
        let e = expect_err(&format!("create with bad {field}"), p.create(&s.cx(), &req).await);
        assert_class(&format!("bad {field}"), &e, ErrorClass::Permanent);
        let text = e.to_string();
        assert!(text.contains(field), "the message does not name {field}: {text}");
        assert!(
            value.is_empty() || text.contains(&value),
            "the message does not name {value:?}: {text}"
        );
    }
    assert_no_calls_since(&s, before, "a bad placement").await
}

/// CT-B08 (CR12): create never answers NotFound, whichever of its calls says not found.
pub async fn ct_b08_create_never_returns_notfound<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    for kind in s.fixtures.calls.create_steps.clone() {
        let req = s.request(&uid("b08"));
        s.hooks().fail(kind, Fault::NotFound, Times::Once).await?;
        match p.create(&s.cx(), &req).await {
            Ok(_) => {}
            Err(e) => {
                assert_ne!(
                    e.class(),
                    ErrorClass::NotFound,
                    "create said NotFound when {kind} did: {e}"
                );
                assert_class(&format!("not-found in {kind}"), &e, s.profile.create_not_found_class);
                if e.class() == ErrorClass::Transient {
                    expect_ok(
                        "create retried after a transient not-found",
                        p.create(&s.cx(), &req).await,
                    );
                }
            }
        }
        s.hooks().clear_faults().await?;
    }
    Ok(())
}

/// CT-B09 (§1.6 quota): a capacity fault is QuotaExceeded (or the documented class when undetectable).
pub async fn ct_b09_quota_signal_is_quota_class<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let faults = match s.profile.quota {
        Quota::Detected => vec![
            (Fault::Quota, ErrorClass::QuotaExceeded),
            (Fault::RateLimit, ErrorClass::QuotaExceeded),
        ],
        Quota::Absent(class) => vec![(Fault::Quota, class)],
    };
    for (fault, class) in faults {
        s.hooks()
            .fail(s.fixtures.calls.create_instance, fault.clone(), Times::Once)
            .await?;
        let e = expect_err(
            &format!("create with {fault:?}"),
            p.create(&s.cx(), &s.request(&uid("b09"))).await,
        );
        assert_class(&format!("create with {fault:?}"), &e, class);
    }
    Ok(())
}

/// CT-B10 (CR10): cloud-init reaches the backend byte for byte.
pub async fn ct_b10_cloud_init_delivered_byte_for_byte<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(
        s.profile.delivers_cloud_init,
        "the provider does not deliver cloud-init",
    )?;
    let mut req = s.request(&uid("b10"));
    // CRLF, trailing blanks, non-ASCII text, bytes that are not UTF-8 at all (as in gzip
    // user-data), and no final newline.
    let mut bytes =
        "\r\n#cloud-config\r\n# a comment  \r\nwrite_files:   \r\n  - content: \"naïve ☃ 東京\"\r\n    path: /x\r\n#"
            .as_bytes()
            .to_vec();
    bytes.extend_from_slice(&[0x1f, 0x8b, 0xff, 0xfe, 0x80, 0x00, 0x7f]);
    req.cloud_init = bytes;
    expect_ok("create", s.provider().create(&s.cx(), &req).await);
    let inv = s.hooks().inventory().await?;
    let delivered: Vec<_> = inv
        .iter()
        .filter(|o| o.owner == req.name)
        .filter_map(|o| o.user_data.as_ref())
        .collect();
    assert!(
        delivered.iter().any(|d| d.as_slice() == req.cloud_init.as_slice()),
        "no object carries the cloud-init bytes unchanged: {delivered:?}"
    );
    Ok(())
}

/// CT-B11 (CR6): a blocking create cut off at any step resumes without duplicates.
pub async fn ct_b11_blocking_create_resumes_after_each_step<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(
        s.profile.create_return == CreateReturn::Blocking,
        "create returns on submit",
    )?;
    let p = s.provider();
    for kind in s.fixtures.calls.create_steps.clone() {
        let req = s.request(&uid("b11"));
        s.hooks().fail(kind, Fault::Server5xx, Times::Once).await?;
        let _ = p.create(&s.cx(), &req).await;
        s.hooks().clear_faults().await?;
        expect_ok(&format!("create after {kind} failed"), p.create(&s.cx(), &req).await);
        let inv = s.hooks().inventory().await?;
        assert_eq!(owned(&inv, &req.name, "instance").len(), 1, "after {kind} failed");
        for k in &s.fixtures.secondary_kinds {
            assert!(
                owned(&inv, &req.name, k).len() <= 1,
                "{k} duplicated after {kind} failed"
            );
        }
    }
    Ok(())
}

/// CT-B12 (CR6, GT5): create returns as its profile says (running when blocking; promptly on submit).
pub async fn ct_b12_create_return_matches_profile<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    match s.profile.create_return {
        CreateReturn::Blocking => {
            let id = expect_ok("create", p.create(&s.cx(), &s.request(&uid("b12"))).await);
            let inst = expect_ok("get", p.get(&s.cx(), &id).await);
            assert_ne!(
                inst.state,
                InstanceState::Stopped,
                "a blocking create returned before the instance ran"
            );
        }
        CreateReturn::Submit => {
            s.hooks().hold_new_instances_pending(true).await?;
            let req = s.request(&uid("b12"));
            expect_ok("create", promptly("a submit create", p.create(&s.cx(), &req)).await);
        }
    }
    Ok(())
}

/// CT-B13 (§7 adoption guard): create refuses an instance of its name with another UID or without the mark.
pub async fn ct_b13_adoption_guard<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(s.profile.adoption_guard, "the provider declares no adoption guard")?;
    let p = s.provider();
    let req = s.request(&uid("b13"));
    s.hooks().seed(SeedSpec::marked(&req.name, "someone-else")).await?;
    let e = expect_err("create over another Proxy's instance", p.create(&s.cx(), &req).await);
    assert_class("adoption of another UID", &e, ErrorClass::Permanent);
    let text = e.to_string();
    assert!(
        text.contains("someone-else") && text.contains(&req.uid),
        "the message must name both UIDs: {text}"
    );
    let req2 = s.request(&uid("b13"));
    s.hooks()
        .seed(SeedSpec::marked(&req2.name, &req2.uid).managed(SeedManaged::No))
        .await?;
    let e = expect_err("create over an unmanaged instance", p.create(&s.cx(), &req2).await);
    assert_class("adoption of an unmanaged instance", &e, ErrorClass::Permanent);
    assert!(
        e.to_string().contains("not managed"),
        "the message must say it is not managed: {e}"
    );
    let inv = s.hooks().inventory().await?;
    let seeded = owned(&inv, &req.name, "instance");
    assert_eq!(seeded.len(), 1);
    assert_eq!(
        seeded[0].marks.get(LABEL_UID).map(String::as_str),
        Some("someone-else"),
        "the seeded instance was touched"
    );
    Ok(())
}
