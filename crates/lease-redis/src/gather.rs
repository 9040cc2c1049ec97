//! Calls gathered into batches: while [`IN_FLIGHT`] batches are on their way to Redis, the
//! requests that arrive wait together, and the next batch carries up to [`MAX_BATCH`] of them.
//! A request that finds no batch on its way goes at once, so a quiet store sends each alone and
//! a busy one sends fewer, larger batches.
//!
//! Why: Redis runs one call at a time, and part of what a call costs it does not depend on
//! what the call carries (the call itself, reading the clock, moving due expiries, the TTL of
//! the shared index, the count of all leases; the `WAIT` with the URL's `wait`; with
//! `appendfsync always`, the sync of the append-only file that ends Redis's turn). Gathered,
//! those are paid once per batch; the choices stay those of the requests one after another.
//!
//! Bounds: at most [`MAX_WAITING`] requests wait (more are refused at once), and a request that
//! a batch takes only after [`MAX_WAIT`] is answered with an error unsent. A caller that stops
//! waiting (its own timeout) loses nothing to Redis: its request is not sent if it has not
//! been, and what it was granted is handed to [`Batches::orphan`], which gives it back.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use egress_lease::StoreError;
use tokio::sync::oneshot;

use crate::CALL_BUDGET;

/// Batches on their way at once, at most. One: a second batch sent while Redis runs the first
/// reaches it during that turn and gets a turn, and a sync, of its own, so two on their way
/// carry the same requests in smaller batches at a sync each. Measured (docs/discovery.md), one
/// gave half the syncs and a lower p99 than two.
pub(crate) const IN_FLIGHT: usize = 1;
/// Requests one batch carries, at most: Redis runs a batch's calls in one turn, keeping every
/// other client waiting meanwhile (about 25 µs an acquire on the bench machine, under 2 ms for
/// a full batch; more when each request passes over many cooling proxies). 64: as many as the
/// bench's clients, which a batch then never leaves behind.
pub(crate) const MAX_BATCH: usize = 64;
/// Requests waiting for a batch, at most.
pub(crate) const MAX_WAITING: usize = 4096;
/// How long a request waits for a batch to take it, at most.
pub(crate) const MAX_WAIT: Duration = CALL_BUDGET;

/// What sends a batch and answers each of its requests.
pub(crate) trait Batches: Send + Sync + 'static {
    type Request: Send + 'static;
    type Answer: Send + 'static;

    /// Sends `batch`: one answer per request, in order.
    fn send(&self, batch: Vec<Self::Request>) -> impl Future<Output = Vec<Result<Self::Answer, StoreError>>> + Send;

    /// An answer nobody waits for any more (its caller gave up): undoes what it did.
    fn orphan(&self, answer: Self::Answer);
}

/// A request waiting for a batch.
struct Waiting<B: Batches> {
    request: B::Request,
    since: Instant,
    answer: oneshot::Sender<Result<B::Answer, StoreError>>,
}

struct State<B: Batches> {
    waiting: VecDeque<Waiting<B>>,
    in_flight: usize,
}

/// Requests for `B`, gathered into batches.
pub(crate) struct Gather<B: Batches> {
    batches: Arc<B>,
    state: Arc<Mutex<State<B>>>,
    /// [`MAX_WAIT`], but in tests.
    max_wait: Duration,
}

impl<B: Batches> Gather<B> {
    pub(crate) fn new(batches: Arc<B>) -> Self {
        Self {
            batches,
            state: Arc::new(Mutex::new(State {
                waiting: VecDeque::new(),
                in_flight: 0,
            })),
            max_wait: MAX_WAIT,
        }
    }

