//! The bytes between the C library's local socket and one SSH channel to the host's libvirt,
//! with a write-progress deadline toward the host.
//!
//! russh's keepalive cannot see a host that went silent in the middle of a bulk transfer: its
//! timers run in the session loop, and that loop is the one blocked writing to a socket whose
//! peer no longer takes bytes (on loopback, or behind a host that is frozen rather than gone,
//! the kernel keeps the connection up with a zero window, so nothing ever fails). Here every
//! write toward the host must make progress within the stall limit: when bytes are waiting to go
//! and not one of them is accepted for that long, the host is taken for dead. Waiting for bytes
//! to send (an idle connection) never counts. The socket's `TCP_USER_TIMEOUT` (set by the dial)
//! is the second line, for unacknowledged data this loop does not see.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The most read from one side before it is written to the other.
const CHUNK: usize = 64 << 10;

/// Why a pump ended other than by both sides closing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PumpError {
    /// Bytes waited to go to the host and it accepted none of them for the limit.
    #[error("the host accepted no byte for {} s while data waited to go to it: taken for dead", .0.as_secs())]
    Stalled(Duration),
    /// A read or write failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Copies `local` to `remote` and `remote` to `local` (each end's close is passed on as a
/// shutdown of the other's writing half) until the host's side has ended, or one direction
/// fails. The host's side ending is the end even while the C library still has bytes to send:
/// libvirt closed the connection (a daemon restart, say), and nothing more can be answered on
/// it. A write to `remote` that accepts no byte within `stall_limit` fails the pump with
/// [`PumpError::Stalled`].
pub(crate) async fn pump<L, R>(local: L, remote: R, stall_limit: Duration) -> Result<(), PumpError>
where
    L: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + AsyncWrite + Unpin,
{
    let (mut local_in, mut local_out) = tokio::io::split(local);
    let (mut remote_in, mut remote_out) = tokio::io::split(remote);
    let to_host = forward(&mut local_in, &mut remote_out, Some(stall_limit));
    let from_host = forward(&mut remote_in, &mut local_out, None);
    tokio::pin!(to_host, from_host);
    tokio::select! {
        ended = &mut from_host => ended,
        sent = &mut to_host => {
            sent?;
            from_host.await
        }
    }
}

/// Copies `from` to `to` until `from` ends, then shuts `to` down. With `stall_limit`, each
/// write (and the final flush and shutdown) must accept at least one byte within it.
async fn forward<F, T>(from: &mut F, to: &mut T, stall_limit: Option<Duration>) -> Result<(), PumpError>
where
    F: AsyncRead + Unpin,
    T: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            progress(stall_limit, to.flush()).await?;
            return progress(stall_limit, to.shutdown()).await;
        }
        let mut sent = 0;
        while sent < n {
            let accepted = progress(stall_limit, to.write(&buf[sent..n])).await?;
            if accepted == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
            }
            sent += accepted;
        }
    }
}

/// `step`, failed as stalled when it has not finished within `stall_limit`.
async fn progress<V>(
    stall_limit: Option<Duration>,
    step: impl Future<Output = std::io::Result<V>>,
) -> Result<V, PumpError> {
    match stall_limit {
        None => Ok(step.await?),
        Some(limit) => match tokio::time::timeout(limit, step).await {
            Ok(done) => Ok(done?),
            Err(_) => Err(PumpError::Stalled(limit)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn bytes_flow_both_ways_and_each_close_is_passed_on() {
        let (local, mut c_library) = tokio::io::duplex(1 << 10);
        let (remote, mut host) = tokio::io::duplex(1 << 10);
        let pumping = tokio::spawn(pump(local, remote, LIMIT));
        let request = vec![7u8; 300 << 10];
        let (sent, received) = tokio::join!(
            async {
                c_library.write_all(&request).await.unwrap();
                c_library.shutdown().await.unwrap();
                let mut answer = Vec::new();
                c_library.read_to_end(&mut answer).await.unwrap();
                answer
            },
            async {
                let mut got = Vec::new();
                host.read_to_end(&mut got).await.unwrap();
                host.write_all(b"answer").await.unwrap();
                host.shutdown().await.unwrap();
                got
            }
        );
        assert_eq!(received, request);
        assert_eq!(sent, b"answer");
        pumping.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_host_that_takes_no_byte_for_the_limit_is_taken_for_dead() {
        let (local, mut c_library) = tokio::io::duplex(1 << 10);
        // The host's side is never read: its buffer fills and every further write waits.
        let (remote, _host) = tokio::io::duplex(1 << 10);
        let pumping = tokio::spawn(pump(local, remote, LIMIT));
        let writing = tokio::spawn(async move {
            let _ = c_library.write_all(&vec![1u8; 1 << 20]).await;
            c_library
        });
        let started = tokio::time::Instant::now();
        let err = pumping.await.unwrap().unwrap_err();
        assert!(matches!(err, PumpError::Stalled(limit) if limit == LIMIT), "{err}");
        assert!(
            started.elapsed() >= LIMIT,
            "not before the limit: {:?}",
            started.elapsed()
        );
        assert!(err.to_string().contains("accepted no byte for 30 s"), "{err}");
        writing.abort();
    }

    /// A daemon that closes its end (a libvirtd restart) ends the pump at once, though the C
    /// library has not closed its own: the link is then marked dead before any call fails.
    #[tokio::test(start_paused = true)]
    async fn a_host_that_closes_its_end_ends_the_pump() {
        let (local, mut c_library) = tokio::io::duplex(1 << 10);
        let (remote, host) = tokio::io::duplex(1 << 10);
        let pumping = tokio::spawn(pump(local, remote, LIMIT));
        drop(host);
        // With the clock paused, a pump that waited on the C library would let this bound
        // pass at once.
        tokio::time::timeout(LIMIT * 10, pumping)
            .await
            .expect("the pump ended with the host's side")
            .unwrap()
            .unwrap();
        let mut rest = Vec::new();
        c_library.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the close was passed on to the C library");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_never_a_stall() {
        let (local, mut c_library) = tokio::io::duplex(1 << 10);
        let (remote, mut host) = tokio::io::duplex(1 << 10);
        let pumping = tokio::spawn(pump(local, remote, LIMIT));
        // Nothing to send for ten limits, then a request and its answer.
        tokio::time::sleep(LIMIT * 10).await;
        c_library.write_all(b"late").await.unwrap();
        let mut got = [0u8; 4];
        host.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"late");
        assert!(!pumping.is_finished(), "an idle pump ended");
        drop((c_library, host));
        pumping.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_host_that_keeps_taking_bytes_is_not_a_stall() {
        let (local, mut c_library) = tokio::io::duplex(1 << 10);
        let (remote, mut host) = tokio::io::duplex(1 << 10);
        let pumping = tokio::spawn(pump(local, remote, LIMIT));
        let total = 16 << 10;
        let (_, taken) = tokio::join!(
            async {
                c_library.write_all(&vec![2u8; total]).await.unwrap();
                c_library.shutdown().await.unwrap();
            },
            async {
                // One small read per half limit: slow, but never silent for a whole limit.
                let mut taken = 0;
                let mut buf = [0u8; 512];
                loop {
                    tokio::time::sleep(LIMIT / 2).await;
                    match host.read(&mut buf).await.unwrap() {
                        0 => break taken,
                        n => taken += n,
                    }
                }
            }
        );
        assert_eq!(taken, total);
        drop(host);
        drop(c_library);
        pumping.await.unwrap().unwrap();
    }
}
