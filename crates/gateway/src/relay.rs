//! A tunnel's bytes carried both ways by tokio's `copy_bidirectional`, counted, until either
//! side closes, a side fails, neither sent anything for the idle limit, or the gateway closes
//! what is left of its tunnels at the end of a drain.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A side closed; the other side's bytes were carried to the end.
    Closed,
    /// Neither side sent a byte for the idle limit.
    Idle,
    /// A side failed (reset, broken pipe).
    Broken,
    /// The gateway's drain ran out of time.
    Drained,
}

impl Ending {
    /// The outcome's name in metrics and the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Idle => "idle",
            Self::Broken => "broken",
            Self::Drained => "drained",
        }
    }
}

/// What a relay carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relayed {
    /// Bytes from the client towards the backend.
    pub up: u64,
    /// Bytes from the backend towards the client.
    pub down: u64,
    pub ending: Ending,
}

/// Carries `client` ↔ `backend` until one of the [`Ending`]s.
pub async fn relay<A, B>(client: A, backend: B, idle_limit: Duration, closing: &CancellationToken) -> Relayed
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Activity::new());
    let mut client = Metered::new(client, activity.clone());
    let mut backend = Metered::new(backend, activity.clone());
    let ending = tokio::select! {
        carried = tokio::io::copy_bidirectional(&mut client, &mut backend) => {
            if carried.is_ok() { Ending::Closed } else { Ending::Broken }
        }
        () = idle(&activity, idle_limit) => Ending::Idle,
        () = closing.cancelled() => Ending::Drained,
    };
    Relayed {
        up: client.read,
        down: backend.read,
        ending,
    }
}

/// When either side last sent something, as milliseconds since the relay began.
struct Activity {
    began: Instant,
    last: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            began: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let now = u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }

    fn last(&self) -> u64 {
        self.last.load(Ordering::Relaxed)
    }
}

/// Returns once nothing was sent for `limit`: it sleeps to the deadline the last activity
/// sets, and again only when there was activity since (at most one wake per `limit`).
async fn idle(activity: &Activity, limit: Duration) {
    loop {
        let last = activity.last();
        tokio::time::sleep_until(activity.began + Duration::from_millis(last) + limit).await;
        if activity.last() == last {
            return;
        }
    }
}

/// A stream whose reads are counted and mark activity.
struct Metered<S> {
    inner: S,
    read: u64,
    activity: Arc<Activity>,
}

impl<S> Metered<S> {
    fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            read: 0,
            activity,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.read += n as u64;
            this.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bytes_are_counted_each_way_until_a_side_closes() {
        let (client, mut client_end) = tokio::io::duplex(64);
        let (backend, mut backend_end) = tokio::io::duplex(64);
        let relaying =
            tokio::spawn(
                async move { relay(client, backend, Duration::from_secs(60), &CancellationToken::new()).await },
            );
        client_end.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        backend_end.read_exact(&mut got).await.unwrap();
        backend_end.write_all(b"hi").await.unwrap();
        backend_end.shutdown().await.unwrap();
        let mut back = Vec::new();
        client_end.read_to_end(&mut back).await.unwrap();
        client_end.shutdown().await.unwrap();
        assert_eq!(back, b"hi");
        let relayed = relaying.await.unwrap();
        assert_eq!((relayed.up, relayed.down, relayed.ending), (5, 2, Ending::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_nobody_speaks_on_ends_idle_and_activity_keeps_it_open() {
        let (client, mut client_end) = tokio::io::duplex(64);
        let (backend, mut backend_end) = tokio::io::duplex(64);
        let relaying =
            tokio::spawn(
                async move { relay(client, backend, Duration::from_secs(60), &CancellationToken::new()).await },
            );
        // Activity every 40 s (paused time: each sleep is exact) keeps it open past 60 s.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(40)).await;
            client_end.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            backend_end.read_exact(&mut one).await.unwrap();
        }
        assert!(!relaying.is_finished());
        let relayed = relaying.await.unwrap();
        assert_eq!((relayed.up, relayed.ending), (3, Ending::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_closes_what_is_left() {
        let (client, _client_end) = tokio::io::duplex(64);
        let (backend, _backend_end) = tokio::io::duplex(64);
        let closing = CancellationToken::new();
        closing.cancel();
        let relayed = relay(client, backend, Duration::from_secs(60), &closing).await;
        assert_eq!(relayed.ending, Ending::Drained);
    }
}