    /// Sends `request` in the next batch with room and waits for its answer. Dropped while it
    /// waits, it leaves nothing behind: a request not yet sent is not sent, and an answer that
    /// comes after is handed to [`Batches::orphan`].
    pub(crate) async fn call(&self, request: B::Request) -> Result<B::Answer, StoreError> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.waiting.len() >= MAX_WAITING {
                return Err(StoreError(format!("{MAX_WAITING} requests already wait for Redis")));
            }
            state.waiting.push_back(Waiting {
                request,
                since: Instant::now(),
                answer,
            });
            let start = state.in_flight < IN_FLIGHT;
            if start {
                state.in_flight += 1;
            }
            start
        };
        let mut awaiting = Awaiting {
            answered,
            batches: self.batches.clone(),
        };
        if start {
            spawn_sender(Sender {
                batches: self.batches.clone(),
                state: self.state.clone(),
                max_wait: self.max_wait,
                stopped: false,
            });
        }
        (&mut awaiting.answered)
            .await
            .unwrap_or_else(|_| Err(StoreError("the call was dropped before it was answered".to_owned())))
    }
}

/// A caller's end of its answer. Dropped unanswered (the caller gave up), it closes, so a
/// sender that has not answered yet finds it closed; an answer that came just before is
/// handed to [`Batches::orphan`] here.
struct Awaiting<B: Batches> {
    answered: oneshot::Receiver<Result<B::Answer, StoreError>>,
    batches: Arc<B>,
}

impl<B: Batches> Drop for Awaiting<B> {
    fn drop(&mut self) {
        self.answered.close();
        if let Ok(Ok(answer)) = self.answered.try_recv() {
            self.batches.orphan(answer);
        }
    }
}

/// One of the [`IN_FLIGHT`] senders, counted in `in_flight` from before its task starts.
struct Sender<B: Batches> {
    batches: Arc<B>,
    state: Arc<Mutex<State<B>>>,
    max_wait: Duration,
    /// Counted out already, with the queue seen empty under the same lock (a request pushed
    /// just after then starts a sender of its own).
    stopped: bool,
}

impl<B: Batches> Drop for Sender<B> {
    /// A sender that ends otherwise (its task dropped, as when the runtime shuts down) is
    /// counted out here; one that panicked hands the requests still waiting to another.
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.waiting.is_empty() || !std::thread::panicking() || tokio::runtime::Handle::try_current().is_err() {
            state.in_flight -= 1;
            return;
        }
        drop(state);
        spawn_sender(Sender {
            batches: self.batches.clone(),
            state: self.state.clone(),
            max_wait: self.max_wait,
            stopped: false,
        });
    }
}

fn spawn_sender<B: Batches>(sender: Sender<B>) {
    tokio::spawn(drain(sender));
}

