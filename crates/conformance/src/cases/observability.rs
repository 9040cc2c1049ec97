//! I. Observability.

use tracing::Level;

use crate::harness::{CaseResult, Scenario, require};
use crate::target::{ChildSpans, ConformanceTarget, Logging};

use super::mark::{mark_soon, own_mark};
use super::{expect_ok, uid};

/// Runs create, get, mark, list and delete once each (the mark asked again while Transient: a
/// create that returns on submit may not have made the instance yet).
async fn run_every_method<T: ConformanceTarget>(s: &Scenario<T>) {
    let p = s.provider();
    let id = expect_ok("create", p.create(&s.cx(), &s.request(&uid("obs"))).await);
    expect_ok("get", p.get(&s.cx(), &id).await);
    mark_soon(s, p.as_ref(), &id, &own_mark(s)).await;
    expect_ok("list", p.list_by_tag(&s.cx()).await);
    expect_ok("delete", p.delete(&s.cx(), &id).await);
}

/// CT-I01 (OB1): a provider opens no `provider.*` operation spans of its own (the decorators do).
pub async fn ct_i01_no_own_operation_spans_or_counts<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    run_every_method(&s).await;
    // NB: the request counter lives in the metrics decorator; a provider is
    // never handed it, so "untouched" holds by construction.
    let own: Vec<_> = s
        .capture
        .spans()
        .into_iter()
        .filter(|sp| sp.name.starts_with("provider."))
        .collect();
    assert!(own.is_empty(), "the provider opened operation spans: {own:?}");
    Ok(())
}

/// CT-I02 (OB2, OB3): every span the provider opens descends from the caller's span.
pub async fn ct_i02_child_spans_under_caller<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(
        s.profile.child_spans != ChildSpans::None,
        "the provider emits no child spans",
    )?;
    let mark = s.capture.span_mark();
    run_every_method(&s).await;
    let parent = s.parent_span();
    let spans = s.capture.spans_since(mark);
    assert!(
        !spans.is_empty(),
        "the profile declares child spans but none were opened"
    );
    for sp in &spans {
        assert!(
            s.capture.descends_from(sp.id, parent),
            "span {} {:?} is not under the caller's span",
            sp.name,
            sp.fields
        );
    }
    if s.profile.child_spans == ChildSpans::TransportWrapper {
        // Parent-gated: with no current span at all, no span may start.
        let before = s.capture.span_mark();
        let p = s.provider();
        let cx = s.cx();
        // A new thread has no current span; it records into this case's capture.
        let capture = s.capture.clone();
        let list = std::thread::spawn(move || {
            let _capturing = crate::capture::route_to(capture);
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(p.list_by_tag(&cx)).is_ok())
        });
        let _ = list.join();
        let roots: Vec<_> = s
            .capture
            .spans_since(before)
            .into_iter()
            .filter(|sp| sp.parent.is_none())
            .collect();
        assert!(roots.is_empty(), "spans opened without a parent: {roots:?}");
    }
    Ok(())
}

/// CT-I03 (OB2): every event the provider logs during a call is inside the caller's span.
pub async fn ct_i03_events_inside_caller_span<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let mark = s.capture.event_mark();
    run_every_method(&s).await;
    let parent = s.parent_span();
    // The provider's own events (this workspace's crates); a client library's background
    // workers (a connection pool, a request buffer) log from tasks of their own.
    for e in s
        .capture
        .events_since(mark)
        .into_iter()
        .filter(|e| e.target.starts_with("egress"))
    {
        assert!(
            e.scope_ids.contains(&parent),
            "event outside the caller's span: {}",
            e.text()
        );
    }
    Ok(())
}

/// CT-I04 (logging profile): success is silent at INFO and has an outcome line per operation at DEBUG.
pub async fn ct_i04_quiet_on_success_at_info<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(
        matches!(s.profile.logging, Logging::Tiered | Logging::OutcomeOnly),
        "the provider does not log outcomes",
    )?;
    let p = s.provider();
    let mut steps: Vec<(&str, usize)> = Vec::new();
    let mark = s.capture.event_mark();
    let id = expect_ok("create", p.create(&s.cx(), &s.request(&uid("i04"))).await);
    steps.push(("create", mark));
    let mark = s.capture.event_mark();
    expect_ok("get", p.get(&s.cx(), &id).await);
    steps.push(("get", mark));
    let mark = s.capture.event_mark();
    expect_ok("list", p.list_by_tag(&s.cx()).await);
    steps.push(("list", mark));
    let mark = s.capture.event_mark();
    expect_ok("delete", p.delete(&s.cx(), &id).await);
    steps.push(("delete", mark));
    let end = s.capture.event_mark();
    let events = s.capture.events();
    for (i, (op, start)) in steps.iter().enumerate() {
        let stop = steps.get(i + 1).map_or(end, |(_, m)| *m);
        let window = &events[*start..stop];
        let loud: Vec<_> = window.iter().filter(|e| e.level <= Level::INFO).collect();
        assert!(loud.is_empty(), "a successful {op} logged at INFO or above: {loud:?}");
        assert!(
            window.iter().any(|e| e.level == Level::DEBUG),
            "a successful {op} logged no DEBUG outcome line"
        );
    }
    Ok(())
}
