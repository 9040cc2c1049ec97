//! One Pod run by `podman kube play`, always removed with what podman made for it (its named
//! volumes: the ConfigMap's and the emptyDir's), and its container's log printed when the test
//! fails. podman reads `CONTAINERS_CONF` from the environment (`cargo xtask test` points it at
//! the settings this machine needs: runc, no default ulimits).

use std::path::Path;
use std::process::{Command, Output};

/// A played Pod.
pub(crate) struct Played {
    pod: String,
    container: String,
    volumes: Vec<String>,
}

impl Played {
    /// Plays `file`, whose Deployment `deployment` has the container `container`, on the host's
    /// network. `volumes` are the named volumes podman makes for it (removed with the Pod).
    ///
    /// # Panics
    /// When podman refuses the file or cannot start the container.
    pub(crate) fn play(file: &Path, deployment: &str, container: &str, volumes: Vec<String>) -> Self {
        // podman names the Pod of a Deployment `<name>-pod-0`, its containers `<pod>-<name>`.
        let pod = format!("{deployment}-pod-0");
        let played = Self {
            container: format!("{pod}-{container}"),
            pod,
            volumes,
        };
        played.remove();
        let out = podman(&["kube", "play", "--network", "host", &file.display().to_string()]);
        assert!(out.status.success(), "podman kube play: {}", both(&out));
        played
    }

    /// `podman exec` in the container.
    pub(crate) fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["exec", self.container.as_str()];
        all.extend_from_slice(args);
        podman(&all)
    }

    /// Stops the container as the kubelet would at the end of the grace period (SIGTERM, then
    /// SIGKILL after `grace_seconds`) and returns its exit code.
    pub(crate) fn stop(&self, grace_seconds: u64) -> i64 {
        let out = podman(&["stop", "--time", &grace_seconds.to_string(), &self.container]);
        assert!(out.status.success(), "podman stop: {}", both(&out));
        let out = podman(&["inspect", "--format", "{{.State.ExitCode}}", &self.container]);
        assert!(out.status.success(), "podman inspect: {}", both(&out));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("an exit code")
    }

    /// The container's log so far.
    pub(crate) fn log(&self) -> String {
        both(&podman(&["logs", &self.container]))
    }

    fn remove(&self) {
        let _ = podman(&["pod", "rm", "--force", "--ignore", &self.pod]);
        for volume in &self.volumes {
            let _ = podman(&["volume", "rm", "--force", volume]);
        }
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- the manager's log:\n{}", self.log());
        }
        self.remove();
    }
}

pub(crate) fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running podman {args:?}: {e}"))
}

/// A command's stdout and stderr, for a message.
pub(crate) fn both(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
