//! M. mark_installation: the installation mark written on an instance made without one.

use std::time::Duration;

use egress_provider::{CreateRequest, ErrorClass, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_UID, Provider, ProviderId};

use crate::INSTALLATION;
use crate::harness::{CaseResult, Scenario};
use crate::hooks::{BackendHooks as _, BackendObject};
use crate::target::ConformanceTarget;

use super::{assert_class, assert_no_calls_since, calls_so_far, expect_err, expect_ok, owned, poll_gone, uid};

/// The installation the suite marks with: the one the target's requests carry (a real run's
/// label, which its janitor looks for), else [`INSTALLATION`].
pub(crate) fn own_mark<T: ConformanceTarget>(s: &Scenario<T>) -> String {
    s.request(&uid("mark"))
        .installation
        .unwrap_or_else(|| INSTALLATION.to_owned())
}

/// An installation other than `own`, valid wherever `own` is (a label value ending in a letter).
fn other_than(own: &str) -> String {
    let kept = &own[..own.len().min(40)];
    format!("{}-other", kept.trim_end_matches(['-', '_']))
}

/// The target's request for a new UID, without any installation mark.
fn unmarked<T: ConformanceTarget>(s: &Scenario<T>, tag: &str) -> CreateRequest {
    let mut req = s.request(&uid(tag));
    req.installation = None;
    req
}

