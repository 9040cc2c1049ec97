//! The suite's cases for sessions and renewal ([`crate::session`]).

use std::sync::Arc;
use std::time::Duration;

use super::{COOLDOWN, P, acquire, proxy, release, report, req, start, sweep, total};
use crate::{
    Candidate, Grant, LeaseRequest, LeaseStore, ManualClock, NoMatch, NotRenewed, ReportResult, Session, SessionName,
    SessionRefused,
};

fn name(n: &str) -> SessionName {
    SessionName::parse(n).expect("a session name")
}

/// Acquires in the session `session` of `client` (at most `cap` sessions) over `fleet`, whose
/// members are exactly the request's candidates.
pub async fn in_session(
    s: &dyn LeaseStore,
    fleet: &[P],
    r: &LeaseRequest,
    client: &str,
    session: &str,
    cap: usize,
) -> Result<Grant, SessionRefused> {
    let mut candidates: Vec<Candidate<'_>> = fleet.iter().map(P::candidate).collect();
    candidates.sort_by(|a, b| a.order(b));
    let member = |id: &str| fleet.iter().find(|p| p.id == id).map(P::candidate);
    let name = name(session);
    let session = Session {
        client,
        name: &name,
        cap,
    };
    s.acquire_session(&mut candidates.into_iter(), &member, r, &session)
        .await
        .expect("the store answers")
}

/// [`in_session`] for the client `team-a`, with room for 100 sessions.
async fn sticky(s: &dyn LeaseStore, fleet: &[P], r: &LeaseRequest, session: &str) -> Result<Grant, SessionRefused> {
    in_session(s, fleet, r, "team-a", session, 100).await
}

async fn renew(s: &dyn LeaseStore, lease: &str, secs: u64, fit: bool) -> Result<Grant, NotRenewed> {
    s.renew(lease, Duration::from_secs(secs), &move |_: &str| fit)
        .await
        .expect("the store answers")
}

async fn active(s: &dyn LeaseStore, proxies: &[&str]) -> Vec<usize> {
    let placed: Vec<crate::ProxyRef<'_>> = proxies.iter().copied().map(crate::ProxyRef::unpooled).collect();
    s.active_leases(&placed).await.expect("the store answers")
}

fn unhealthy(p: P) -> P {
    P { healthy: false, ..p }
}

pub async fn a_session_keeps_its_lease_and_extends_it(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 10, 5), proxy("ns/b", 20, 5)];
    let first = sticky(s, &fleet, &req(None), "login-1").await.unwrap();
    assert_eq!((first.proxy_id.as_str(), first.resumed), ("ns/a", false));
    clock.advance(Duration::from_secs(100));
    let again = sticky(s, &fleet, &req(None), "login-1").await.unwrap();
    assert_eq!(again.lease_id, first.lease_id, "the same lease");
    assert_eq!((again.proxy_id.as_str(), again.active_leases), ("ns/a", 1));
    assert!(again.resumed);
    assert_eq!(
        again.expires_at,
        start() + Duration::from_secs(400),
        "extended from now"
    );
    assert_eq!(again.ttl, Duration::from_secs(300));
    assert_eq!(active(s, &["ns/a", "ns/b"]).await, [1, 0], "no capacity taken");
    // Another name, or the same name of another client, is another session.
    let other = sticky(s, &fleet, &req(None), "login-2").await.unwrap();
    assert_ne!(other.lease_id, first.lease_id);
    let theirs = in_session(s, &fleet, &req(None), "team-b", "login-1", 100)
        .await
        .unwrap();
    assert!(!theirs.resumed && theirs.lease_id != first.lease_id);
    // Past the first expiry (300 s), the extension holds: three leases, none ended.
    clock.advance(Duration::from_secs(250));
    assert_eq!(total(s).await, 3);
    let still = sticky(s, &fleet, &req(None), "login-1").await.unwrap();
    assert_eq!(still.lease_id, first.lease_id);
    // A shorter TTL never shortens it.
    let short = LeaseRequest {
        ttl: Duration::from_secs(10),
        ..req(None)
    };
    let kept = sticky(s, &fleet, &short, "login-1").await.unwrap();
    assert_eq!(kept.expires_at, still.expires_at);
}

