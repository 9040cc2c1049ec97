//! A connection with a write deadline and, optionally, an idle timer: hyper has neither.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Wraps a stream so that:
///
/// - once a write has to wait for the client, everything buffered must be flushed within
///   `write` (a slow reader cannot hold a connection by taking a byte now and then);
/// - with `idle`, the connection fails when nothing is read or written for that long.
pub(crate) struct Guarded<S> {
    inner: S,
    write: Duration,
    /// Set at the first write that waits; cleared when a flush completes.
    write_deadline: Option<Pin<Box<Sleep>>>,
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
}

impl<S> Guarded<S> {
    pub(crate) fn new(inner: S, write: Duration, idle: Option<Duration>) -> Self {
        Self {
            inner,
            write,
            write_deadline: None,
            idle: idle.map(|d| (d, Box::pin(tokio::time::sleep(d)))),
        }
    }

    fn progressed(&mut self) {
        if let Some((budget, timer)) = &mut self.idle {
            timer.as_mut().reset(Instant::now() + *budget);
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
        self.idle
            .as_mut()
            .is_some_and(|(_, timer)| timer.as_mut().poll(cx).is_ready())
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_string())
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.progressed();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.idle_expired(cx) => Poll::Ready(Err(timed_out("the connection was idle too long"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                self.progressed();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
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
            Poll::Ready(Ok(n)) => {
                self.progressed();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
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
