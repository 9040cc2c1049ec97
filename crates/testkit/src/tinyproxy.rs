//! A real tinyproxy process on a loopback port, for probes against the real thing.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// A real tinyproxy process on a loopback port; stopped on drop.
#[derive(Debug)]
pub struct Tinyproxy {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    connect_ports: Vec<u16>,
    basic_auth: Option<(String, String)>,
    /// The address its outgoing connections leave from (`Bind`), when not the system's choice.
    leaves_from: Option<std::net::Ipv4Addr>,
}

/// Whether tinyproxy is installed; tests that need it skip with a reason otherwise, and fail
/// when real backends are required ([`crate::real::skip_or_fail`]), as under `cargo xtask test`,
/// which installs it.
pub fn tinyproxy_available() -> bool {
    let found = Command::new("tinyproxy").arg("-v").output().is_ok();
    if !found {
        crate::real::skip_or_fail(
            "a test of real tinyproxy",
            "tinyproxy is not installed (cargo xtask test installs it)",
        );
    }
    found
}

impl Tinyproxy {
    /// Starts tinyproxy allowing CONNECT only to `connect_ports` (every port when empty).
    pub fn start(connect_ports: &[u16]) -> Self {
        Self::start_with(connect_ports, None)
    }

    /// Starts tinyproxy that takes only this user and password (`BasicAuth`).
    pub fn start_with(connect_ports: &[u16], basic_auth: Option<(&str, &str)>) -> Self {
        Self::start_leaving_from(connect_ports, basic_auth, None)
    }

    /// [`Tinyproxy::start_with`], its connections to targets leaving from `leaves_from` (a
    /// loopback address: each proxy of a test then has an exit of its own a target can see).
    pub fn start_leaving_from(
        connect_ports: &[u16],
        basic_auth: Option<(&str, &str)>,
        leaves_from: Option<std::net::Ipv4Addr>,
    ) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("egress-tinyproxy-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = Self {
            child: None,
            port,
            dir,
            connect_ports: connect_ports.to_vec(),
            basic_auth: basic_auth.map(|(u, p)| (u.to_owned(), p.to_owned())),
            leaves_from,
        };
        t.resume();
        t
    }

    /// Starts (again) on the same port.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let mut conf = format!(
            "Port {}\nListen 127.0.0.1\nTimeout 30\nMaxClients 50\nAllow 127.0.0.1\nLogLevel Warning\nDisableViaHeader Yes\n",
            self.port
        );
        if nix_is_root() {
            conf.push_str("User nobody\nGroup nogroup\n");
        }
        for p in &self.connect_ports {
            conf.push_str(&format!("ConnectPort {p}\n"));
        }
        if let Some((user, password)) = &self.basic_auth {
            conf.push_str(&format!("BasicAuth {user} {password}\n"));
        }
        if let Some(ip) = self.leaves_from {
            conf.push_str(&format!("Bind {ip}\n"));
        }
        let path = self.dir.join("tinyproxy.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting tinyproxy");
        self.child = Some(child);
        // Ready when it accepts connections.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("tinyproxy exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "tinyproxy did not listen on {} within 20 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it; its port then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
