//! A. Construction.

use crate::hooks::BackendHooks as _;
use std::time::Instant;

use tracing::Level;

use crate::harness::{CaseResult, Scenario, require};
use crate::target::{BuildOptions, ConformanceTarget, Credentials};
use crate::{ENTRY_NAME, PROMPT, SENTINEL_CRED};
use egress_provider::ErrorClass;

use super::{assert_class, assert_no_calls_since, calls_so_far, expect_err, expect_ok, uid};

/// CT-A01 (CRD1): building a provider never contacts the backend, even an unreachable one.
pub async fn ct_a01_constructor_does_not_dial<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    s.hooks().set_unreachable(true).await?;
    let before = s.hooks().call_log().await?.len();
    let start = Instant::now();
    let _provider = s.provider();
    assert!(start.elapsed() < PROMPT, "building took {:?}", start.elapsed());
    let after = s.hooks().call_log().await?;
    assert_eq!(
        after.len(),
        before,
        "the constructor called the backend: {:?}",
        &after[before..]
    );
    Ok(())
}

/// CT-A02 (CRD2, CRD5): a missing credential file is warned about at build, fails calls Transient,
/// and works once it appears; a rotated file is used without a rebuild.
pub async fn ct_a02_missing_credentials_are_lazy<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(
        matches!(
            s.profile.credentials,
            Credentials::MountedFiles { .. } | Credentials::Environment
        ),
        "credentials are not read from files",
    )?;
    let path = s.hooks().credential_path().await?;
    let good = std::fs::read(&path).expect("the backend's credential file");
    std::fs::remove_file(&path).expect("remove the credential file");
    let mark = s.capture.event_mark();
    let p = s.provider();
    let warnings: Vec<_> = s
        .capture
        .events_since(mark)
        .into_iter()
        .filter(|e| e.level <= Level::WARN)
        .collect();
    let shown = path.display().to_string();
    assert!(
        warnings.iter().any(|e| e.text().contains(&shown)),
        "no warning naming {shown} at build: {warnings:?}"
    );
    let req = s.request(&uid("a02"));
    let e = expect_err("create without a credential file", p.create(&s.cx(), &req).await);
    assert_class("create without a credential file", &e, ErrorClass::Transient);
    super::write_credential(&path, &good).expect("restore the credential file");
    expect_ok("create after the file appeared", p.create(&s.cx(), &req).await);
    if s.target_is_real() {
        // A real backend cannot be handed a second valid credential to rotate to.
        return Ok(());
    }
    match s.profile.credentials {
        Credentials::MountedFiles { rereads: true } => {
            // Rotation (CRD5): a new valid credential is used without a rebuild.
            let rotated = s.hooks().valid_credential("rotated").await?;
            super::write_credential(&path, rotated).expect("rotate the credential file");
            expect_ok("get after rotation", p.get(&s.cx(), &s.id_for(&req.name)).await);
        }
        Credentials::Environment => {
            // Rotation (CRD5) of a key that is exchanged for short-lived tokens: once the old
            // key and its tokens are retired, the provider must read the rotated file again.
            let rotated = s.hooks().valid_credential("rotated").await?;
            super::write_credential(&path, rotated).expect("rotate the credential file");
            s.hooks().retire_credentials().await?;
            expect_ok("get after rotation", p.get(&s.cx(), &s.id_for(&req.name)).await);
        }
        _ => {}
    }
    Ok(())
}

/// CT-A03 (CRD2, CRD3): a credential file with garbage is Permanent, and its content never shows in the error.
pub async fn ct_a03_unparsable_credentials_are_permanent<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let path = s.hooks().credential_path().await?;
    super::write_credential(&path, format!("garbage {SENTINEL_CRED} garbage\n\n")).expect("write garbage");
    let p = s.provider();
    let e = expect_err(
        "create with garbage credentials",
        p.create(&s.cx(), &s.request(&uid("a03"))).await,
    );
    assert_class("create with garbage credentials", &e, ErrorClass::Permanent);
    let shown = format!("{e} {e:?}");
    assert!(
        !shown.contains(SENTINEL_CRED),
        "the credential's content leaked into the error: {shown}"
    );
    assert!(
        !shown.contains("garbage"),
        "the credential's content leaked into the error: {shown}"
    );
    Ok(())
}

/// CT-A04 (CRD4): a verification-disabling switch is warned about exactly once at build, and only when set.
pub async fn ct_a04_insecure_switch_warns_at_build<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let Some(switch) = s.fixtures.insecure_switch else {
        return require(false, "the entry has no verification-disabling switch");
    };
    let before = calls_so_far(&s).await?;
    let warned = |insecure: bool| {
        let mark = s.capture.event_mark();
        let _p = s.provider_with(&BuildOptions {
            entry_name: ENTRY_NAME.to_owned(),
            insecure,
        });
        s.capture
            .events_since(mark)
            .into_iter()
            .filter(|e| e.level <= Level::WARN && e.text().contains(switch))
            .count()
    };
    assert_eq!(warned(true), 1, "with {switch} set, exactly one warning must name it");
    assert_eq!(warned(false), 0, "with {switch} unset, no warning may name it");
    assert_no_calls_since(&s, before, "building").await
}

/// CT-A00 (suite rule §2.2): in fake mode the backend offers every mandatory hook.
pub async fn ct_a00_mandatory_hooks_are_offered<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(!s.target_is_real(), "real backends offer what they can")?;
    let h = s.hooks();
    let name = egress_provider::name_from_uid(&uid("a00"));
    let mut missing: Vec<&'static str> = Vec::new();
    let mut note = |r: crate::hooks::HookResult| {
        if let Err(u) = r {
            missing.push(u.0);
        }
    };
    note(h.seed(crate::hooks::SeedSpec::marked(&name, "hook-probe")).await);
    note(h.set_native_state(&name, crate::hooks::NativeState::Stopped).await);
    note(h.set_address(&name, None).await);
    note(h.rewrite_marks(&name, "hook-probe", std::time::SystemTime::now()).await);
    note(h.inventory().await.map(drop));
    note(h.call_log().await.map(drop));
    let kind = s.fixtures.calls.list;
    note(
        h.fail(kind, crate::hooks::Fault::Server5xx, crate::hooks::Times::Once)
            .await,
    );
    note(h.clear_faults().await);
    note(h.freeze(kind).await.map(|g| g.release()));
    note(h.delay(kind, std::time::Duration::ZERO).await);
    note(h.begin_backend_delete(&name).await);
    note(h.finish_delete(&name).await);
    note(h.set_unreachable(false).await);
    if s.profile.async_ops != crate::target::AsyncOps::None {
        note(h.lock(&name).await);
        note(h.unlock(&name).await);
    }
    if matches!(
        s.profile.credentials,
        Credentials::MountedFiles { .. } | Credentials::Environment
    ) {
        note(h.credential_path().await.map(drop));
    }
    assert!(
        missing.is_empty(),
        "mandatory backend hooks are missing in fake mode: {missing:?}"
    );
    Ok(())
}
