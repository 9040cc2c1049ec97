//! L. Lifecycle (fake and real).

use crate::harness::{CaseResult, Scenario, require};
use crate::hooks::BackendHooks as _;
use crate::target::ConformanceTarget;

use super::{assert_nothing_left, expect_ok, poll_gone, poll_to_running, uid};

/// CT-L01 (contract §11): check, create twice, Running with an address, listed, deleted twice, gone, nothing left.
pub async fn ct_l01_full_lifecycle<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    if let Some(c) = p.checker() {
        for t in c.check(&s.cx()).await {
            assert!(t.ready, "target {} is not ready before the lifecycle: {t:?}", t.name);
        }
    }
    let req = s.request(&uid("l01"));
    let id = expect_ok("create", p.create(&s.cx(), &req).await);
    let count = |inv: &[crate::hooks::BackendObject]| inv.iter().filter(|o| o.kind == "instance").count();
    let before = s.hooks().inventory().await.map(|i| count(&i));
    let again = expect_ok("create again", p.create(&s.cx(), &req).await);
    assert_eq!(again, id, "a repeated create returned another id");
    if let Ok(before) = before {
        assert_eq!(
            count(&s.hooks().inventory().await?),
            before,
            "a repeated create made an instance"
        );
    }
    let running = poll_to_running(p.as_ref(), &id, s.profile.readiness_budget).await;
    assert_eq!(running.uid, req.uid);
    let listed = expect_ok("list", p.list_by_tag(&s.cx()).await);
    let mine = listed.iter().find(|i| i.id == id).expect("the instance is listed");
    assert_eq!(mine.uid, req.uid);
    expect_ok("delete", p.delete(&s.cx(), &id).await);
    expect_ok("delete again", p.delete(&s.cx(), &id).await);
    poll_gone(&s, p.as_ref(), &id).await;
    assert_nothing_left(&s, &req.name, "after the lifecycle").await
}

/// CT-L02 (CK1-CK3, real mode only): every checker target of the real backend is ready.
pub async fn ct_l02_check_against_real_backend<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(s.target_is_real(), "a fake backend (real mode only)")?;
    let p = s.provider();
    let Some(c) = p.checker() else {
        return require(false, "the provider has no checker");
    };
    let verdicts = c.check(&s.cx()).await;
    assert_eq!(
        verdicts.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        s.fixtures.check_targets
    );
    for t in verdicts {
        assert!(t.ready, "{t:?}");
    }
    Ok(())
}
