//! Child processes of xtask commands: killed on drop, stopped gracefully on request, a free
//! port to give them, their memory, and the Redis servers the tests use.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

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

/// A loopback port free at the time of asking, out of the kernel's way (see
/// [`egress_testkit::try_free_port`]).
pub(crate) fn free_port() -> Result<u16> {
    Ok(egress_testkit::try_free_port()?)
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

/// A redis-server of this run's own: on a free loopback port, without persistence, its files
/// in a scratch directory removed at stop.
pub(crate) struct TestRedis {
    server: Killed,
    port: u16,
    dir: std::path::PathBuf,
}

impl TestRedis {
    /// `redis://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for TestRedis {
    /// The server is killed with `server`; its directory goes here.
    fn drop(&mut self) {
        let _ = self.server.0.kill();
        let _ = self.server.0.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a [`TestRedis`] and waits until it answers PING (at most 10 s).
pub(crate) fn start_redis() -> Result<TestRedis> {
    let port = free_port()?;
    let dir = std::env::temp_dir().join(format!("egress-test-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let server = spawn_redis(port, &dir, &[])?;
    println!("xtask: redis-server on 127.0.0.1:{port}");
    Ok(TestRedis { server, port, dir })
}

/// Starts a redis-server without persistence on `port`, its files in `dir`, with `extra`
/// arguments, and waits until it answers PING (at most 10 s).
fn spawn_redis(port: u16, dir: &Path, extra: &[String]) -> Result<Killed> {
    let binary = Path::new("/usr/bin/redis-server");
    if !binary.exists() {
        bail!(
            "redis-server is needed for the lease store tests: apt-get install redis-server (as root, cargo xtask test installs it)"
        );
    }
    let child = std::process::Command::new(binary)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(extra)
        .arg("--dir")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let mut server = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if redis_answers(port) {
            return Ok(server);
        }
        if let Some(status) = server.0.try_wait()? {
            bail!("redis-server on port {port} exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("redis-server on port {port} did not answer within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Redis Cluster of this run's own: three masters on free loopback ports (and their cluster
/// bus ports), without persistence, their files in a scratch directory removed at stop.
pub(crate) struct TestCluster {
    servers: Vec<Killed>,
    ports: Vec<u16>,
    dir: std::path::PathBuf,
}

impl TestCluster {
    /// `redis+cluster://127.0.0.1:<port>,…`.
    pub(crate) fn url(&self) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.0.kill();
            let _ = server.0.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a [`TestCluster`] with `redis-cli --cluster create`, and waits until every master
/// reports `cluster_state:ok` (at most 30 s).
pub(crate) fn start_redis_cluster() -> Result<TestCluster> {
    let dir = std::env::temp_dir().join(format!("egress-test-redis-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut cluster = TestCluster {
        servers: Vec::new(),
        ports: Vec::new(),
        dir: dir.clone(),
    };
    for i in 0..3 {
        let (port, bus) = (free_port()?, free_port()?);
        let extra = [
            "--cluster-enabled".to_owned(),
            "yes".to_owned(),
            "--cluster-port".to_owned(),
            bus.to_string(),
            "--cluster-config-file".to_owned(),
            dir.join(format!("nodes-{i}.conf")).display().to_string(),
        ];
        cluster.servers.push(spawn_redis(port, &dir, &extra)?);
        cluster.ports.push(port);
    }
    let nodes: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let created = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&nodes)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .context("running redis-cli --cluster create (apt-get install redis-tools)")?;
    if !created.status.success() {
        bail!(
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cluster.ports.iter().all(|p| cluster_ok(*p)) {
        if Instant::now() > deadline {
            bail!(
                "the test Redis Cluster ({}) did not reach cluster_state:ok within 30 s",
                nodes.join(",")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("xtask: Redis Cluster of three masters on {}", nodes.join(","));
    Ok(cluster)
}

/// Whether the cluster node on `port` reports `cluster_state:ok`.
fn cluster_ok(port: u16) -> bool {
    std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "cluster", "info"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
}

/// Whether a Redis on `port` answers PING.
fn redis_answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}
