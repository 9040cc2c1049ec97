//! A redis-server of a test's or bench's own, on a free loopback port, with its files in a
//! scratch directory: started, killed (as a crash would) and started again on the same port
//! and files. Persistence is what docs/operations.md recommends: an append-only file written
//! before each answer (`appendfsync always`), so a crash loses no acknowledged lease. And a
//! Redis Cluster of such servers, named by the URL the lease store takes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::try_free_port;

/// A local redis-server. Killed, and its files removed, when dropped.
#[derive(Debug)]
pub struct LocalRedis {
    child: Option<Child>,
    binary: PathBuf,
    port: u16,
    dir: PathBuf,
    appendfsync: &'static str,
    /// More arguments (a cluster node's).
    extra: Vec<String>,
}

/// A server certificate, its key and the CA certificate that signed it (PEM files' text), for
/// servers that also take TLS connections.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
    /// Whether a client must show a certificate the CA signed (`tls-auth-clients yes`).
    pub client_certificates_required: bool,
}

impl TlsFiles {
    /// Writes the files into `dir` and picks a TLS port: redis-server's arguments for them.
    /// A cluster's nodes talk TLS to each other too.
    fn arguments(&self, dir: &Path, cluster: bool) -> Result<Vec<String>, String> {
        let mut args = vec![
            "--tls-port".to_owned(),
            try_free_port().map_err(|e| format!("no free port: {e}"))?.to_string(),
        ];
        for (flag, name, text) in [
            ("--tls-cert-file", "tls.crt", &self.cert_pem),
            ("--tls-key-file", "tls.key", &self.key_pem),
            ("--tls-ca-cert-file", "ca.crt", &self.ca_pem),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            args.extend([flag.to_owned(), path.display().to_string()]);
        }
        let required = if self.client_certificates_required { "yes" } else { "no" };
        args.extend(["--tls-auth-clients".to_owned(), required.to_owned()]);
        if cluster {
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned));
        }
        Ok(args)
    }
}

/// Where Debian puts redis-server, if it is there.
pub fn binary() -> Option<PathBuf> {
    ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Whether a test can use redis-server here. Without it, the test should skip (this says so),
/// unless real backends are required, as under `cargo xtask test`, where this panics instead
/// ([`crate::real::skip_or_fail`]).
#[must_use]
pub fn available_for_test() -> bool {
    if binary().is_some() {
        return true;
    }
    crate::real::skip_or_fail(
        "a test of a real redis-server",
        "redis-server is not installed (cargo xtask test installs it)",
    );
    false
}

/// The process id of the redis-server answering on `port`.
fn process_id(port: u16) -> Option<u32> {
    redis_cli(port, &["info", "server"])?
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|id| id.trim().parse().ok())
}

