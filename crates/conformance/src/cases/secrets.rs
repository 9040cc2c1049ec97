//! H. Secrets.

use crate::hooks::BackendHooks as _;
use std::error::Error as _;

use egress_provider::ProviderError;

use crate::harness::{CaseResult, Scenario};
use crate::hooks::{Fault, Times};
use crate::target::ConformanceTarget;
use crate::{SENTINEL_CI, SENTINEL_CRED};

use super::mark::{mark_soon, own_mark};
use super::{expect_ok, uid};

/// Fails the case when `sentinel` appears in the error's text, debug form or source chain.
fn assert_error_clean(e: &ProviderError, sentinel: &str) {
    let mut texts = vec![e.to_string(), format!("{e:?}")];
    let mut next = e.source();
    while let Some(src) = next {
        texts.push(format!("{src} {src:?}"));
        next = src.source();
    }
    for t in texts {
        assert!(!t.contains(sentinel), "{sentinel} leaked into an error: {t}");
    }
}

/// CT-H01 (CR11, OB4): cloud-init never appears in logs, spans or errors, on success or failure.
pub async fn ct_h01_cloud_init_sentinel_never_leaks<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let mut req = s.request(&uid("h01"));
    req.cloud_init =
        format!("#cloud-config\nwrite_files:\n  - content: {SENTINEL_CI}\n    path: /etc/secret\n").into_bytes();
    let p = s.provider();
    expect_ok("create", p.create(&s.cx(), &req).await);
    // A fresh backend, so a lookup-first provider cannot just adopt.
    let fresh = s
        .target
        .backend()
        .await
        .map_err(|nc| crate::harness::Skip::NotConfigured(nc.0))?;
    let p2 = s
        .target
        .build(
            &fresh,
            &crate::target::BuildOptions {
                entry_name: crate::ENTRY_NAME.to_owned(),
                insecure: false,
            },
        )
        .expect("build");
    for fault in [
        Fault::Server5xx,
        Fault::Raw(format!(
            "400 Bad Request: invalid user-data {:?}",
            String::from_utf8_lossy(&req.cloud_init)
        )),
    ] {
        fresh
            .fail(s.fixtures.calls.create_instance, fault.clone(), Times::Once)
            .await?;
        if let Err(e) = p2.create(&s.cx(), &req).await {
            assert_error_clean(&e, SENTINEL_CI);
        }
    }
    // What the provider and this workspace log, and every span. A client library's own debug
    // line quoting a backend's raw answer is not the provider's doing; the injected answer here
    // quotes the request's cloud-init, which a provider that sends it nowhere (kubernetes) can
    // never see echoed by a real backend.
    if let Some(place) = s.capture.find_text_from(SENTINEL_CI, "egress") {
        panic!("cloud-init leaked into telemetry: {place}");
    }
    let counted = s.capture.events().iter().any(|e| e.field("cloudInitBytes").is_some());
    if !counted {
        println!("NOTE CT-H01: no event carries cloudInitBytes (a SHOULD)");
    }
    Ok(())
}

/// CT-H02 (CRD3, OB4): a credential never appears in logs, spans or errors, across all methods and the checker.
pub async fn ct_h02_credential_sentinel_never_leaks<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let path = s.hooks().credential_path().await?;
    let cred = s.hooks().valid_credential(SENTINEL_CRED).await?;
    super::write_credential(&path, cred).expect("write the credential");
    let p = s.provider();
    let cx = s.cx();
    let req = s.request(&uid("h02"));
    let id = expect_ok("create", p.create(&cx, &req).await);
    expect_ok("get", p.get(&cx, &id).await);
    let own = own_mark(&s);
    mark_soon(&s, p.as_ref(), &id, &own).await;
    expect_ok("list", p.list_by_tag(&cx).await);
    if let Some(c) = p.checker() {
        let _ = c.check(&cx).await;
    }
    expect_ok("delete", p.delete(&cx, &id).await);
    for fault in [Fault::Unauthenticated, Fault::PermissionDenied] {
        let calls = s.fixtures.calls.clone();
        for kind in [calls.create_instance, calls.get[0], calls.delete[0], calls.list] {
            s.hooks().fail(kind, fault.clone(), Times::Always).await?;
        }
        if let Some(probe) = calls.probe {
            s.hooks().fail(probe, fault.clone(), Times::Always).await?;
        }
        let req = s.request(&uid("h02"));
        for r in [
            p.create(&cx, &req).await.map(|_| ()),
            p.get(&cx, &id).await.map(|_| ()),
            p.delete(&cx, &id).await,
            p.list_by_tag(&cx).await.map(|_| ()),
            p.mark_installation(&cx, &id, &own).await,
        ] {
            if let Err(e) = r {
                assert_error_clean(&e, SENTINEL_CRED);
            }
        }
        if let Some(c) = p.checker() {
            for t in c.check(&cx).await {
                assert!(
                    !format!("{t:?}").contains(SENTINEL_CRED),
                    "a credential leaked into a check verdict: {t:?}"
                );
            }
        }
        s.hooks().clear_faults().await?;
    }
    if let Some(place) = s.capture.find_text(SENTINEL_CRED) {
        panic!("a credential leaked into telemetry: {place}");
    }
    Ok(())
}
