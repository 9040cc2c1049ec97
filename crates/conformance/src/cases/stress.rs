//! K. Concurrency stress.

use crate::hooks::BackendHooks as _;
use std::collections::BTreeSet;
use std::time::Duration;

use egress_provider::ProviderId;
use futures::future::join_all;

use crate::harness::{CaseResult, Scenario};
use crate::target::{ConformanceTarget, DeleteReturn};

use super::{assert_nothing_left, expect_ok, poll_gone, uid};

/// A small deterministic generator for the backend delays (no extra dependency).
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// CT-K01 (GN1): 20 rounds of concurrent creates, deletes, lists and checks converge to exactly the survivors.
pub async fn ct_k01_mixed_load<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let checker = p.checker();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut alive: Vec<(String, ProviderId)> = Vec::new();
    let mut deleted: Vec<(String, ProviderId)> = Vec::new();
    let kinds = {
        let c = &s.fixtures.calls;
        let mut k: BTreeSet<_> = c.create_steps.iter().chain(&c.get).chain(&c.delete).copied().collect();
        k.insert(c.list);
        k
    };
    for _round in 0..20 {
        for kind in &kinds {
            s.hooks()
                .delay(*kind, Duration::from_millis(next(&mut seed) % 21))
                .await?;
        }
        let reqs: Vec<_> = (0..3).map(|_| s.request(&uid("k01"))).collect();
        let doomed: Vec<_> = alive.drain(..alive.len().min(2)).collect();
        let cx = s.cx();
        let creates = join_all(reqs.iter().map(|r| p.create(&cx, r)));
        let deletes = join_all(doomed.iter().map(|(_, id)| p.delete(&cx, id)));
        let list = p.list_by_tag(&cx);
        let check = async {
            if let Some(c) = &checker {
                c.check(&cx).await;
            }
        };
        let (created, dels, listed, ()) = tokio::join!(creates, deletes, list, check);
        for (r, req) in created.into_iter().zip(&reqs) {
            alive.push((req.name.clone(), expect_ok("a create under load", r)));
        }
        for r in dels {
            expect_ok("a delete under load", r);
        }
        expect_ok("a list under load", listed);
        deleted.extend(doomed);
    }
    for kind in &kinds {
        s.hooks().delay(*kind, Duration::ZERO).await?;
    }
    if s.profile.delete_return == DeleteReturn::ReturnsEarly {
        for (_, id) in &deleted {
            poll_gone(&s, p.as_ref(), id).await;
        }
    }
    let inv = s.hooks().inventory().await?;
    for (name, _) in &alive {
        let n = inv.iter().filter(|o| o.kind == "instance" && &o.owner == name).count();
        assert_eq!(n, 1, "{name} should exist exactly once, found {n}");
    }
    for (name, _) in &deleted {
        assert!(
            !inv.iter().any(|o| &o.owner == name),
            "{name} was deleted but left objects"
        );
    }
    let listed: BTreeSet<_> = expect_ok("final list", p.list_by_tag(&s.cx()).await)
        .into_iter()
        .map(|i| i.id)
        .collect();
    let want: BTreeSet<_> = alive.into_iter().map(|(_, id)| id).collect();
    assert_eq!(listed, want, "the final list differs from the survivors");
    Ok(())
}

/// CT-K02 (GN1, DL3): racing create and delete of one name 20 times, then deleting, leaves nothing behind.
pub async fn ct_k02_create_delete_race_converges<T: ConformanceTarget>(s: Scenario<T>) -> CaseResult {
    let p = s.provider();
    let req = s.request(&uid("k02"));
    let id = s.id_for(&req.name);
    let cx = s.cx();
    for _ in 0..20 {
        let (c, d) = tokio::join!(p.create(&cx, &req), p.delete(&cx, &id));
        // Either may fail transiently in the race; neither may hang or panic.
        let _ = (c, d);
    }
    expect_ok("the final delete", p.delete(&cx, &id).await);
    poll_gone(&s, p.as_ref(), &id).await;
    assert_nothing_left(&s, &req.name, "after the race").await
}