fn answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl LocalRedis {
    /// Starts one with the append-only file on and `appendfsync always`, and waits until it
    /// answers (at most 10 s).
    ///
    /// # Errors
    /// No redis-server binary, or it did not start.
    pub fn start() -> Result<Self, String> {
        Self::start_with_appendfsync("always")
    }

    /// [`start`](Self::start) with another `appendfsync` (`everysec`, `no`): for measuring
    /// what the durable setting costs.
    ///
    /// # Errors
    /// No redis-server binary, or it did not start.
    pub fn start_with_appendfsync(appendfsync: &'static str) -> Result<Self, String> {
        Self::start_with(appendfsync, |_| Ok(Vec::new()))
    }

    /// [`start`](Self::start), also taking TLS connections with `tls`'s certificate on another
    /// port ([`tls_url`](Self::tls_url)); [`url`](Self::url) stays plain, for tests to look in.
    ///
    /// # Errors
    /// No redis-server binary, or it did not start.
    pub fn start_tls(tls: &TlsFiles) -> Result<Self, String> {
        Self::start_with("always", |dir| tls.arguments(dir, false))
    }

    /// [`start_with_appendfsync`](Self::start_with_appendfsync) with more arguments, made from
    /// its directory.
    /// Tries five ports: one found free may be bound by another test's server before this one
    /// binds it (the tests run in parallel processes).
    fn start_with(
        appendfsync: &'static str,
        extra: impl Fn(&Path) -> Result<Vec<String>, String>,
    ) -> Result<Self, String> {
        let binary = binary().ok_or("redis-server is not installed (apt-get install redis-server)")?;
        let mut failed = String::new();
        for _ in 0..5 {
            let port = try_free_port().map_err(|e| format!("no free port: {e}"))?;
            let dir = std::env::temp_dir().join(format!("egress-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let mut redis = Self {
                child: None,
                binary: binary.clone(),
                port,
                extra: extra(&dir)?,
                dir,
                appendfsync,
            };
            match redis.start_again() {
                Ok(()) => return Ok(redis),
                // Dropped: stopped, its directory removed.
                Err(e) => failed = format!("port {port}: {e}"),
            }
        }
        Err(failed)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:<TLS port>`, when it was started with [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port().map(|port| format!("rediss://127.0.0.1:{port}"))
    }

    fn tls_port(&self) -> Option<u16> {
        let at = self.extra.iter().position(|a| a == "--tls-port")?;
        self.extra.get(at + 1)?.parse().ok()
    }

    /// Its directory (the append-only file is there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its process id while it runs (benches pin it to a core).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills it with SIGKILL, as a crash would, and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it (again) on the same port and files, and waits until it answers (at most 10 s).
    ///
    /// # Errors
    /// It did not start.
    pub fn start_again(&mut self) -> Result<(), String> {
        self.kill();
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", self.appendfsync])
            .args(&self.extra)
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !answers(self.port) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("redis-server exited: {status}"));
            }
            if Instant::now() > deadline {
                return Err("redis-server did not answer within 10 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Another test's server may hold the port: this one then cannot bind it.
        let ours = self.child.as_ref().map(Child::id);
        if process_id(self.port) != ours {
            self.kill();
            return Err(format!("port {} answers for another redis-server", self.port));
        }
        Ok(())
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The scheme of a Redis Cluster's URL in the lease store's syntax
/// (`egress_lease_redis::CLUSTER_SCHEME`; a test in crates/discovery holds the two together,
/// since this crate links no workspace crate).
pub const CLUSTER_SCHEME: &str = "redis+cluster://";
/// The same over TLS (`egress_lease_redis::TLS_CLUSTER_SCHEME`).
pub const TLS_CLUSTER_SCHEME: &str = "rediss+cluster://";

/// How long a cluster node goes unanswered before the others take it for failed.
pub const NODE_TIMEOUT_MILLIS: u64 = 2000;
/// Redis's own `cluster-node-timeout`, for a [`LocalCluster::steady`] cluster.
pub const STEADY_NODE_TIMEOUT_MILLIS: u64 = 15_000;

/// A Redis Cluster of local servers (each a [`LocalRedis`] with `cluster-enabled`), its slots
/// spread evenly over the masters by `redis-cli --cluster create`, each master with its
/// replicas. A node is taken as failed after [`NODE_TIMEOUT_MILLIS`] without answering
/// (`cluster-node-timeout`), so a killed master's replica takes over within a few seconds.
#[derive(Debug)]
pub struct LocalCluster {
    nodes: Vec<LocalRedis>,
}

impl LocalCluster {
    /// Starts `masters` masters with `replicas` replicas each, all with the append-only file and
    /// `appendfsync`, and waits until every node reports `cluster_state:ok` and every master
    /// has its replicas in sync (at most 30 s).
    ///
    /// # Errors
    /// No redis-server or redis-cli, or the cluster did not form.
    pub fn start(masters: usize, replicas: usize, appendfsync: &'static str) -> Result<Self, String> {
        Self::start_with(masters, replicas, appendfsync, None, NODE_TIMEOUT_MILLIS)
    }

    /// `masters` masters without replicas, syncing no file (`appendfsync no`), and with
    /// Redis's own node timeout ([`STEADY_NODE_TIMEOUT_MILLIS`]): a cluster a whole test run
    /// shares on a busy machine, where no node is killed and none may be taken for failed for
    /// answering late (without a replica to take over, its slots would be down meanwhile).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn steady(masters: usize) -> Result<Self, String> {
        Self::start_with(masters, 0, "no", None, STEADY_NODE_TIMEOUT_MILLIS)
    }

    /// [`start`](Self::start) with every node also taking TLS connections with `tls`'s
    /// certificate ([`tls_url`](Self::tls_url)), and the nodes talking TLS to each other. A
    /// client that comes over TLS is told the nodes' TLS ports.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_tls(masters: usize, replicas: usize, tls: &TlsFiles) -> Result<Self, String> {
        Self::start_with(masters, replicas, "always", Some(tls), NODE_TIMEOUT_MILLIS)
    }

    fn start_with(
        masters: usize,
        replicas: usize,
        appendfsync: &'static str,
        tls: Option<&TlsFiles>,
        node_timeout_millis: u64,
    ) -> Result<Self, String> {
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            nodes.push(LocalRedis::start_with(appendfsync, |dir| {
                let mut args = vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-port".into(),
                    try_free_port().map_err(|e| format!("no free port: {e}"))?.to_string(),
                    "--cluster-config-file".into(),
                    dir.join("nodes.conf").display().to_string(),
                    "--cluster-node-timeout".into(),
                    node_timeout_millis.to_string(),
                ];
                if let Some(tls) = tls {
                    args.extend(tls.arguments(dir, true)?);
                }
                Ok(args)
            })?);
        }
        let cluster = Self { nodes };
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(cluster.addresses())
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .map_err(|e| format!("redis-cli (apt-get install redis-tools): {e}"))?;
        if !created.status.success() {
            return Err(format!(
                "redis-cli --cluster create: {}",
                String::from_utf8_lossy(&created.stdout)
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(cluster.nodes.iter().all(|n| cluster_ok(n.port))
            && cluster.masters().len() == masters
            && cluster.masters().iter().all(|m| connected_replicas(m.port) >= replicas))
        {
            if Instant::now() > deadline {
                return Err("the cluster did not form within 30 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    fn addresses(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect()
    }

    /// The running nodes that are masters now.
    fn masters(&self) -> Vec<&LocalRedis> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some() && role(n.port).as_deref() == Some("master"))
            .collect()
    }

    /// The running master that serves `key`'s slot now, with at least `replicas` replicas in
    /// sync (its index among the nodes), if any.
    pub fn master_of(&self, key: &str, replicas: usize) -> Option<usize> {
        let slot = redis_cli(self.masters().first()?.port, &["cluster", "keyslot", key])?
            .trim()
            .parse::<u16>()
            .ok()?;
        self.nodes.iter().position(|n| {
            n.child.is_some()
                && role(n.port).as_deref() == Some("master")
                && cluster_ok(n.port)
                && serves(n.port, slot)
                && connected_replicas(n.port) >= replicas
        })
    }

    /// Kills node `i` with SIGKILL, as a crash would.
    pub fn kill(&mut self, i: usize) {
        if let Some(node) = self.nodes.get_mut(i) {
            node.kill();
        }
    }

    /// The running replicas of master `i` (their indexes).
    pub fn replicas_of(&self, i: usize) -> Vec<usize> {
        let Some(master) = self.nodes.get(i).map(|n| n.port.to_string()) else {
            return Vec::new();
        };
        (0..self.nodes.len())
            .filter(|&r| {
                let node = &self.nodes[r];
                node.child.is_some()
                    && redis_cli(node.port, &["role"]).is_some_and(|o| {
                        let lines: Vec<&str> = o.lines().collect();
                        lines.first() == Some(&"slave") && lines.get(2) == Some(&master.as_str())
                    })
            })
            .collect()
    }

    /// Stops node `i` (SIGSTOP) or lets it go on (SIGCONT): a node that neither answers nor
    /// fails, as a stalled host would be.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn pause(&self, i: usize, paused: bool) -> Result<(), String> {
        let Some(pid) = self.nodes.get(i).and_then(|n| n.child.as_ref()).map(Child::id) else {
            return Err(format!("node {i} is not running"));
        };
        let signal = if paused { "-STOP" } else { "-CONT" };
        let sent = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .map_err(|e| format!("kill {signal}: {e}"))?;
        if sent.success() {
            Ok(())
        } else {
            Err(format!("kill {signal} {pid}: {sent}"))
        }
    }

    /// `redis+cluster://127.0.0.1:<port>,…`, every node named.
    pub fn url(&self) -> String {
        format!("{CLUSTER_SCHEME}{}", self.addresses().join(","))
    }

    /// `rediss+cluster://127.0.0.1:<TLS port>,…`, every node named, when it was started with
    /// [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> Option<String> {
        let ports: Option<Vec<String>> = self
            .nodes
            .iter()
            .map(|n| n.tls_port().map(|p| format!("127.0.0.1:{p}")))
            .collect();
        Some(format!("{TLS_CLUSTER_SCHEME}{}", ports?.join(",")))
    }

    /// `redis://` URLs of the nodes, one each (to read their figures).
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(LocalRedis::url).collect()
    }
}

