//! E. list_by_tag.

use crate::hooks::BackendHooks as _;
use std::time::SystemTime;

use egress_provider::ErrorClass;

use crate::harness::{CaseResult, Scenario, require};
use crate::hooks::{Fault, SeedManaged, SeedSpec, Times};
use crate::target::{ConformanceTarget, ListPartial};

use super::{assert_class, expect_err, expect_ok, poll_gone, promptly, uid};

fn seeded_name(tag: &str) -> String {
    egress_provider::name_from_uid(&uid(tag))
}

/// CT-E01 (LS1): only instances with the managed mark are listed (read from the backend, not remembered), with their UIDs.
/// Seeded UIDs are lowercase, as Kubernetes writes them (a provider may normalise case).
pub async fn ct_e01_lists_marked_only<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let u1 = uid("e01");
    expect_ok("create", p.create(&s.cx(), &s.request(&u1)).await);
    let stripped = s.request(&uid("e01s"));
    expect_ok("create", p.create(&s.cx(), &stripped).await);
    s.hooks().strip_marks(&stripped.name).await?;
    s.hooks().seed(SeedSpec::marked(seeded_name("e01b"), "u2")).await?;
    s.hooks()
        .seed(SeedSpec::marked(seeded_name("e01c"), "u3").managed(SeedManaged::No))
        .await?;
    if s.profile.key_value_marks {
        s.hooks()
            .seed(SeedSpec::marked(seeded_name("e01d"), "u4").managed(SeedManaged::Other("yes".to_owned())))
            .await?;
    }
    let listed = expect_ok("list", p.list_by_tag(&s.cx()).await);
    let mut uids: Vec<_> = listed.iter().map(|i| i.uid.clone()).collect();
    uids.sort();
    let mut want = vec![u1, "u2".to_owned()];
    want.sort();
    assert_eq!(uids, want, "list_by_tag must return exactly the marked instances");
    Ok(())
}

/// CT-E02 (LS1): a marked instance without a UID mark is listed with an empty UID.
pub async fn ct_e02_empty_uid_still_listed<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let name = seeded_name("e02");
    s.hooks().seed(SeedSpec::marked(&name, "x").uid(None)).await?;
    let listed = expect_ok("list", s.provider().list_by_tag(&s.cx()).await);
    let found: Vec<_> = listed.iter().filter(|i| i.id == s.id_for(&name)).collect();
    assert_eq!(found.len(), 1, "the UID-less instance is not listed: {listed:?}");
    assert_eq!(found[0].uid, "");
    Ok(())
}

/// CT-E03 (LS1): every listed id works for get and delete.
pub async fn ct_e03_listed_ids_work_for_get_and_delete<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    expect_ok("create", p.create(&s.cx(), &s.request(&uid("e03"))).await);
    s.hooks().seed(SeedSpec::marked(seeded_name("e03b"), "u2")).await?;
    let listed = expect_ok("list", p.list_by_tag(&s.cx()).await);
    assert_eq!(listed.len(), 2);
    for i in listed {
        expect_ok("get of a listed id", p.get(&s.cx(), &i.id).await);
        expect_ok("delete of a listed id", p.delete(&s.cx(), &i.id).await);
        poll_gone(&s, p.as_ref(), &i.id).await;
    }
    Ok(())
}

/// CT-E04 (LS1, GT7): listed UID and creation time are the real ones.
pub async fn ct_e04_listed_fields_are_real<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let skew = std::time::Duration::from_secs(300);
    let t0 = SystemTime::now();
    let p = s.provider();
    let req = s.request(&uid("e04"));
    let id = expect_ok("create", p.create(&s.cx(), &req).await);
    let listed = expect_ok("list", p.list_by_tag(&s.cx()).await);
    let t1 = SystemTime::now();
    let i = listed
        .iter()
        .find(|i| i.id == id)
        .expect("the created instance is listed");
    assert_eq!(i.uid, req.uid);
    let at = i.created_at.expect("a creation time");
    assert!(
        at >= t0 - skew && at <= t1 + skew,
        "creation time {at:?} is not between {t0:?} and {t1:?}"
    );
    Ok(())
}