pub async fn a_session_moves_when_its_proxy_is_unfit(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 10, 5), proxy("ns/b", 20, 5), proxy("ns/c", 30, 5)];
    let on_a = sticky(s, &fleet, &req(Some("shop.example")), "s").await.unwrap();
    assert_eq!(on_a.proxy_id, "ns/a");
    // Banned for the target: the next acquire for that target moves, and gives a back.
    report(s, &on_a.lease_id, ReportResult::Banned, None).await.unwrap();
    let on_b = sticky(s, &fleet, &req(Some("shop.example")), "s").await.unwrap();
    assert_eq!((on_b.proxy_id.as_str(), on_b.resumed), ("ns/b", false));
    assert_ne!(on_b.lease_id, on_a.lease_id);
    assert_eq!(active(s, &["ns/a", "ns/b"]).await, [0, 1]);
    // Unhealthy: moves.
    let sick = [
        proxy("ns/a", 10, 5),
        unhealthy(proxy("ns/b", 20, 5)),
        proxy("ns/c", 30, 5),
    ];
    let moved = sticky(s, &sick, &req(None), "s").await.unwrap();
    assert_eq!(moved.proxy_id, "ns/a", "a cools down only for the shop");
    // No longer a candidate (drained, or outside the selector): moves.
    let without_a = [proxy("ns/b", 20, 5), proxy("ns/c", 30, 5)];
    let on_b = sticky(s, &without_a, &req(None), "s").await.unwrap();
    assert_eq!(on_b.proxy_id, "ns/b");
    assert_eq!(active(s, &["ns/a", "ns/b", "ns/c"]).await, [0, 1, 0]);
    // Nowhere to go: refused, and the session has ended with its lease.
    let none = [unhealthy(proxy("ns/b", 20, 5))];
    let refused = sticky(s, &none, &req(None), "s").await.unwrap_err();
    assert_eq!(
        refused,
        SessionRefused::NoMatch(NoMatch {
            considered: 1,
            at_capacity: 0,
            in_cooldown: 0,
            unhealthy: 1
        })
    );
    assert_eq!(total(s).await, 0);
    let fresh = sticky(s, &without_a, &req(None), "s").await.unwrap();
    assert!(!fresh.resumed && fresh.lease_id != on_b.lease_id);
}

pub async fn a_session_ends_with_its_lease(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 10, 5)];
    let first = sticky(s, &fleet, &req(None), "s").await.unwrap();
    release(s, &first.lease_id).await;
    let second = sticky(s, &fleet, &req(None), "s").await.unwrap();
    assert!(
        !second.resumed && second.lease_id != first.lease_id,
        "released: a new lease"
    );
    clock.advance(Duration::from_secs(300));
    let third = sticky(s, &fleet, &req(None), "s").await.unwrap();
    assert!(
        !third.resumed && third.lease_id != second.lease_id,
        "expired: a new lease"
    );
    assert_eq!(total(s).await, 1);
}

/// A report on a session goes to the lease the store names for it: its live lease, and none
/// once it is released (a shared store may name an expired one for a short grace, which a
/// report may still name).
pub async fn a_session_names_its_lease_for_reports(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 10, 5), proxy("ns/b", 20, 5)];
    let lease = sticky(s, &fleet, &req(None), "s").await.unwrap();
    let named = |key: &'static str| async move { s.session_leases(key).await.expect("the store answers") };
    assert_eq!(named("team-a/s").await, std::slice::from_ref(&lease.lease_id));
    assert!(
        named("team-b/s").await.is_empty(),
        "another client's session of that name"
    );
    assert!(named("team-a/t").await.is_empty(), "a session never started");
    release(s, &lease.lease_id).await;
    assert!(named("team-a/s").await.is_empty(), "released: the session has ended");
}