/// What `redis-cli -p <port> <args>` prints, if it ran.
fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the cluster node on `port` reports `cluster_state:ok`.
fn cluster_ok(port: u16) -> bool {
    redis_cli(port, &["cluster", "info"]).is_some_and(|o| o.contains("cluster_state:ok"))
}

/// The node's role: `master`, `slave`.
fn role(port: u16) -> Option<String> {
    redis_cli(port, &["role"]).and_then(|o| o.lines().next().map(str::to_owned))
}

/// The replicas of the node on `port` that have synchronised and follow it (`state=online`; 0
/// for a replica). One still loading its first copy could not take over.
fn connected_replicas(port: u16) -> usize {
    redis_cli(port, &["info", "replication"]).map_or(0, |o| {
        o.lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .count()
    })
}

/// Whether the node on `port` holds `slot`, by its own `CLUSTER NODES` line (`myself`).
fn serves(port: u16, slot: u16) -> bool {
    redis_cli(port, &["cluster", "nodes"]).is_some_and(|o| {
        o.lines().filter(|l| l.contains("myself")).any(|l| {
            l.split_whitespace().skip(8).any(|range| {
                let (from, to) = range.split_once('-').unwrap_or((range, range));
                matches!((from.parse::<u16>(), to.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
            })
        })
    })
}

/// Pins every thread of process `pid` to the cores `cores` names (`taskset`'s list, such as
/// `0` or `0-1`), for benches that give a process (Redis, the operator) a core of its own.
///
/// # Errors
/// `taskset` (util-linux) is missing or refused.
pub fn pin(pid: u32, cores: &str) -> Result<(), String> {
    let done = Command::new("taskset")
        .args(["-acp", cores, &pid.to_string()])
        .output()
        .map_err(|e| format!("taskset: {e}"))?;
    if done.status.success() {
        Ok(())
    } else {
        Err(format!(
            "taskset -acp {cores} {pid}: {}",
            String::from_utf8_lossy(&done.stderr).trim()
        ))
    }
}

/// Runs `future` to its end on a runtime of one worker thread, with this process pinned to the
/// cores `cores` names meanwhile and to `after` once it ends: what tokio would run on a machine
/// of one core. Two workers taking turns on one core (a runtime sized before the pinning) stall
/// each other by the kernel's time slices, a stall no machine of one core has. Called from a
/// multi-thread runtime, whose worker it leaves meanwhile.
///
/// # Errors
/// The runtime could not be built, `taskset` failed, or `future` panicked.
pub fn on_one_worker<F>(cores: &str, after: &str, future: F) -> Result<F::Output, String>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    let ran = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .enable_all()
                        .build()
                        .map_err(|e| format!("a runtime of one worker: {e}"))?;
                    pin(std::process::id(), cores)?;
                    Ok(runtime.block_on(future))
                })
                .join()
                .unwrap_or_else(|_| Err("the run on one worker panicked".to_owned()))
        })
    });
    pin(std::process::id(), after)?;
    ran
}