/// CT-E05 (LS4): instances in every location the entry can create in are listed.
pub async fn ct_e05_whole_scope_is_covered<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let mut want = Vec::new();
    for loc in s.fixtures.locations.clone() {
        let u = uid("e05");
        s.hooks()
            .seed(SeedSpec::marked(egress_provider::name_from_uid(&u), &u).in_location(&loc))
            .await?;
        want.push(u);
    }
    let listed = expect_ok("list", s.provider().list_by_tag(&s.cx()).await);
    for u in want {
        assert!(
            listed.iter().any(|i| i.uid == u),
            "the instance of {u} is not listed: {listed:?}"
        );
    }
    Ok(())
}

/// CT-E06 (LS2, LS3): with a location unreachable, list fails whole or omits it with a log line, per policy.
pub async fn ct_e06_partial_scope_follows_policy<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    require(s.fixtures.locations.len() >= 2, "one location only")?;
    let (a, b) = (s.fixtures.locations[0].clone(), s.fixtures.locations[1].clone());
    let (ua, ub) = (uid("e06a"), uid("e06b"));
    s.hooks()
        .seed(SeedSpec::marked(egress_provider::name_from_uid(&ua), &ua).in_location(&a))
        .await?;
    s.hooks()
        .seed(SeedSpec::marked(egress_provider::name_from_uid(&ub), &ub).in_location(&b))
        .await?;
    s.hooks().make_scope_unreachable(&b).await?;
    let mark = s.capture.event_mark();
    let r = s.provider().list_by_tag(&s.cx()).await;
    match s.profile.list_partial {
        ListPartial::FailWhole => {
            let e = expect_err("list with a location down", r);
            assert_class("list with a location down", &e, ErrorClass::Transient);
        }
        ListPartial::OmitUnreachable => {
            let listed = expect_ok("list with a location down", r);
            assert!(listed.iter().any(|i| i.uid == ua) && !listed.iter().any(|i| i.uid == ub));
            let events = s.capture.events_since(mark);
            assert!(
                events.iter().any(|e| e.text().contains(&b)),
                "the omitted location {b} is not logged"
            );
        }
    }
    Ok(())
}

/// CT-E07 (LS3): an instance whose details cannot be read is skipped with a log line, or the list fails; never guessed.
pub async fn ct_e07_unreadable_instance_is_skipped_or_fails<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let (good, bad) = (seeded_name("e07a"), seeded_name("e07b"));
    s.hooks().seed(SeedSpec::marked(&good, "readable")).await?;
    s.hooks().seed(SeedSpec::marked(&bad, "unreadable")).await?;
    s.hooks().make_unreadable(&bad).await?;
    let mark = s.capture.event_mark();
    match s.provider().list_by_tag(&s.cx()).await {
        Err(_) => {}
        Ok(listed) => {
            assert!(
                listed.iter().any(|i| i.uid == "readable"),
                "the readable instance is missing"
            );
            assert!(
                !listed.iter().any(|i| i.id == s.id_for(&bad)),
                "the unreadable instance was listed with guessed fields: {listed:?}"
            );
            let events = s.capture.events_since(mark);
            assert!(
                events.iter().any(|e| e.text().contains(&bad)),
                "skipping {bad} was not logged"
            );
        }
    }
    Ok(())
}

/// CT-E08 (LS2): a failing list call is an error, never an empty list.
pub async fn ct_e08_list_failure_is_an_error<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    s.hooks().seed(SeedSpec::marked(seeded_name("e08"), "u")).await?;
    s.hooks()
        .fail(s.fixtures.calls.list, Fault::Server5xx, Times::Always)
        .await?;
    expect_err(
        "list with the list call failing",
        s.provider().list_by_tag(&s.cx()).await,
    );
    Ok(())
}

/// CT-E09 (LS2, GN2): a list cancelled mid-way is a prompt Transient error, never a partial list.
pub async fn ct_e09_cancelled_list_is_an_error<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    s.hooks().seed(SeedSpec::marked(seeded_name("e09"), "u")).await?;
    let gate = s.hooks().freeze(s.fixtures.calls.list).await?;
    let p = s.provider();
    let cx = s.cx();
    let token = cx.token().clone();
    let listing = p.list_by_tag(&cx);
    let cancel = async {
        gate.entered().await;
        token.cancel();
    };
    let (r, ()) = promptly("a cancelled list", async { tokio::join!(listing, cancel) }).await;
    gate.release();
    let e = expect_err("a cancelled list", r);
    assert_class("a cancelled list", &e, ErrorClass::Transient);
    Ok(())
}
