//! A connection with a write deadline and, for HTTP/2, an idle timer: hyper has neither.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The requests in flight on one connection, and since when there have been none.
#[derive(Debug)]
pub(crate) struct Activity {
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }
}

impl Activity {
    /// Counts a request in flight until the guard is dropped.
    pub(crate) fn begin(this: &Arc<Self>) -> InFlight {
        this.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(this.clone())
    }

    /// When the connection has been idle for `budget`; `None` while a request is in flight.
    fn idle_deadline(&self, budget: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(*self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) + budget)
    }
}

/// One request in flight.
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut since = self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            *since = Instant::now();
        }
    }
}

/// An idle timer: the connection fails once no request has been in flight for `budget`.
pub(crate) struct Idle {
    pub(crate) budget: Duration,
    pub(crate) activity: Arc<Activity>,
}

/// Wraps a stream so that:
///
/// - once a write has to wait for the client, everything buffered must be flushed within
///   `write` (a slow reader cannot hold a connection by taking a byte now and then);
/// - with an [`Idle`], reading fails once no request has been in flight for its budget, whatever
///   frames the client sends meanwhile.
pub(crate) struct Guarded<S> {
    inner: S,
    write: Duration,
    /// Set at the first write that waits; cleared when a flush completes.
    write_deadline: Option<Pin<Box<Sleep>>>,
    idle: Option<(Idle, Pin<Box<Sleep>>)>,
}

impl<S> Guarded<S> {
    pub(crate) fn new(inner: S, write: Duration, idle: Option<Idle>) -> Self {
        Self {
            inner,
            write,
            write_deadline: None,
            idle: idle.map(|i| {
                let timer = Box::pin(tokio::time::sleep(i.budget));
                (i, timer)
            }),
        }
    }

    /// Called when a write or flush must wait: arms the deadline, and says whether it passed.
    fn write_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let budget = self.write;
        let deadline = self
            .write_deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(budget)));
        deadline.as_mut().poll(cx).is_ready()
    }

    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((idle, timer)) = self.idle.as_mut() else {
            return false;
        };
        // In flight: the request's own budgets apply (and the timer is set again when it ends,
        // as hyper then writes the answer and reads on).
        let Some(deadline) = idle.activity.idle_deadline(idle.budget) else {
            return false;
        };
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx).is_ready()
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_string())
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending if self.idle_expired(cx) => Poll::Ready(Err(timed_out("the connection was idle too long"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending if self.write_expired(cx) => {
                Poll::Ready(Err(timed_out("the client did not read the response in time")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending if self.write_expired(cx) => {
                Poll::Ready(Err(timed_out("the client did not read the response in time")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                self.write_deadline = None;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.write_expired(cx) => {
                Poll::Ready(Err(timed_out("the client did not read the response in time")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_shutdown(cx) {
            Poll::Pending if self.write_expired(cx) => {
                Poll::Ready(Err(timed_out("the client did not read the response in time")))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const BUDGET: Duration = Duration::from_secs(5);

    fn guarded() -> (Guarded<tokio::io::DuplexStream>, tokio::io::DuplexStream, Arc<Activity>) {
        let (ours, theirs) = tokio::io::duplex(1024);
        let activity = Arc::new(Activity::default());
        let idle = Idle {
            budget: BUDGET,
            activity: activity.clone(),
        };
        (
            Guarded::new(ours, Duration::from_secs(10), Some(idle)),
            theirs,
            activity,
        )
    }

    async fn read(g: &mut Guarded<tokio::io::DuplexStream>) -> io::Result<usize> {
        let mut buf = [0u8; 64];
        g.read(&mut buf).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_request_in_flight_times_out() {
        let (mut g, _theirs, _) = guarded();
        let e = read(&mut g).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn frames_without_a_request_do_not_keep_it_open() {
        let (mut g, mut theirs, _) = guarded();
        // A PING a second: each is read, and the connection still times out on schedule.
        let started = Instant::now();
        let pinger = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if theirs.write_all(b"ping").await.is_err() {
                    return;
                }
            }
        });
        let error = loop {
            match read(&mut g).await {
                Ok(n) => assert!(n > 0),
                Err(e) => break e,
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < BUDGET * 2, "the pings kept it open");
        pinger.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_holds_the_timer_until_it_ends() {
        let (mut g, _theirs, activity) = guarded();
        let in_flight = Activity::begin(&activity);
        // Far past the budget, the read is still waiting (the request has budgets of its own).
        let waited = tokio::time::timeout(BUDGET * 10, read(&mut g)).await;
        assert!(waited.is_err(), "timed out with a request in flight");
        drop(in_flight);
        let e = read(&mut g).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
