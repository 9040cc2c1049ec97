//! The backend of the local provider: this machine's state directory and
//! process table, behind a small seam so the conformance suite can inject
//! faults and simulate states a real process cannot be put in.
//!
//! ```text
//!  <stateDir>/<name>.json          the record (marks, address, port, pid)
//!  <stateDir>/<name>/tinyproxy.conf
//!  <stateDir>/<name>/launched.pid    the process started for it
//!  <stateDir>/<name>/tinyproxy.log
//! ```
//!
//! Every method is one "backend call" with its own kind (the constants
//! below); the provider bounds each one with a budget.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

/// Makes an instance exist: writes its record (marks included) and starts its tinyproxy.
pub const CREATE: &str = "create";
/// Reads one record.
pub const READ: &str = "read";
/// Rewrites one record.
pub const WRITE: &str = "write";
/// Removes one instance's record and files (frees the name).
pub const REMOVE: &str = "remove";
/// Lists the records of the state directory.
pub const LIST: &str = "list";
/// Starts tinyproxy again for an instance whose create was interrupted.
pub const LAUNCH: &str = "launch";
/// Reads one process's state and whether it listens.
pub const INSPECT: &str = "inspect";
/// Stops one process.
pub const STOP: &str = "stop";
/// Tells whether an address is taken.
pub const BIND: &str = "bind";
/// Makes sure the state directory exists and is writable.
pub const PREPARE: &str = "prepare";
/// Runs `tinyproxy -v`.
pub const VERSION: &str = "version";

/// A message this crate wrote itself (never text it was given), so the
/// provider may quote it in an error.
#[derive(Debug)]
pub struct MachineMessage(pub String);

impl fmt::Display for MachineMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MachineMessage {}

/// An I/O error of `kind` carrying a message of our own.
pub fn own_error(kind: io::ErrorKind, message: impl Into<String>) -> io::Error {
    io::Error::new(kind, MachineMessage(message.into()))
}

/// Adds what was being done to an OS error, keeping its kind.
fn doing(what: impl fmt::Display, e: io::Error) -> io::Error {
    own_error(e.kind(), format!("{what}: {e}"))
}

/// What a process is doing, as far as the provider cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The instance's process was never started (its create was interrupted).
    NotStarted,
    /// No such process (exited, reaped or a zombie, or the pid now belongs
    /// to another program).
    Gone,
    /// Alive but stopped by a signal or in a state it will not leave alone.
    Suspended,
    /// Alive, not listening yet.
    Starting,
    /// Alive and listening on its address.
    Listening,
}

/// The machine a local provider runs its proxies on.
#[async_trait]
pub trait Machine: Send + Sync + fmt::Debug + 'static {
    /// Makes instance `name` exist in one call: stores its record, failing
    /// with `AlreadyExists` when one is there (so two creators cannot both
    /// win), then starts tinyproxy with `config`, detached from the caller
    /// (its own process group), and remembers its pid.
    async fn create(&self, name: &str, record: &[u8], config: &str) -> io::Result<()>;
    /// The record of `name`; `NotFound` when there is none.
    async fn read(&self, name: &str) -> io::Result<Vec<u8>>;
    /// Replaces the record of `name` atomically.
    async fn write(&self, name: &str, record: &[u8]) -> io::Result<()>;
    /// Removes the record and every file of `name`; nothing there is success.
    async fn remove(&self, name: &str) -> io::Result<()>;
    /// The names that have a record.
    async fn names(&self) -> io::Result<Vec<String>>;
    /// Starts tinyproxy for `name` with `config` (again), as `create` does.
    async fn launch(&self, name: &str, config: &str) -> io::Result<()>;
    /// What the process of `name` is doing, and whether it listens on `at`.
    async fn inspect(&self, name: &str, at: SocketAddr) -> io::Result<Liveness>;
    /// Stops the process of `name` (terminate, then kill); a process that
    /// is gone, never started or is not ours is success.
    async fn stop(&self, name: &str) -> io::Result<()>;
    /// Whether something already listens on `at`.
    async fn in_use(&self, at: SocketAddr) -> io::Result<bool>;
    /// Creates the state directory if needed and proves it is writable.
    async fn prepare(&self) -> io::Result<()>;
    /// What `tinyproxy -v` prints.
    async fn version(&self) -> io::Result<String>;
    /// The directory an instance's files live in (named in its config).
    fn instance_dir(&self, name: &str) -> PathBuf;
    /// What a checker says it talked to: the state directory.
    fn describe(&self) -> String;
}

/// The real machine: files under a state directory, tinyproxy processes.
#[derive(Clone, Debug)]
pub struct SystemMachine {
    state_dir: PathBuf,
    tinyproxy: PathBuf,
}