/// Marks `id` as `installation`'s. A Transient answer is asked again within the readiness
/// budget: right after a create that returns on submit, the instance may not be there to mark
/// yet.
pub(crate) async fn mark_soon<T: ConformanceTarget>(
    s: &Scenario<T>,
    p: &dyn Provider,
    id: &ProviderId,
    installation: &str,
) {
    let deadline = tokio::time::Instant::now() + s.profile.readiness_budget;
    loop {
        match p.mark_installation(&s.cx(), id, installation).await {
            Ok(()) => return,
            Err(e) if e.class() == ErrorClass::Transient && tokio::time::Instant::now() < deadline => {}
            Err(e) => panic!("mark {id} as {installation}: {e} (class {:?})", e.class()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The one instance named `name` in the inventory, when the backend offers one (H05).
async fn inventory_instance<T: ConformanceTarget>(s: &Scenario<T>, name: &str) -> Option<BackendObject> {
    let inv = s.hooks().inventory().await.ok()?;
    let found = owned(&inv, name, "instance");
    assert_eq!(found.len(), 1, "expected one instance named {name}: {inv:?}");
    Some(found[0].clone())
}

/// Asserts what a fresh provider's `get` and `list_by_tag` read of `id`'s installation mark.
async fn assert_read_back<T: ConformanceTarget>(s: &Scenario<T>, id: &ProviderId, uid: &str, want: &str) {
    let fresh = s.provider();
    let got = expect_ok("get of the marked instance", fresh.get(&s.cx(), id).await);
    assert_eq!(
        got.installation.as_deref(),
        Some(want),
        "get reads another installation mark"
    );
    assert_eq!(got.uid, uid, "the UID mark changed with the installation mark");
    let listed = expect_ok("list", fresh.list_by_tag(&s.cx()).await);
    let mine = listed
        .iter()
        .find(|i| i.id == *id)
        .unwrap_or_else(|| panic!("the marked instance {id} is not listed: {listed:?}"));
    assert_eq!(
        mine.installation.as_deref(),
        Some(want),
        "list reads another installation mark"
    );
    assert_eq!(mine.uid, uid, "the UID mark changed with the installation mark");
}

/// CT-M01 (MK1): an instance created without an installation mark carries the one
/// `mark_installation` writes, in the backend: a fresh provider's get and list read it, and the
/// managed and UID marks stay.
pub async fn ct_m01_mark_is_written_and_read_back<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let own = own_mark(&s);
    let req = unmarked(&s, "m01");
    let p = s.provider();
    let id = expect_ok("create without a mark", p.create(&s.cx(), &req).await);
    if let Some(before) = inventory_instance(&s, &req.name).await {
        assert_eq!(
            before.marks.get(LABEL_INSTALLATION),
            None,
            "created without one, the instance carries an installation mark"
        );
    }
    mark_soon(&s, p.as_ref(), &id, &own).await;
    assert_read_back(&s, &id, &req.uid, &own).await;
    if let Some(after) = inventory_instance(&s, &req.name).await {
        assert_eq!(after.marks.get(LABEL_INSTALLATION), Some(&own), "{after:?}");
        assert_eq!(
            after.marks.get(LABEL_MANAGED).map(String::as_str),
            Some("true"),
            "{after:?}"
        );
        assert_eq!(after.marks.get(LABEL_UID), Some(&req.uid), "{after:?}");
    }
    Ok(())
}

/// CT-M02 (MK2): marking again with the same installation is harmless: it succeeds and changes
/// nothing, whether the mark came from an earlier mark or from the create.
pub async fn ct_m02_marking_again_is_harmless<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let own = own_mark(&s);
    let p = s.provider();
    let req = unmarked(&s, "m02");
    let id = expect_ok("create without a mark", p.create(&s.cx(), &req).await);
    mark_soon(&s, p.as_ref(), &id, &own).await;
    let before = inventory_instance(&s, &req.name).await;
    expect_ok("a second mark", p.mark_installation(&s.cx(), &id, &own).await);
    expect_ok(
        "a mark by a fresh provider",
        s.provider().mark_installation(&s.cx(), &id, &own).await,
    );
    assert_eq!(
        inventory_instance(&s, &req.name).await,
        before,
        "marking again changed the instance"
    );
    assert_read_back(&s, &id, &req.uid, &own).await;

    let mut made_marked = s.request(&uid("m02b"));
    made_marked.installation = Some(own.clone());
    let id = expect_ok("create with the mark", p.create(&s.cx(), &made_marked).await);
    let before = inventory_instance(&s, &made_marked.name).await;
    mark_soon(&s, p.as_ref(), &id, &own).await;
    assert_eq!(
        inventory_instance(&s, &made_marked.name).await,
        before,
        "marking an instance created with the mark changed it"
    );
    assert_read_back(&s, &id, &made_marked.uid, &own).await;
    Ok(())
}

/// CT-M03 (MK3): marking an instance that is gone, or was never made, is NotFound, as get says.
pub async fn ct_m03_marking_a_gone_instance_is_notfound<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let own = own_mark(&s);
    let p = s.provider();
    let never = s.id_for(&egress_provider::name_from_uid(&uid("m03-never")));
    let e = expect_err(
        "mark of a never-created id",
        p.mark_installation(&s.cx(), &never, &own).await,
    );
    assert_class("mark of a never-created id", &e, ErrorClass::NotFound);
    // Created with the mark as the target asks: nothing of a real run is left unmarked.
    let req = s.request(&uid("m03"));
    let id = expect_ok("create", p.create(&s.cx(), &req).await);
    expect_ok("delete", p.delete(&s.cx(), &id).await);
    poll_gone(&s, p.as_ref(), &id).await;
    let e = expect_err(
        "mark of a deleted instance",
        p.mark_installation(&s.cx(), &id, &own).await,
    );
    assert_class("mark of a deleted instance", &e, ErrorClass::NotFound);
    assert!(
        inventory_instance_gone(&s, &req.name).await,
        "marking a deleted instance brought something back"
    );
    Ok(())
}

/// Whether the inventory (when offered) shows no instance named `name`.
async fn inventory_instance_gone<T: ConformanceTarget>(s: &Scenario<T>, name: &str) -> bool {
    match s.hooks().inventory().await {
        Ok(inv) => owned(&inv, name, "instance").is_empty(),
        Err(_) => true,
    }
}

/// CT-M04 (MK4): an instance carrying another installation's mark is never marked again: the
/// call is Permanent and the mark it carries stays.
pub async fn ct_m04_another_installations_mark_is_kept<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let own = own_mark(&s);
    let theirs = other_than(&own);
    let p = s.provider();
    let mut req = s.request(&uid("m04"));
    req.installation = Some(own.clone());
    let id = expect_ok("create with a mark", p.create(&s.cx(), &req).await);
    // Asked until the instance is there to read (a submit create), then refused.
    let deadline = tokio::time::Instant::now() + s.profile.readiness_budget;
    let e = loop {
        let e = expect_err(
            "marking another installation's instance",
            p.mark_installation(&s.cx(), &id, &theirs).await,
        );
        if e.class() != ErrorClass::Transient || tokio::time::Instant::now() >= deadline {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_class("marking another installation's instance", &e, ErrorClass::Permanent);
    assert_read_back(&s, &id, &req.uid, &own).await;
    if let Some(after) = inventory_instance(&s, &req.name).await {
        assert_eq!(after.marks.get(LABEL_INSTALLATION), Some(&own), "{after:?}");
    }
    Ok(())
}

/// CT-M05 (MK5): a malformed id, or one in a location the entry no longer configures, is
/// Permanent, without a backend call for the malformed ones.
pub async fn ct_m05_malformed_id_is_permanent<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let own = own_mark(&s);
    let p = s.provider();
    let mark = calls_so_far(&s).await?;
    for bad in s.fixtures.malformed_ids.clone() {
        let e = expect_err("mark of a malformed id", p.mark_installation(&s.cx(), &bad, &own).await);
        assert_class(&format!("mark of malformed id {bad:?}"), &e, ErrorClass::Permanent);
    }
    assert_no_calls_since(&s, mark, "marking a malformed id").await?;
    if let Some((id, _)) = s.fixtures.id_in_unconfigured_location.clone() {
        let e = expect_err(
            "mark in an unconfigured location",
            p.mark_installation(&s.cx(), &id, &own).await,
        );
        assert_class("mark in an unconfigured location", &e, ErrorClass::Permanent);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_installation_is_another_valid_label_value() {
        for own in [
            "conformance-installation",
            "conformance-1767225600",
            &"a".repeat(63),
            "x_",
        ] {
            let other = other_than(own);
            assert_ne!(other, own);
            assert!(other.len() <= 63 && other.ends_with("other"), "{other}");
        }
    }
}
