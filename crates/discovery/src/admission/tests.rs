use super::*;

fn w(client: &str, in_flight: u32, oldest_ticket: u64) -> Waiting<&str> {
    Waiting {
        client,
        in_flight,
        concurrency: 8,
        oldest_ticket,
    }
}

#[test]
fn the_next_slot_goes_to_the_waiting_client_with_the_fewest_in_flight() {
    assert_eq!(next_client([w("abuser", 8, 1), w("polite", 3, 9)]), Some("polite"));
    assert_eq!(
        next_client([w("a", 2, 7), w("b", 2, 4)]),
        Some("b"),
        "ties: waiting longest"
    );
    let at_cap = Waiting {
        concurrency: 3,
        ..w("polite", 3, 0)
    };
    assert_eq!(
        next_client([at_cap, w("other", 7, 5)]),
        Some("other"),
        "never past a cap"
    );
    assert_eq!(next_client([at_cap]), None);
    assert_eq!(next_client(std::iter::empty::<Waiting<&str>>()), None);
}

#[test]
fn recent_tells_when_another_client_last_sent() {
    let (a, b, c) = (name("a"), name("b"), name("c"));
    let t0 = Instant::now();
    let t = |ms| t0 + Duration::from_millis(ms);
    let mut recent = Recent::default();
    assert_eq!(recent.other_than(&a), None);
    recent.arrived(&a, t(1));
    assert_eq!(recent.other_than(&a), None, "alone");
    assert_eq!(recent.other_than(&b), Some(t(1)));
    recent.arrived(&b, t(2));
    recent.arrived(&b, t(3));
    assert_eq!(recent.other_than(&b), Some(t(1)));
    recent.arrived(&c, t(4));
    assert_eq!(recent.other_than(&a), Some(t(4)));
    assert_eq!(recent.other_than(&c), Some(t(3)));
}

#[test]
fn retry_after_is_whole_seconds_and_at_least_one() {
    let rate = |ms| Refusal::RateLimited {
        retry_after: Duration::from_millis(ms),
    };
    assert_eq!(rate(1).retry_after_seconds(), 1);
    assert_eq!(rate(1000).retry_after_seconds(), 1);
    assert_eq!(rate(1001).retry_after_seconds(), 2);
    assert_eq!(Refusal::Overloaded.retry_after_seconds(), 1);
}

fn name(n: &str) -> ClientName {
    ClientName::parse(n).unwrap()
}

fn budget(requests_per_second: u32, burst: u32, concurrency: u32) -> Budget {
    Budget {
        requests_per_second,
        burst,
        concurrency,
    }
}

fn admission(default: Budget, max_in_flight: usize) -> Admission {
    Admission::new(Budgets::uniform(default), max_in_flight, AdmissionMetrics::default())
}

/// Alone, a request is admitted within its first poll; once another client sends too, an
/// admitted request yields once first, holding its slot meanwhile, so that requests whose
/// work is all for the core fill the slots and wait their turn client by client.
#[tokio::test]
async fn a_request_admitted_while_another_client_sends_holds_its_slot_through_a_turn() {
    use std::task::Poll;
    let admission = admission(budget(1000, 1000, 4), 1);
    let (a, b) = (name("team-a"), name("team-b"));
    let mut alone = std::pin::pin!(admission.admit(&a));
    let Poll::Ready(Ok(permit)) = futures::poll!(alone.as_mut()) else {
        panic!("alone, a request waits");
    };
    drop(permit);
    drop(admission.admit(&b).await.unwrap());

    let mut shared = std::pin::pin!(admission.admit(&a));
    assert!(futures::poll!(shared.as_mut()).is_pending(), "no turn given");
    let mut after = std::pin::pin!(admission.admit(&b));
    assert!(futures::poll!(after.as_mut()).is_pending(), "the slot was not held");
    drop(shared.await.unwrap());
    drop(after.await.unwrap());
}