/// How long a stopping process gets after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);
/// How long a killed process gets to disappear.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How often a stopping process is looked at.
const STOP_POLL: Duration = Duration::from_millis(20);

impl SystemMachine {
    /// A machine keeping its state under `state_dir` and running `tinyproxy`.
    pub fn new(state_dir: impl Into<PathBuf>, tinyproxy: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            tinyproxy: tinyproxy.into(),
        }
    }

    /// The state directory.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.state_dir.join(format!("{name}.json"))
    }

    fn config_path(&self, name: &str) -> PathBuf {
        self.instance_dir(name).join("tinyproxy.conf")
    }

    fn pid_path(&self, name: &str) -> PathBuf {
        self.instance_dir(name).join("launched.pid")
    }

    /// The pid `launch` recorded, if it got that far.
    /// A file that does not hold a pid (cut short by a crash) counts as none: the
    /// process, if any, is then found by its command line.
    async fn pid(&self, name: &str) -> io::Result<Option<u32>> {
        match tokio::fs::read_to_string(self.pid_path(name)).await {
            Ok(text) => Ok(text.trim().parse().ok()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `bytes` to `target` through a temporary file: with `create_new`
    /// by a link, which fails when the target exists; otherwise by a rename,
    /// which replaces it. Readers never see half a record.
    async fn place(&self, target: &Path, bytes: &[u8], create_new: bool) -> io::Result<()> {
        tokio::fs::create_dir_all(&self.state_dir).await?;
        let temp = self.state_dir.join(format!(
            ".{}.{}.{}.tmp",
            target.file_name().map(|f| f.to_string_lossy()).unwrap_or_default(),
            std::process::id(),
            TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        tokio::fs::write(&temp, bytes).await?;
        let placed = if create_new {
            tokio::fs::hard_link(&temp, target).await
        } else {
            tokio::fs::rename(&temp, target).await
        };
        let _ = tokio::fs::remove_file(&temp).await;
        placed
    }

    /// Whether process `pid` is the tinyproxy started with `name`'s config,
    /// and what state it is in.
    async fn liveness(&self, name: &str, pid: u32) -> io::Result<Liveness> {
        let stat = match tokio::fs::read(format!("/proc/{pid}/stat")).await {
            Ok(s) => s,
            Err(e) if vanished(&e) => return Ok(Liveness::Gone),
            Err(e) => return Err(e),
        };
        let cmdline = match tokio::fs::read(format!("/proc/{pid}/cmdline")).await {
            Ok(c) => c,
            Err(e) if vanished(&e) => return Ok(Liveness::Gone),
            Err(e) => return Err(e),
        };
        Ok(liveness_of(&stat, &cmdline, &self.config_path(name)))
    }

    /// Terminates process `pid` of `name`, then kills it; gone or not ours is success.
    async fn stop_one(&self, name: &str, pid: u32) -> io::Result<()> {
        if self.liveness(name, pid).await? == Liveness::Gone {
            return Ok(());
        }
        let Some(target) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else {
            return Ok(());
        };
        let signal = |s| match rustix::process::kill_process(target, s) {
            Err(e) if e == rustix::io::Errno::SRCH => Ok(()),
            other => other.map_err(io::Error::from),
        };
        signal(rustix::process::Signal::TERM)?;
        if self.wait_gone(name, pid, TERM_GRACE).await? {
            return Ok(());
        }
        signal(rustix::process::Signal::KILL)?;
        if self.wait_gone(name, pid, KILL_GRACE).await? {
            return Ok(());
        }
        Err(own_error(
            io::ErrorKind::TimedOut,
            format!("process {pid} did not exit after SIGKILL"),
        ))
    }

    async fn wait_gone(&self, name: &str, pid: u32, within: Duration) -> io::Result<bool> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.liveness(name, pid).await? == Liveness::Gone {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(STOP_POLL).await;
        }
    }
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes `text` to `path` readable by its owner only: a config may hold a password. tinyproxy
/// reads its config before it drops root, so the owner is enough.
fn write_private(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A file from before keeps its old mode through `open`.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text.as_bytes())
}

#[async_trait]
impl Machine for SystemMachine {
    async fn create(&self, name: &str, record: &[u8], config: &str) -> io::Result<()> {
        self.place(&self.record_path(name), record, true).await?;
        self.launch(name, config).await
    }

    async fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        tokio::fs::read(self.record_path(name)).await
    }

    async fn write(&self, name: &str, record: &[u8]) -> io::Result<()> {
        self.place(&self.record_path(name), record, false).await
    }

    async fn remove(&self, name: &str) -> io::Result<()> {
        match tokio::fs::remove_dir_all(self.instance_dir(name)).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        match tokio::fs::remove_file(self.record_path(name)).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    async fn names(&self) -> io::Result<Vec<String>> {
        let mut dir = match tokio::fs::read_dir(&self.state_dir).await {
            Ok(d) => d,
            // No directory yet: nothing was ever created.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        while let Some(entry) = dir.next_entry().await? {
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            if let Some(name) = file.strip_suffix(".json")
                && !name.starts_with('.')
            {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    async fn launch(&self, name: &str, config: &str) -> io::Result<()> {
        let dir = self.instance_dir(name);
        tokio::fs::create_dir_all(&dir).await?;
        let config_path = self.config_path(name);
        write_private(&config_path, config)?;
        let log_path = dir.join("tinyproxy.log");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        if let Some((uid, gid)) = drop_ids() {
            // tinyproxy opens its log after dropping root.
            std::os::unix::fs::chown(&log_path, Some(uid), Some(gid))?;
        }
        let mut cmd = tokio::process::Command::new(&self.tinyproxy);
        cmd.arg("-d")
            .arg("-c")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // What tinyproxy says before its log is open (a bad config line).
            .stderr(Stdio::from(log))
            // Its own process group: a Ctrl-C or a signal to the operator's
            // group does not reach it, so it outlives an operator restart.
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| doing(format_args!("starting {}", self.tinyproxy.display()), e))?;
        let pid = child
            .id()
            .ok_or_else(|| own_error(io::ErrorKind::Other, "tinyproxy exited before its pid was read"))?;
        // NB: dropping the handle neither waits nor kills; tokio reaps the
        // process in the background if it exits while this process lives.
        drop(child);
        // Written without an await since the spawn (a caller that gives up now cannot leave a
        // process behind that no pid file names), through a rename (a crash cannot leave half
        // a pid).
        let temp = dir.join(".launched.pid.tmp");
        std::fs::write(&temp, format!("{pid}\n"))?;
        std::fs::rename(&temp, self.pid_path(name))
    }

    async fn inspect(&self, name: &str, at: SocketAddr) -> io::Result<Liveness> {
        let Some(pid) = self.pid(name).await? else {
            return Ok(Liveness::NotStarted);
        };
        let liveness = self.liveness(name, pid).await?;
        if liveness != Liveness::Starting {
            return Ok(liveness);
        }
        let table = tokio::fs::read_to_string("/proc/net/tcp").await?;
        Ok(if listening_in(&table, at) {
            Liveness::Listening
        } else {
            Liveness::Starting
        })
    }

    async fn stop(&self, name: &str) -> io::Result<()> {
        // The recorded process, and any other started with this instance's config (one whose
        // pid was never recorded because the operator died right after starting it).
        let config = self.config_path(name);
        let mut pids = tokio::task::spawn_blocking(move || started_with(&config))
            .await
            .map_err(io::Error::other)?;
        if let Some(pid) = self.pid(name).await?
            && !pids.contains(&pid)
        {
            pids.push(pid);
        }
        for pid in pids {
            self.stop_one(name, pid).await?;
        }
        Ok(())
    }

    async fn in_use(&self, at: SocketAddr) -> io::Result<bool> {
        match std::net::TcpListener::bind(at) {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                let table = tokio::fs::read_to_string("/proc/net/tcp").await.unwrap_or_default();
                if wildcard_listener(&table, at.port()) {
                    // No loopback address can help: say what is in the way.
                    return Err(own_error(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "port {port} is taken on every address (something listens on 0.0.0.0:{port}, \
                             Debian's own tinyproxy service perhaps); give the Proxy another port",
                            port = at.port()
                        ),
                    ));
                }
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    async fn prepare(&self) -> io::Result<()> {
        let dir = self.state_dir.display();
        tokio::fs::create_dir_all(&self.state_dir)
            .await
            .map_err(|e| doing(format_args!("creating {dir}"), e))?;
        let probe = self.state_dir.join(format!(".check.{}", std::process::id()));
        tokio::fs::write(&probe, b"")
            .await
            .map_err(|e| doing(format_args!("writing in {dir}"), e))?;
        tokio::fs::remove_file(&probe).await
    }

    async fn version(&self) -> io::Result<String> {
        let out = tokio::process::Command::new(&self.tinyproxy)
            .arg("-v")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| doing(format_args!("running {} -v", self.tinyproxy.display()), e))?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || !text.starts_with("tinyproxy") {
            return Err(own_error(
                io::ErrorKind::InvalidData,
                format!(
                    "{} -v did not print a tinyproxy version ({})",
                    self.tinyproxy.display(),
                    out.status
                ),
            ));
        }
        Ok(text)
    }

    fn instance_dir(&self, name: &str) -> PathBuf {
        self.state_dir.join(name)
    }

    fn describe(&self) -> String {
        self.state_dir.display().to_string()
    }
}

/// What a process is doing, by its `/proc/<pid>/stat` and `/proc/<pid>/cmdline`, for the
/// instance whose config is `config` (listening aside).
fn liveness_of(stat: &[u8], cmdline: &[u8], config: &Path) -> Liveness {
    let state = process_state(stat);
    if matches!(state, Some('Z' | 'X' | 'x') | None) {
        return Liveness::Gone;
    }
    // NB: pids are reused; only tinyproxy started with this instance's config file is this
    // instance. One exception: a process in the middle of its exec already has its new name but
    // not yet its arguments (an empty cmdline), and the spawn returns to the provider by then; a
    // look that soon after the launch (a loaded machine widens the moment) sees tinyproxy
    // starting, not another program.
    let execing_tinyproxy = cmdline.is_empty() && command_name(stat) == Some(b"tinyproxy".as_slice());
    if !execing_tinyproxy && !is_instance_cmdline(cmdline, config) {
        return Liveness::Gone;
    }
    if matches!(state, Some('T' | 't')) {
        Liveness::Suspended
    } else {
        Liveness::Starting
    }
}

/// The command name of a `/proc/<pid>/stat` line: what stands between the first `(` and the
/// last `)` (the name may itself hold parentheses).
fn command_name(stat: &[u8]) -> Option<&[u8]> {
    let open = stat.iter().position(|b| *b == b'(')?;
    let close = stat.iter().rposition(|b| *b == b')')?;
    stat.get(open + 1..close)
}

/// Whether a `/proc/<pid>/cmdline` is tinyproxy's, started with `-c <config>`.
fn is_instance_cmdline(cmdline: &[u8], config: &Path) -> bool {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let is_tinyproxy = args
        .first()
        .is_some_and(|argv0| Path::new(std::ffi::OsStr::from_bytes(argv0)).file_name() == Some("tinyproxy".as_ref()));
    is_tinyproxy
        && args
            .windows(2)
            .any(|w| w[0] == b"-c" && w[1] == config.as_os_str().as_encoded_bytes())
}

/// The live tinyproxy processes started with `config` (one instance's).
fn started_with(config: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| is_instance_cmdline(&c, config)))
        .collect()
}

/// Whether reading a `/proc/<pid>` file failed because the process is gone: the file is missing,
/// or the process is being torn down as it is read (ESRCH).
fn vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(3)
}

/// The state letter of a `/proc/<pid>/stat` line (after the command name,
/// which may itself hold spaces and parentheses).
fn process_state(stat: &[u8]) -> Option<char> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    stat[close + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .map(|b| char::from(*b))
}

/// Whether `/proc/net/tcp` shows a listening socket on `at` (or on every
/// address at its port).
fn listening_in(table: &str, at: SocketAddr) -> bool {
    let SocketAddr::V4(at) = at else { return false };
    // The kernel prints the address's four bytes as one u32 in this machine's byte order.
    // tinyproxy binds its exact `Listen` address: a wildcard listener on the port is not it.
    let exact = format!("{:08X}:{:04X}", u32::from_ne_bytes(at.ip().octets()), at.port());
    listeners(table).any(|local| local == exact)
}

/// The local addresses (`ADDR:PORT`, hex) of the listening sockets in `/proc/net/tcp`.
fn listeners(table: &str) -> impl Iterator<Item = &str> {
    table.lines().skip(1).filter_map(|line| {
        let mut fields = line.split_whitespace();
        let local = fields.nth(1)?;
        (fields.nth(1)? == "0A").then_some(local)
    })
}

/// Whether something listens on every address at `port` (which takes the port from every
/// loopback address too).
fn wildcard_listener(table: &str, port: u16) -> bool {
    let any = format!("00000000:{port:04X}");
    listeners(table).any(|local| local == any)
}

/// The user and group tinyproxy switches to when started as root:
/// `nobody`/`nogroup`, when this machine has them.
pub fn drop_names() -> Option<(&'static str, &'static str)> {
    drop_ids().map(|_| ("nobody", "nogroup"))
}

fn drop_ids() -> Option<(u32, u32)> {
    if !rustix::process::geteuid().is_root() {
        return None;
    }
    let uid = id_of(&std::fs::read_to_string("/etc/passwd").ok()?, "nobody")?;
    let gid = id_of(&std::fs::read_to_string("/etc/group").ok()?, "nogroup")?;
    Some((uid, gid))
}

/// The numeric id of `name` in a passwd- or group-format file.
fn id_of(file: &str, name: &str) -> Option<u32> {
    file.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next() == Some(name)).then(|| fields.nth(1)?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_state_survives_odd_command_names() {
        assert_eq!(process_state(b"42 (tinyproxy) S 1 42 42 0"), Some('S'));
        assert_eq!(process_state(b"42 (a) b) Z 1"), Some('Z'));
        assert_eq!(process_state(b"42 (cut"), None);
    }

    #[test]
    fn tinyproxy_seen_in_the_middle_of_its_exec_is_starting() {
        let config = Path::new("/state/proxy-a/tinyproxy.conf");
        let ours = b"/usr/bin/tinyproxy\0-d\0-c\0/state/proxy-a/tinyproxy.conf\0";
        // As seen under load right after a launch: the new name, no arguments yet.
        let execing = b"866 (tinyproxy) R 858 866 29958 0 -1 4194304 2 0 0 0 0 0 0 0 20 0 1 0 3268064 4096 0";
        assert_eq!(liveness_of(execing, b"", config), Liveness::Starting);
        assert_eq!(liveness_of(execing, ours, config), Liveness::Starting);
        assert_eq!(liveness_of(b"866 (tinyproxy) T 858", ours, config), Liveness::Suspended);
        // A zombie (its cmdline is empty too), another program, another instance.
        assert_eq!(liveness_of(b"866 (tinyproxy) Z 858", b"", config), Liveness::Gone);
        assert_eq!(liveness_of(b"866 (bash) R 858", b"", config), Liveness::Gone);
        assert_eq!(liveness_of(b"866 (bash) R 858", b"bash\0", config), Liveness::Gone);
        assert_eq!(
            liveness_of(
                b"866 (tinyproxy) S 1",
                b"tinyproxy\0-c\0/state/proxy-b/tinyproxy.conf\0",
                config
            ),
            Liveness::Gone
        );
        assert_eq!(command_name(b"42 (a) b) Z 1"), Some(b"a) b".as_slice()));
        assert_eq!(command_name(b"42 cut"), None);
    }

    #[test]
    fn listening_sockets_are_found_by_address_and_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue\n\
            0: 0500017F:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000\n\
            1: 0600017F:0C38 0100007F:9C40 01 00000000:00000000 00:00000000 00000000\n\
            2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000\n";
        assert!(listening_in(table, "127.1.0.5:3128".parse().unwrap()));
        // Only an established connection there, not a listener.
        assert!(!listening_in(table, "127.1.0.6:3128".parse().unwrap()));
        // A wildcard listener is not an instance's (tinyproxy binds its exact address), but it
        // takes the port from every address.
        assert!(!listening_in(table, "127.3.3.3:8080".parse().unwrap()));
        assert!(wildcard_listener(table, 8080) && !wildcard_listener(table, 3128));
        assert!(!listening_in(table, "127.1.0.5:3129".parse().unwrap()));
    }

    #[test]
    fn only_tinyproxy_with_this_config_is_the_instance() {
        let config = Path::new("/state/proxy-a/tinyproxy.conf");
        let line = |args: &[&str]| args.join("\0").into_bytes();
        assert!(is_instance_cmdline(
            &line(&["/usr/bin/tinyproxy", "-d", "-c", "/state/proxy-a/tinyproxy.conf"]),
            config
        ));
        assert!(is_instance_cmdline(
            &line(&["tinyproxy", "-c", "/state/proxy-a/tinyproxy.conf", "-d"]),
            config
        ));
        // Someone reading the file, another instance, a config not given with -c.
        assert!(!is_instance_cmdline(
            &line(&["less", "/state/proxy-a/tinyproxy.conf"]),
            config
        ));
        assert!(!is_instance_cmdline(
            &line(&["/usr/bin/tinyproxy", "-c", "/state/proxy-b/tinyproxy.conf"]),
            config
        ));
        assert!(!is_instance_cmdline(
            &line(&["/usr/bin/tinyproxy", "/state/proxy-a/tinyproxy.conf"]),
            config
        ));
        assert!(!is_instance_cmdline(b"", config));
    }

    #[test]
    fn ids_come_from_passwd_format() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
        assert_eq!(id_of(passwd, "nobody"), Some(65534));
        assert_eq!(id_of(passwd, "root"), Some(0));
        assert_eq!(id_of(passwd, "daemon"), None);
        assert_eq!(id_of("nogroup:x:65534:\n", "nogroup"), Some(65534));
    }
}
