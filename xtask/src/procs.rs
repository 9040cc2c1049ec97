//! Child processes of xtask commands: killed on drop, stopped gracefully on request, and the
//! small waits around starting them.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// A child process killed (and reaped) when dropped.
pub(crate) struct Killed(pub(crate) Child);

impl Killed {
    /// Sends SIGTERM and waits up to `grace` for the process to exit, then kills it.
    pub(crate) fn stop(mut self, grace: Duration) {
        let pid = i32::try_from(self.0.id()).ok().and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Drop kills what did not exit in time.
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free at the time of asking.
pub(crate) fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Waits until `server` (egress-kube-testserver) has written its kubeconfig.
pub(crate) fn wait_for_file(path: &Path, server: &mut Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        if let Some(status) = server.try_wait()? {
            bail!("egress-kube-testserver exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("egress-kube-testserver wrote no kubeconfig within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
