//! The bridge between libvirt's C client and the host: a private unix socket, in a directory
//! only this user can enter, whose every connection is carried to the host's libvirt socket over
//! an SSH channel of its own. The first channel is the one the dial opened (so a host that
//! refuses the socket fails the dial); the bridge opens the others itself.

use std::path::PathBuf;
use std::time::Duration;

use russh::client;
use tokio::net::UnixListener;

use crate::link::Link;
use crate::pump::pump;

/// A private unix socket whose every connection is carried to the host's libvirt socket over
/// its own streamlocal channel.
pub(crate) struct Bridge {
    pub(crate) path: PathBuf,
    dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge").field("path", &self.path).finish()
    }
}

static BRIDGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Bridge {
    pub(crate) fn start<H: client::Handler + 'static>(
        handle: client::Handle<H>,
        first: russh::Channel<client::Msg>,
        socket: String,
        link: Link,
        stall_limit: Duration,
    ) -> std::io::Result<Self> {
        let dir = private_dir()?;
        let path = dir.join("libvirt.sock");
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let task = tokio::spawn(async move {
            let mut first = Some(first);
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = link.dead() => return,
                };
                let Ok((mut local, _)) = accepted else { return };
                let channel = match first.take() {
                    Some(c) => c,
                    None => match handle.channel_open_direct_streamlocal(socket.clone()).await {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::debug!(socket = %socket, error = %e, "opening another libvirt channel failed");
                            continue;
                        }
                    },
                };
                let link = link.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        r = pump(&mut local, channel.into_stream(), stall_limit) => {
                            // Either way the libvirt connection over this channel is over: a
                            // daemon that closed its end (restarted, say) is noticed now, and
                            // the next caller redials instead of failing one call first.
                            link.mark_dead(match r {
                                Ok(()) => "libvirt closed its end of the connection".to_owned(),
                                Err(e) => format!("libvirt socket: {e}"),
                            });
                        }
                        () = link.dead() => {}
                    }
                    // Closed only now, after the link has its reason: a C call failing on the
                    // closed socket (a broken pipe) is then reported with why it was closed.
                    drop(local);
                });
            }
        });
        Ok(Self { path, dir, task })
    }
}

#[cfg(test)]
impl Bridge {
    /// A bridge with no socket behind it, for connections that reach libvirt another way.
    pub(crate) fn idle() -> Self {
        let dir = private_dir().expect("a private directory");
        Self {
            path: dir.join("libvirt.sock"),
            dir,
            task: tokio::spawn(async {}),
        }
    }
}

/// A new directory under the temp dir that only this user can enter: created with mode 0700
/// in one step, and never one that already exists (someone else's could hold a socket of
/// theirs). Anyone who can connect to the bridge's socket has libvirt on the host.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for _ in 0..64 {
        let n = BRIDGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("egress-libvirt-{}-{seed:08x}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "no fresh directory for the libvirt bridge socket",
    ))
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
