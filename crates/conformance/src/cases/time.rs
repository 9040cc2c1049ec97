//! G. Cancellation and time.

use crate::hooks::BackendHooks as _;
use std::time::Duration;

use egress_provider::{ErrorClass, Op, OpCtx, ProviderError};
use futures::FutureExt;

use crate::harness::{CaseResult, Scenario, require};
use crate::hooks::{CallKind, Gate};
use crate::target::{ConformanceTarget, Timeouts};
use crate::{INSTALLATION, PROMPT};

use super::{assert_class, expect_err, expect_ok, owned, promptly, uid, within};

/// Starts `call` with a cancellable context once `gate` is entered, cancels
/// it, and asserts a prompt Transient error carrying `op`.
async fn cancel_at_gate<T, F>(gate: &Gate, op: Op, call: impl FnOnce(OpCtx) -> F)
where
    F: std::future::Future<Output = Result<T, ProviderError>>,
    T: std::fmt::Debug,
{
    let cx = OpCtx::background();
    let token = cx.token().clone();
    let running = call(cx);
    let cancel = async {
        gate.entered().await;
        token.cancel();
    };
    let (r, ()) = promptly(&format!("{op} after cancellation"), async {
        tokio::join!(running, cancel)
    })
    .await;
    gate.release();
    let e = expect_err(&format!("cancelled {op}"), r);
    assert_class(&format!("cancelled {op}"), &e, ErrorClass::Transient);
    assert_eq!(e.op(), op, "the cancelled call's error names another op");
}

/// CT-G01 (GN2, CR5): every method returns a Transient error promptly once cancelled mid-call.
pub async fn ct_g01_cancel_returns_promptly<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let calls = s.fixtures.calls.clone();
    let req = s.request(&uid("g01"));
    let gate = s.hooks().freeze(calls.create_steps[0]).await?;
    cancel_at_gate(&gate, Op::Create, |cx| async move { p.create(&cx, &req).await }).await;
    let id = expect_ok("create", s.provider().create(&s.cx(), &s.request(&uid("g01"))).await);
    let (p2, id2) = (s.provider(), id.clone());
    let gate = s.hooks().freeze(calls.get[0]).await?;
    cancel_at_gate(&gate, Op::Get, |cx| async move { p2.get(&cx, &id2).await }).await;
    let (p3, id3) = (s.provider(), id.clone());
    let gate = s.hooks().freeze(calls.delete[0]).await?;
    cancel_at_gate(&gate, Op::Delete, |cx| async move { p3.delete(&cx, &id3).await }).await;
    let p4 = s.provider();
    let gate = s.hooks().freeze(calls.list).await?;
    cancel_at_gate(&gate, Op::List, |cx| async move { p4.list_by_tag(&cx).await }).await;
    // Every provider reads the instance before it marks it, with get's first call.
    let (p5, id5) = (s.provider(), s.id_for(&egress_provider::name_from_uid(&uid("g01m"))));
    let gate = s.hooks().freeze(calls.get[0]).await?;
    cancel_at_gate(&gate, Op::Mark, |cx| async move {
        p5.mark_installation(&cx, &id5, INSTALLATION).await
    })
    .await;
    Ok(())
}

/// CT-G02 (GN2): with an already-cancelled context every method returns promptly; a later create yields one instance.
pub async fn ct_g02_pre_cancelled_does_nothing<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let cx = OpCtx::background();
    cx.token().cancel();
    let req = s.request(&uid("g02"));
    let id = s.id_for(&req.name);
    for (what, r) in [
        (
            "create",
            promptly("pre-cancelled create", p.create(&cx, &req)).await.map(|_| ()),
        ),
        ("get", promptly("pre-cancelled get", p.get(&cx, &id)).await.map(|_| ())),
        ("delete", promptly("pre-cancelled delete", p.delete(&cx, &id)).await),
        (
            "list",
            promptly("pre-cancelled list", p.list_by_tag(&cx)).await.map(|_| ()),
        ),
        (
            "mark",
            promptly("pre-cancelled mark", p.mark_installation(&cx, &id, INSTALLATION)).await,
        ),
    ] {
        if let Err(e) = r {
            assert!(
                e.class() == ErrorClass::Transient
                    || (matches!(what, "get" | "mark") && e.class() == ErrorClass::NotFound),
                "pre-cancelled {what} gave {e}"
            );
        }
    }
    expect_ok("create with a live context", p.create(&s.cx(), &req).await);
    let inv = s.hooks().inventory().await?;
    assert_eq!(owned(&inv, &req.name, "instance").len(), 1);
    Ok(())
}

/// CT-G03 (GN1): a create future dropped mid-call leaves nothing that blocks later calls.
pub async fn ct_g03_dropped_future_leaves_no_poison<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let req = s.request(&uid("g03"));
    let gate = s.hooks().freeze(s.fixtures.calls.create_steps[0]).await?;
    {
        let cx = s.cx();
        let mut fut = p.create(&cx, &req).boxed();
        tokio::select! {
            _ = &mut fut => panic!("the frozen create finished"),
            () = gate.entered() => {}
        }
        drop(fut);
    }
    gate.release();
    let id = expect_ok(
        "create after a dropped one",
        promptly("create after a dropped one", p.create(&s.cx(), &req)).await,
    );
    expect_ok(
        "delete",
        promptly("delete after a dropped create", p.delete(&s.cx(), &id)).await,
    );
    let other = s.request(&uid("g03b"));
    expect_ok(
        "create of another name",
        promptly("create of another name", p.create(&s.cx(), &other)).await,
    );
    Ok(())
}

/// CT-G04 (GN3): a hung backend call is cut off by the provider's own budget, as Transient.
pub async fn ct_g04_per_call_budget_bounds_a_hung_call<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(
        s.profile.timeouts == Timeouts::PerCall,
        "the provider relies on its client's timeout",
    )?;
    let Some(budgets) = s.fixtures.budgets else {
        return require(false, "no per-call budgets declared");
    };
    let p = s.provider();
    let id = expect_ok("create", p.create(&s.cx(), &s.request(&uid("g04"))).await);
    s.hooks()
        .delay(s.fixtures.calls.get[0], budgets.get + Duration::from_secs(5))
        .await?;
    let r = within(budgets.get + PROMPT, "a get with a hung backend", p.get(&s.cx(), &id)).await;
    let e = expect_err("a get with a hung backend", r);
    assert_class("a get with a hung backend", &e, ErrorClass::Transient);
    Ok(())
}

/// CT-G05 (informative): cancelling one call hurts a sibling on the same location at most once.
pub async fn ct_g05_cancel_does_not_kill_unrelated_calls_repeatedly<T: ConformanceTarget>(
    s: Scenario<T>,
) -> CaseResult {
    let p = s.provider();
    let id = expect_ok("create", p.create(&s.cx(), &s.request(&uid("g05"))).await);
    let kind: CallKind = s.fixtures.calls.get[0];
    let gate = s.hooks().freeze(kind).await?;
    let cx = OpCtx::background();
    let token = cx.token().clone();
    let frozen = p.get(&cx, &id);
    let sibling = async {
        gate.entered().await;
        let r = p.get(&s.cx(), &id).await;
        token.cancel();
        r
    };
    let (_, sibling) = promptly("a cancelled get and its sibling", async {
        tokio::join!(frozen, sibling)
    })
    .await;
    gate.release();
    if let Err(e) = sibling {
        assert_class("the sibling get", &e, ErrorClass::Transient);
    }
    expect_ok("a retry", p.get(&s.cx(), &id).await);
    Ok(())
}
