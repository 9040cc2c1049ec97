//! The call context every provider method receives: cancellation and an
//! optional deadline, plus helpers that bound an await by both and by a
//! per-call budget.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Carried into every provider call.
///
/// Reconcile and GC contexts are cancelled on shutdown or loss of
/// leadership. The provider-health monitor sets a deadline on each check, and
/// the reconciler one on each pass (for all of the pass's calls together);
/// GC sets none. A provider races every backend await against both (rule
/// GN2), and bounds each backend call with its own budget as well (GN3): the
/// callers' deadlines are outer bounds.
#[derive(Clone, Debug, Default)]
pub struct OpCtx {
    cancel: CancellationToken,
    deadline: Option<Instant>,
}

/// Why a bounded await ended before its future did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupted {
    /// The caller cancelled the call.
    Cancelled,
    /// The caller's deadline passed.
    DeadlineExceeded,
    /// The provider's own budget for one backend call ran out.
    BudgetExceeded(Duration),
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cancelled => f.write_str("call cancelled"),
            Self::DeadlineExceeded => f.write_str("caller's deadline exceeded"),
            Self::BudgetExceeded(d) => write!(f, "backend call exceeded its {}ms budget", d.as_millis()),
        }
    }
}

impl std::error::Error for Interrupted {}

impl OpCtx {
    /// A context that is never cancelled and has no deadline.
    pub fn background() -> Self {
        Self::default()
    }

    /// A context cancelled by `token`.
    pub fn with_cancel(token: CancellationToken) -> Self {
        Self {
            cancel: token,
            deadline: None,
        }
    }

    /// The same context with a deadline (the earlier one wins).
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(match self.deadline {
            Some(d) if d < deadline => d,
            _ => deadline,
        });
        self
    }

    /// The same context with a deadline `timeout` from now.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        self.with_deadline(Instant::now() + timeout)
    }

    /// The cancellation token (for child tasks).
    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The deadline, if the caller set one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Why the call must stop now, if it must.
    pub fn interrupted(&self) -> Option<Interrupted> {
        if self.cancel.is_cancelled() {
            Some(Interrupted::Cancelled)
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Interrupted::DeadlineExceeded)
        } else {
            None
        }
    }

    /// Resolves when the call is cancelled or its deadline passes.
    ///
    /// # Cancellation
    /// Dropping it is always safe.
    pub async fn done(&self) -> Interrupted {
        match self.deadline {
            Some(d) => tokio::select! {
                _ = self.cancel.cancelled() => Interrupted::Cancelled,
                _ = tokio::time::sleep_until(d) => Interrupted::DeadlineExceeded,
            },
            None => {
                self.cancel.cancelled().await;
                Interrupted::Cancelled
            }
        }
    }

    /// Runs `fut` until it finishes or the call is cancelled or times out.
    ///
    /// # Errors
    /// [`Interrupted::Cancelled`] or [`Interrupted::DeadlineExceeded`]; `fut`
    /// is dropped at that point.
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, Interrupted> {
        if let Some(why) = self.interrupted() {
            return Err(why);
        }
        tokio::select! {
            biased;
            why = self.done() => Err(why),
            out = fut => Ok(out),
        }
    }

    /// Like [`run`](Self::run), and also gives up after `budget`: the
    /// provider's own bound on one backend call.
    ///
    /// # Errors
    /// As `run`, plus [`Interrupted::BudgetExceeded`].
    pub async fn run_within<F: Future>(&self, budget: Duration, fut: F) -> Result<F::Output, Interrupted> {
        match self.run(tokio::time::timeout(budget, fut)).await? {
            Ok(out) => Ok(out),
            Err(_) => Err(Interrupted::BudgetExceeded(budget)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn run_stops_at_cancellation() {
        let cx = OpCtx::background();
        let token = cx.token().clone();
        let pending = cx.run(std::future::pending::<()>());
        token.cancel();
        assert_eq!(pending.await, Err(Interrupted::Cancelled));
    }

    #[tokio::test(start_paused = true)]
    async fn run_stops_at_the_deadline() {
        let cx = OpCtx::background().with_timeout(Duration::from_secs(1));
        assert_eq!(
            cx.run(std::future::pending::<()>()).await,
            Err(Interrupted::DeadlineExceeded)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn run_within_stops_at_the_budget() {
        let cx = OpCtx::background();
        let out = cx
            .run_within(Duration::from_secs(2), std::future::pending::<()>())
            .await;
        assert_eq!(out, Err(Interrupted::BudgetExceeded(Duration::from_secs(2))));
    }

    #[tokio::test]
    async fn a_pre_cancelled_context_does_not_poll_the_future() {
        let cx = OpCtx::background();
        cx.token().cancel();
        let out = cx.run(async { panic!("must not be polled") }).await;
        assert_eq!(out, Err::<(), _>(Interrupted::Cancelled));
    }

    #[test]
    fn the_earlier_deadline_wins() {
        let now = Instant::now();
        let cx = OpCtx::background()
            .with_deadline(now + Duration::from_secs(1))
            .with_deadline(now + Duration::from_secs(5));
        assert_eq!(cx.deadline(), Some(now + Duration::from_secs(1)));
    }
}
