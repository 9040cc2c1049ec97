//! Restarting the test hypervisor's libvirtd, for the fault tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where libvirtd, as `cargo xtask hypervisor up` starts it, writes its pid.
const PID_FILE: &str = "/run/libvirtd.pid";
/// A liveness bound only: libvirtd stops and starts in well under a second here.
const PATIENCE: Duration = Duration::from_secs(90);

/// Restarts libvirtd as `cargo xtask hypervisor up` runs it, with its config `conf`, and
/// returns once it answers again. Running guests keep running, as on a real host. Root only.
///
/// # Panics
/// When any step fails, saying which.
pub fn restart_libvirtd(conf: &Path) {
    let pid = std::fs::read_to_string(PID_FILE)
        .unwrap_or_else(|e| panic!("{PID_FILE}: {e}"))
        .trim()
        .to_owned();
    let killed = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(killed.is_ok_and(|s| s.success()), "kill -TERM {pid}");
    let deadline = Instant::now() + PATIENCE;
    // An external process's end: polled, within the bound.
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    while proc_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "libvirtd {pid} did not stop within {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Command::new("libvirtd").arg("-d").arg("-f").arg(conf).status();
    assert!(started.is_ok_and(|s| s.success()), "libvirtd -d -f {}", conf.display());
    let answers = || {
        Command::new("virsh")
            .args(["-c", "qemu:///system", "version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    while !answers() {
        assert!(
            Instant::now() < deadline,
            "libvirtd did not answer within {PATIENCE:?} of its restart"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