#[tokio::test]
async fn a_client_over_its_burst_is_refused_with_the_wait_for_a_token() {
    let admission = admission(budget(1, 2, 10), 100);
    let me = name("team-a");
    let first = admission.admit(&me).await.unwrap();
    let second = admission.admit(&me).await.unwrap();
    match admission.admit(&me).await {
        Err(r @ Refusal::RateLimited { .. }) => assert_eq!(r.retry_after_seconds(), 1),
        other => panic!("{other:?}"),
    }
    // Another client has its own bucket.
    let other = name("team-b");
    drop(admission.admit(&other).await.unwrap());
    drop((first, second));
}

#[tokio::test]
async fn a_client_at_its_cap_waits_and_takes_the_slot_its_own_request_frees() {
    let admission = admission(budget(1000, 1000, 1), 100);
    let me = name("team-a");
    let first = admission.admit(&me).await.unwrap();
    let waiting = tokio::spawn({
        let (admission, me) = (admission.clone(), me.clone());
        async move { admission.admit(&me).await.map(drop) }
    });
    // The second waits until the first is done.
    while admission.state().clients[&me].waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished());
    drop(first);
    assert_eq!(waiting.await.unwrap(), Ok(()));
    assert_eq!(admission.state().in_flight, 0);
}

#[tokio::test]
async fn a_freed_slot_goes_to_the_client_with_fewer_in_flight_not_to_the_longest_queue() {
    let admission = admission(budget(1000, 1000, 10), 2);
    let (abuser, polite) = (name("abuser"), name("polite"));
    let held = [
        admission.admit(&abuser).await.unwrap(),
        admission.admit(&abuser).await.unwrap(),
    ];
    let queue = |client: &ClientName| {
        let (admission, client) = (admission.clone(), client.clone());
        tokio::spawn(async move { admission.admit(&client).await })
    };
    let abusers: Vec<_> = (0..3).map(|_| queue(&abuser)).collect();
    while admission.state().clients[&abuser].waiting.len() < 3 {
        tokio::task::yield_now().await;
    }
    let mine = queue(&polite);
    while !admission.state().clients.contains_key(&polite) {
        tokio::task::yield_now().await;
    }
    let [one, two] = held;
    drop(one);
    let served = mine.await.unwrap().expect("the polite request is served first");
    assert_eq!(admission.state().clients[&abuser].waiting.len(), 3);
    drop((served, two));
    for a in abusers {
        drop(a.await.unwrap().unwrap());
    }
    assert_eq!(admission.state().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_waits_too_long_is_refused_and_leaves_the_queue() {
    let admission = admission(budget(1000, 1000, 1), 100);
    let me = name("team-a");
    let held = admission.admit(&me).await.unwrap();
    assert_eq!(admission.admit(&me).await.unwrap_err(), Refusal::TooManyAtOnce);
    assert!(admission.state().clients[&me].waiting.is_empty());
    // The whole server busy, not the client's cap: overloaded.
    let everyone = self::admission(budget(1000, 1000, 10), 1);
    let other = name("team-b");
    let busy = everyone.admit(&me).await.unwrap();
    assert_eq!(everyone.admit(&other).await.unwrap_err(), Refusal::Overloaded);
    drop((held, busy));
}

#[tokio::test]
async fn a_waiter_whose_connection_went_gives_its_place_up() {
    let admission = admission(budget(1000, 1000, 1), 100);
    let me = name("team-a");
    let held = admission.admit(&me).await.unwrap();
    let gone = tokio::spawn({
        let (admission, me) = (admission.clone(), me.clone());
        async move { admission.admit(&me).await.map(drop) }
    });
    while admission.state().clients[&me].waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    gone.abort();
    let _ = gone.await;
    assert!(admission.state().clients[&me].waiting.is_empty());
    drop(held);
    assert_eq!(admission.state().in_flight, 0);
    drop(admission.admit(&me).await.unwrap());
}
