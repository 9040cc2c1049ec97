//! Child processes of xtask commands: killed on drop, stopped gracefully on request, their
//! memory. (A free port to give them is `egress_testkit::try_free_port`.)

use std::process::Child;
use std::time::{Duration, Instant};

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

/// A value of `key` (`VmRSS:`, `VmHWM:`) in /proc/`pid`/status, in KiB.
pub(crate) fn rss_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
}
