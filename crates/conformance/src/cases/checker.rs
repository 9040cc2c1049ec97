//! J. Checker.

use crate::hooks::BackendHooks as _;
use std::sync::Arc;
use std::time::Duration;

use egress_provider::{Checker, OpCtx, REASON_FORBIDDEN, REASON_REACHABLE, REASON_TIMEOUT};

use crate::PROMPT;
use crate::harness::{CaseResult, Scenario, require};
use crate::hooks::{Fault, Times};
use crate::target::ConformanceTarget;

use super::{expect_ok, promptly, uid, within};

fn checker_of<T: ConformanceTarget>(s: &Scenario<T>) -> Result<Arc<dyn Checker>, crate::harness::Skip> {
    s.provider()
        .checker()
        .ok_or_else(|| crate::harness::Skip::NotApplicable("the provider has no checker".to_owned()))
}

fn probe_kind<T: ConformanceTarget>(s: &Scenario<T>) -> Result<crate::hooks::CallKind, crate::harness::Skip> {
    s.fixtures
        .calls
        .probe
        .ok_or_else(|| crate::harness::Skip::NotApplicable("no probe call kind declared".to_owned()))
}

/// CT-J01 (CK3): one verdict per target, in config order, every time.
pub async fn ct_j01_one_entry_per_target_stable_order<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let c = checker_of(&s)?;
    for _ in 0..2 {
        let names: Vec<_> = c.check(&s.cx()).await.into_iter().map(|t| t.name).collect();
        assert_eq!(names, s.fixtures.check_targets);
    }
    Ok(())
}

/// CT-J02 (CK5): a healthy target is ready, `Reachable`, with no message and a measured latency.
pub async fn ct_j02_success_is_reachable<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let c = checker_of(&s)?;
    for t in c.check(&s.cx()).await {
        assert!(t.ready, "{} is not ready: {t:?}", t.name);
        assert_eq!(t.reason, REASON_REACHABLE);
        assert_eq!(t.message, "");
        assert!(t.latency > Duration::ZERO, "{}: latency not measured", t.name);
    }
    Ok(())
}

/// CT-J03 (CK1): with every probe failing the check still answers, one not-ready verdict per target.
pub async fn ct_j03_never_fails_as_a_whole<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let c = checker_of(&s)?;
    s.hooks().fail(probe_kind(&s)?, Fault::Server5xx, Times::Always).await?;
    let verdicts = c.check(&s.cx()).await;
    assert_eq!(verdicts.len(), s.fixtures.check_targets.len());
    for t in verdicts {
        assert!(!t.ready && !t.reason.is_empty() && !t.message.is_empty(), "{t:?}");
    }
    Ok(())
}

/// CT-J04 (CK2): with the deadline already past the check returns promptly, every target `Timeout`.
pub async fn ct_j04_expired_deadline_returns_promptly<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let c = checker_of(&s)?;
    let cx = OpCtx::background().with_deadline(tokio::time::Instant::now() - Duration::from_millis(1));
    for t in promptly("a check past its deadline", c.check(&cx)).await {
        assert!(!t.ready);
        assert_eq!(t.reason, REASON_TIMEOUT, "{t:?}");
    }
    Ok(())
}

/// CT-J05 (CK2): a hung probe ends at the round's deadline with `Timeout`.
pub async fn ct_j05_frozen_probe_times_out<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let c = checker_of(&s)?;
    let gate = s.hooks().freeze(probe_kind(&s)?).await?;
    let cx = OpCtx::background().with_timeout(Duration::from_millis(200));
    let verdicts = within(
        Duration::from_millis(200) + PROMPT,
        "a check with a hung probe",
        c.check(&cx),
    )
    .await;
    gate.release();
    assert!(verdicts.iter().any(|t| t.reason == REASON_TIMEOUT), "{verdicts:?}");
    Ok(())
}

/// CT-J06 (CK5): each probe fault gives the documented reason on its target.
pub async fn ct_j06_reasons_table<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let c = checker_of(&s)?;
    let kind = probe_kind(&s)?;
    require(!s.fixtures.check_faults.is_empty(), "no check faults declared")?;
    for (fault, target, reason) in s.fixtures.check_faults.clone() {
        s.hooks().fail(kind, fault.clone(), Times::Once).await?;
        let verdicts = c.check(&s.cx()).await;
        s.hooks().clear_faults().await?;
        let t = verdicts
            .iter()
            .find(|t| t.name == target)
            .expect("the target's verdict");
        assert!(!t.ready);
        assert_eq!(t.reason, reason, "{fault:?} on {target}");
    }
    Ok(())
}

/// CT-J07 (CK4): a check that times out does not break a create in flight on the same location.
pub async fn ct_j07_check_does_not_disrupt_reconciles<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let c = checker_of(&s)?;
    let p = s.provider();
    let req = s.request(&uid("j07"));
    let create_gate = s.hooks().freeze(s.fixtures.calls.create_instance).await?;
    let cx = s.cx();
    let creating = p.create(&cx, &req);
    let checking = async {
        create_gate.entered().await;
        let probe_gate = s.hooks().freeze(probe_kind(&s)?).await?;
        let cx = OpCtx::background().with_timeout(Duration::from_millis(200));
        let verdicts = c.check(&cx).await;
        probe_gate.release();
        create_gate.release();
        Ok::<_, crate::harness::Skip>(verdicts)
    };
    let (created, verdicts) = tokio::join!(creating, checking);
    let verdicts = verdicts?;
    assert!(verdicts.iter().any(|t| t.reason == REASON_TIMEOUT), "{verdicts:?}");
    expect_ok("the create the check overlapped", created);
    Ok(())
}

/// CT-J08 (CK6): when the check probes with the list call, denying list shows as `Forbidden`.
pub async fn ct_j08_check_uses_list_permissions<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let c = checker_of(&s)?;
    require(
        s.fixtures.calls.probe == Some(s.fixtures.calls.list),
        "the check probes another call than list",
    )?;
    s.hooks()
        .fail(s.fixtures.calls.list, Fault::PermissionDenied, Times::Always)
        .await?;
    let verdicts = c.check(&s.cx()).await;
    assert!(
        verdicts.iter().all(|t| !t.ready && t.reason == REASON_FORBIDDEN),
        "{verdicts:?}"
    );
    Ok(())
}