/// Sends batches while requests wait.
async fn drain<B: Batches>(mut sender: Sender<B>) {
    loop {
        let (batch, stale) = {
            let mut state = sender.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.waiting.is_empty() {
                state.in_flight -= 1;
                drop(state);
                sender.stopped = true;
                return;
            }
            let taken = state.waiting.len().min(MAX_BATCH);
            let taken: Vec<_> = state.waiting.drain(..taken).collect();
            drop(state);
            // A request whose caller left is not sent: nobody would have its answer.
            taken
                .into_iter()
                .filter(|w| !w.answer.is_closed())
                .partition::<Vec<_>, _>(|w| w.since.elapsed() < sender.max_wait)
        };
        for w in stale {
            // Nothing was sent: there is nothing to undo whether or not anyone still waits.
            let _ = w.answer.send(Err(StoreError(format!(
                "redis: no batch took the call within {} ms",
                sender.max_wait.as_millis()
            ))));
        }
        if batch.is_empty() {
            continue;
        }
        let (requests, senders): (Vec<_>, Vec<_>) = batch.into_iter().map(|w| (w.request, w.answer)).unzip();
        let answers = sender.batches.send(requests).await;
        for (answer_to, answer) in senders.into_iter().zip(answers) {
            if let Err(Ok(answer)) = answer_to.send(answer) {
                sender.batches.orphan(answer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Semaphore;

    use super::*;

    /// Answers each request with itself times ten, each batch only once `gate` lets it; records
    /// the batches and the orphans.
    struct Echo {
        gate: Semaphore,
        sent: Mutex<Vec<Vec<u32>>>,
        orphans: Mutex<Vec<u32>>,
        calls: AtomicUsize,
    }

    impl Batches for Echo {
        type Request = u32;
        type Answer = u32;

        async fn send(&self, batch: Vec<u32>) -> Vec<Result<u32, StoreError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            assert!(!batch.contains(&PANICS), "a sender's bug");
            self.gate.acquire().await.expect("the gate").forget();
            self.sent.lock().unwrap().push(batch.clone());
            batch.into_iter().map(|r| Ok(r * 10)).collect()
        }

        fn orphan(&self, answer: u32) {
            self.orphans.lock().unwrap().push(answer);
        }
    }

    /// A request whose batch panics in `send`.
    const PANICS: u32 = 666;

    fn echo() -> Arc<Echo> {
        Arc::new(Echo {
            gate: Semaphore::new(0),
            sent: Mutex::new(Vec::new()),
            orphans: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
        })
    }

    /// Waits until `n` batches have been handed to `send` (each then waits at the gate).
    async fn until_sending(echo: &Echo, n: usize) {
        while echo.calls.load(Ordering::SeqCst) < n {
            tokio::task::yield_now().await;
        }
    }

    fn waiting(gather: &Gather<Echo>) -> usize {
        gather.state.lock().unwrap().waiting.len()
    }

    #[tokio::test]
    async fn requests_that_arrive_while_batches_are_out_go_together_in_order() {
        let echo = echo();
        let gather = Arc::new(Gather::new(echo.clone()));
        let mut calls = Vec::new();
        let waited = MAX_BATCH + 8;
        for r in 0..(IN_FLIGHT + waited) as u32 {
            let gather = gather.clone();
            calls.push(tokio::spawn(async move { gather.call(r).await }));
            if (r as usize) < IN_FLIGHT {
                until_sending(&echo, r as usize + 1).await;
            }
        }
        while waiting(&gather) < waited {
            tokio::task::yield_now().await;
        }
        echo.gate.add_permits(1000);
        for (r, call) in calls.into_iter().enumerate() {
            assert_eq!(
                call.await.unwrap(),
                Ok(r as u32 * 10),
                "each caller gets its own answer"
            );
        }
        let sent = echo.sent.lock().unwrap().clone();
        let mut sizes: Vec<usize> = sent.iter().map(Vec::len).collect();
        sizes.sort_unstable();
        // The first IN_FLIGHT went alone; those that waited went as a full batch and the rest.
        let mut expected = vec![1; IN_FLIGHT];
        expected.extend([8, MAX_BATCH]);
        assert_eq!(sizes, expected);
        let mut all: Vec<u32> = sent.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..(IN_FLIGHT + waited) as u32).collect::<Vec<_>>(),
            "each request sent once"
        );
        assert_eq!(gather.state.lock().unwrap().in_flight, 0, "the senders stopped");
    }

    #[tokio::test]
    async fn an_answer_whose_caller_gave_up_is_undone() {
        let echo = echo();
        let gather = Arc::new(Gather::new(echo.clone()));
        let gone = tokio::spawn({
            let gather = gather.clone();
            async move { gather.call(2).await }
        });
        until_sending(&echo, 1).await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        let kept = tokio::spawn({
            let gather = gather.clone();
            async move { gather.call(1).await }
        });
        echo.gate.add_permits(2);
        assert_eq!(kept.await.unwrap(), Ok(10));
        while echo.orphans.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            *echo.orphans.lock().unwrap(),
            [20],
            "only the abandoned grant is undone"
        );
    }

    #[tokio::test]
    async fn a_request_whose_caller_left_before_its_batch_is_not_sent() {
        let echo = echo();
        let gather = Arc::new(Gather::new(echo.clone()));
        let mut out = Vec::new();
        for r in 0..IN_FLIGHT {
            let gather = gather.clone();
            out.push(tokio::spawn(async move { gather.call(r as u32).await }));
            until_sending(&echo, r + 1).await;
        }
        let left = tokio::spawn({
            let gather = gather.clone();
            async move { gather.call(7).await }
        });
        while waiting(&gather) < 1 {
            tokio::task::yield_now().await;
        }
        left.abort();
        assert!(left.await.unwrap_err().is_cancelled());
        echo.gate.add_permits(10);
        for call in out {
            call.await.unwrap().expect("answered");
        }
        while gather.state.lock().unwrap().in_flight > 0 {
            tokio::task::yield_now().await;
        }
        let sent: Vec<u32> = echo.sent.lock().unwrap().iter().flatten().copied().collect();
        assert!(!sent.contains(&7), "{sent:?}");
        assert!(echo.orphans.lock().unwrap().is_empty(), "nothing was granted to undo");
    }

    #[tokio::test]
    async fn an_answer_that_arrived_but_was_never_read_is_undone() {
        let echo = echo();
        let gather = Gather::new(echo.clone());
        let mut call = Box::pin(gather.call(1));
        // Polled once: queued, and its sender started.
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
        assert!(first.is_pending());
        until_sending(&echo, 1).await;
        echo.gate.add_permits(1);
        while gather.state.lock().unwrap().in_flight > 0 {
            tokio::task::yield_now().await;
        }
        // Answered, and the caller leaves without reading it.
        drop(call);
        assert_eq!(*echo.orphans.lock().unwrap(), [10]);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let echo = echo();
        let gather = Arc::new(Gather::new(echo.clone()));
        for r in 0..IN_FLIGHT {
            let gather = gather.clone();
            tokio::spawn(async move { gather.call(r as u32).await });
            until_sending(&echo, r + 1).await;
        }
        for r in 0..MAX_WAITING as u32 {
            let gather = gather.clone();
            tokio::spawn(async move { gather.call(r).await });
        }
        while waiting(&gather) < MAX_WAITING {
            tokio::task::yield_now().await;
        }
        let refused = gather.call(u32::MAX).await.expect_err("no room");
        assert!(refused.0.contains("already wait"), "{refused}");
    }

    #[tokio::test]
    async fn a_sender_that_panics_leaves_the_next_request_its_own() {
        let echo = echo();
        let gather = Gather::new(echo.clone());
        // As many as there are senders: without being counted out, they would leave none.
        for _ in 0..IN_FLIGHT {
            let lost = gather.call(PANICS).await.expect_err("its sender panicked");
            assert!(lost.0.contains("dropped"), "{lost}");
        }
        assert_eq!(gather.state.lock().unwrap().in_flight, 0);
        echo.gate.add_permits(1);
        assert_eq!(gather.call(1).await, Ok(10));
        assert_eq!(gather.state.lock().unwrap().in_flight, 0);
    }

    #[tokio::test]
    async fn requests_left_waiting_by_senders_that_panicked_are_still_sent() {
        let echo = echo();
        let gather = Arc::new(Gather::new(echo.clone()));
        // All queued before the first sender runs: each sender's batch starts with a request
        // that makes it panic, and one request is left over for neither.
        let mut calls = Vec::new();
        for r in 0..=(IN_FLIGHT * MAX_BATCH) as u32 {
            let request = if (r as usize) < IN_FLIGHT * MAX_BATCH && (r as usize).is_multiple_of(MAX_BATCH) {
                PANICS
            } else {
                r
            };
            let gather = gather.clone();
            calls.push(tokio::spawn(async move { gather.call(request).await }));
        }
        echo.gate.add_permits(1);
        let last = calls.pop().unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), last)
            .await
            .expect("a sender took the request left over")
            .unwrap();
        assert_eq!(answer, Ok((IN_FLIGHT * MAX_BATCH) as u32 * 10));
        for call in calls {
            assert!(call.await.unwrap().is_err(), "lost with its sender's batch");
        }
    }

    #[tokio::test]
    async fn a_request_that_waited_too_long_is_answered_unsent() {
        let echo = echo();
        let gather = Gather {
            max_wait: Duration::ZERO,
            ..Gather::new(echo.clone())
        };
        let late = gather.call(1).await.expect_err("waited too long");
        assert!(late.0.contains("no batch took the call"), "{late}");
        assert!(echo.sent.lock().unwrap().is_empty(), "nothing was sent");
        assert_eq!(gather.state.lock().unwrap().in_flight, 0, "the sender stopped");
    }
}