pub async fn a_client_s_sessions_are_capped_but_resuming_never_is(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 10, 5), proxy("ns/b", 20, 5)];
    let plain = req(None);
    let capped = |session| in_session(s, &fleet, &plain, "team-a", session, 2);
    let one = capped("one").await.unwrap();
    let two = capped("two").await.unwrap();
    assert_eq!(
        capped("three").await.unwrap_err(),
        SessionRefused::TooMany { held: 2, cap: 2 }
    );
    assert_eq!(total(s).await, 2, "a refused session takes nothing");
    assert_eq!(
        capped("one").await.unwrap().lease_id,
        one.lease_id,
        "resumed at the cap"
    );
    // Moving at the cap starts nothing new.
    let without_a = [proxy("ns/b", 20, 5)];
    let moved = in_session(s, &without_a, &req(None), "team-a", "one", 2).await.unwrap();
    assert!(!moved.resumed);
    // Another client has its own count; a session plain leases do not count.
    in_session(s, &fleet, &req(None), "team-b", "three", 2).await.unwrap();
    acquire(s, &fleet, &req(None)).await.unwrap();
    assert_eq!(
        s.sessions_now(),
        [("team-a".to_owned(), 2), ("team-b".to_owned(), 1)],
        "as the store counts them"
    );
    release(s, &two.lease_id).await;
    capped("three").await.expect("room again once a session ended");
    clock.advance(Duration::from_secs(300));
    sweep(s).await;
    assert_eq!(s.sessions_now(), [], "sessions end with their leases");
}

pub async fn a_held_lease_is_renewed_while_its_proxy_is_fit(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 10, 1)];
    let g = acquire(s, &fleet, &req(Some("shop.example"))).await.unwrap();
    clock.advance(Duration::from_secs(200));
    let renewed = renew(s, &g.lease_id, 300, true).await.unwrap();
    assert_eq!(
        (
            renewed.lease_id.as_str(),
            renewed.proxy_id.as_str(),
            renewed.active_leases
        ),
        (g.lease_id.as_str(), "ns/a", 1)
    );
    assert_eq!(renewed.expires_at, start() + Duration::from_secs(500));
    assert_eq!(renewed.ttl, Duration::from_secs(300));
    // Never shortened: the answer says how long it still has.
    let short = renew(s, &g.lease_id, 10, true).await.unwrap();
    assert_eq!(
        (short.expires_at, short.ttl),
        (renewed.expires_at, Duration::from_secs(300))
    );
    assert_eq!(
        renew(s, &g.lease_id, 900, false).await,
        Err(NotRenewed::Unfit { proxy: "ns/a".into() })
    );
    // Past its first expiry it still holds the proxy's one slot, and stays reportable.
    clock.advance(Duration::from_secs(250));
    assert_eq!(active(s, &["ns/a"]).await, [1]);
    assert!(acquire(s, &fleet, &req(None)).await.is_err(), "the slot is still taken");
    assert!(report(s, &g.lease_id, ReportResult::Ok, None).await.is_ok());
    // Ended: released, expired, or never issued.
    clock.advance(Duration::from_secs(50));
    assert_eq!(
        renew(s, &g.lease_id, 300, true).await,
        Err(NotRenewed::Ended),
        "expired"
    );
    let h = acquire(s, &fleet, &req(None)).await.unwrap();
    release(s, &h.lease_id).await;
    assert_eq!(
        renew(s, &h.lease_id, 300, true).await,
        Err(NotRenewed::Ended),
        "released"
    );
    assert_eq!(renew(s, "NEVERISSUED", 300, true).await, Err(NotRenewed::Ended));
    // A renewed lease stays reportable for one window past its new expiry.
    clock.advance(COOLDOWN - Duration::from_secs(1));
    assert!(report(s, &g.lease_id, ReportResult::Ok, None).await.is_ok());
}

/// Two replicas (for a shared store, two stores on the same state) asked for one session by 32
/// clients at once: one lease results, and every client is answered with it.
pub async fn two_replicas_asking_for_one_session_get_one_lease(replicas: [Arc<dyn LeaseStore>; 2]) {
    let fleet: Arc<Vec<P>> = Arc::new((0..8).map(|i| proxy(&format!("ns/p{i}"), i, 4)).collect());
    let mut tasks = Vec::new();
    for t in 0..32 {
        let (s, fleet) = (replicas[t % 2].clone(), fleet.clone());
        tasks.push(tokio::spawn(async move {
            sticky(s.as_ref(), &fleet, &req(None), "one").await.map(|g| g.lease_id)
        }));
    }
    let mut leases = Vec::new();
    for t in tasks {
        leases.push(t.await.expect("a client").expect("granted"));
    }
    leases.sort();
    leases.dedup();
    assert_eq!(leases.len(), 1, "one lease for one session: {leases:?}");
    assert_eq!(total(replicas[0].as_ref()).await, 1);
    for r in &replicas {
        assert_eq!(
            r.sessions_now(),
            [("team-a".to_owned(), 1)],
            "each replica counts one session"
        );
    }
}
