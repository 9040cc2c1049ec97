//! F. Errors.

use crate::hooks::BackendHooks as _;
use std::error::Error as _;

use egress_provider::{ErrorClass, Op, ProviderError};

use crate::harness::{CaseResult, Scenario, require};
use crate::hooks::{Fault, Times};
use crate::target::ConformanceTarget;
use crate::{ENTRY_NAME, INSTALLATION, SENTINEL_CRED};

use super::{expect_err, expect_ok, uid};

fn assert_wrapped(what: &str, e: &ProviderError, op: Op, id: &str) {
    assert_eq!(
        e.provider(),
        ENTRY_NAME,
        "{what}: the error names another provider: {e}"
    );
    assert_eq!(e.op(), op, "{what}: wrong op in {e}");
    assert_eq!(e.id(), id, "{what}: wrong id in {e}");
    assert!(ErrorClass::ALL.contains(&e.class()));
}

/// CT-F01 (§1.6): every error carries the configured entry name, the method's op and the id it was given.
pub async fn ct_f01_every_error_is_wrapped_with_configured_name<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let cx = s.cx();
    for (placement, field, _) in s.fixtures.invalid_placements.clone() {
        let mut req = s.request(&uid("f01"));
        req.placement = placement;
        let e = expect_err(field, p.create(&cx, &req).await);
        assert_wrapped("bad placement", &e, Op::Create, e.id());
    }
    let kind = s.fixtures.calls.create_instance;
    s.hooks().fail(kind, Fault::Server5xx, Times::Once).await?;
    let e = expect_err(
        "create with a failing backend",
        p.create(&cx, &s.request(&uid("f01"))).await,
    );
    assert_wrapped("failing create", &e, Op::Create, e.id());
    let missing = s.id_for(&egress_provider::name_from_uid(&uid("f01")));
    let e = expect_err("get of a missing id", p.get(&cx, &missing).await);
    assert_wrapped("get missing", &e, Op::Get, missing.as_str());
    let id = expect_ok("create", p.create(&cx, &s.request(&uid("f01"))).await);
    // Always, not once: a provider may retry a failed read inside one get (gcp does).
    s.hooks()
        .fail(s.fixtures.calls.get[0], Fault::Server5xx, Times::Always)
        .await?;
    let e = expect_err("get with a failing backend", p.get(&cx, &id).await);
    assert_wrapped("failing get", &e, Op::Get, id.as_str());
    s.hooks().clear_faults().await?;
    for bad in s.fixtures.malformed_ids.clone() {
        let e = expect_err("get malformed", p.get(&cx, &bad).await);
        assert_wrapped("get malformed", &e, Op::Get, bad.as_str());
        let e = expect_err("delete malformed", p.delete(&cx, &bad).await);
        assert_wrapped("delete malformed", &e, Op::Delete, bad.as_str());
        let e = expect_err("mark malformed", p.mark_installation(&cx, &bad, INSTALLATION).await);
        assert_wrapped("mark malformed", &e, Op::Mark, bad.as_str());
    }
    let e = expect_err(
        "mark of a missing id",
        p.mark_installation(&cx, &missing, INSTALLATION).await,
    );
    assert_wrapped("mark missing", &e, Op::Mark, missing.as_str());
    s.hooks()
        .fail(s.fixtures.calls.list, Fault::Server5xx, Times::Always)
        .await?;
    let e = expect_err("failing list", p.list_by_tag(&cx).await);
    assert_wrapped("failing list", &e, Op::List, "");
    Ok(())
}

/// CT-F02 (§1.6): the provider's classify table holds for every row, covers every class and defaults to Transient.
pub async fn ct_f02_classify_table<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let rows = &s.fixtures.classify_cases;
    require(!rows.is_empty(), "no classify table supplied")?;
    for class in ErrorClass::ALL {
        // A provider that cannot tell "no capacity" has no QuotaExceeded row to show.
        if class == ErrorClass::QuotaExceeded && s.profile.quota != crate::target::Quota::Detected {
            continue;
        }
        assert!(
            rows.iter().any(|r| r.expected == class),
            "the classify table has no {class:?} row"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r.not_a_backend_error && r.expected == ErrorClass::Transient),
        "the classify table lacks the 'not a backend error' row"
    );
    for r in rows {
        assert_eq!(r.actual, r.expected, "classify {}: wrong class", r.what);
    }
    Ok(())
}

/// CT-F03 (CRD3): backend error text echoing a token is scrubbed from Display, Debug and every source.
pub async fn ct_f03_errors_are_sanitised<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let echo = format!(
        "upstream said: GET https://compute.invalid/v1/x?access_token={SENTINEL_CRED}&alt=json with header Authorization: Bearer {SENTINEL_CRED}"
    );
    s.hooks()
        .fail(s.fixtures.calls.create_instance, Fault::Raw(echo), Times::Once)
        .await?;
    let e = expect_err(
        "create with an echoing backend",
        p.create(&s.cx(), &s.request(&uid("f03"))).await,
    );
    let mut texts = vec![e.to_string(), format!("{e:?}")];
    let mut next = e.source();
    while let Some(src) = next {
        texts.push(src.to_string());
        texts.push(format!("{src:?}"));
        next = src.source();
    }
    for t in texts {
        assert!(!t.contains(SENTINEL_CRED), "a credential leaked into the error: {t}");
    }
    Ok(())
}
