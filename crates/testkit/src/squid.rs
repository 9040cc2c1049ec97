//! Real Squid (Debian's `squid` package) for tests, running a config the caller writes (the
//! kubernetes provider's generated one), in a scratch directory of its own; its access log read
//! as Squid writes it. Used inside a test's own network namespace ([`crate::netns`]).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ScratchDir;
use crate::real::skip_or_fail;

/// Where Debian installs Squid.
pub const SQUID: &str = "/usr/sbin/squid";
/// Bounds every wait here.
const BUDGET: Duration = Duration::from_secs(30);

/// Whether Squid is installed; `what` (a test) skips with a reason otherwise, and fails when
/// real backends are required, as under `cargo xtask test`, which installs it.
pub fn squid_available(what: &str) -> bool {
    let found = Path::new(SQUID).exists();
    if !found {
        skip_or_fail(
            what,
            "Squid is not installed (apt-get install squid; cargo xtask test installs it)",
        );
    }
    found
}

/// The uid Squid drops to (`cache_effective_user proxy` in Debian's build).
fn proxy_uid() -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"proxy")).then(|| f[2].parse().unwrap())
        })
        .expect("a proxy user (Debian's squid package makes it)")
}

/// A Squid process, stopped when dropped.
#[derive(Debug)]
pub struct Squid {
    child: Child,
    /// Squid's files; removed after Squid is stopped.
    dir: ScratchDir,
}

impl Squid {
    /// Starts Squid with the config `conf` makes for its directory (where its logs, its
    /// `htpasswd` and its core dumps go), with `htpasswd` as its one credentials line when
    /// given, and waits until `listen` accepts connections.
    pub fn start(name: &str, listen: (&str, u16), conf: impl FnOnce(&Path) -> String, htpasswd: Option<&str>) -> Self {
        let scratch = ScratchDir::new(&format!("squid-{name}"));
        let dir = scratch.path();
        // Squid writes its logs as the proxy user.
        std::os::unix::fs::chown(dir, Some(proxy_uid()), None).unwrap();
        if let Some(line) = htpasswd {
            std::fs::write(dir.join("htpasswd"), format!("{line}\n")).unwrap();
        }
        let conf_path = dir.join("squid.conf");
        std::fs::write(&conf_path, conf(dir)).unwrap();
        let child = Command::new(SQUID)
            .arg("-N")
            .arg("-f")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .spawn()
            .expect("starting squid");
        let mut squid = Self { child, dir: scratch };
        let deadline = Instant::now() + BUDGET;
        while std::net::TcpStream::connect(listen).is_err() {
            if let Some(status) = squid.child.try_wait().unwrap() {
                panic!("squid exited at start ({status}): {}", squid.logs());
            }
            assert!(Instant::now() < deadline, "squid did not listen: {}", squid.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
        squid
    }

    /// Its standard error and `cache.log`, for a failure's message.
    pub fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!("{}\n{}", read("stderr"), read("cache.log"))
    }

    /// The access log's lines, once there is a line with each of `needles` (a line is written
    /// when its transaction ends, which can be after the client saw the answer; the readiness
    /// check's connections add lines of their own, so a count would not do).
    pub async fn access_log(&self, needles: &[String]) -> Vec<String> {
        let deadline = Instant::now() + BUDGET;
        loop {
            let text = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_owned).collect();
            if needles.iter().all(|n| lines.iter().any(|l| l.contains(n.as_str()))) {
                return lines;
            }
            assert!(Instant::now() < deadline, "the access log has {lines:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `egress-deny` note of the last access log line holding `needle` (its last field; `-`
/// when none): which rule refused the request.
pub fn deny_note(log: &[String], needle: &str) -> String {
    let line = log
        .iter()
        .rev()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no log line with {needle:?}: {log:#?}"));
    line.rsplit(' ').next().unwrap().to_owned()
}
