//! `cargo xtask hypervisor up|down|status`: a real libvirt hypervisor on this machine, reached
//! the way the libvirt providers reach one (SSH as an unprivileged user, then libvirt's socket).
//!
//! `up` (root only; idempotent, each step checks before it acts):
//!
//! 1. installs the packages (libvirt 9 from Debian; QEMU from bookworm-backports when this
//!    machine's qemu-utils already comes from there, through a private apt state so /etc/apt is
//!    untouched), with service starts disabled (no init system here);
//! 2. starts virtlogd and libvirtd by hand, libvirtd with a config that lets the `libvirt` group
//!    use its socket without polkit;
//! 3. a `dir` storage pool `default`, and libvirt's `default` NAT network (virbr0);
//! 4. sshd on 127.0.0.1:2222 with its own config: key-only login for one user in the `libvirt`
//!    group, unix-socket forwarding allowed; the client key and a known_hosts file;
//! 5. the test guest image (fixtures/guest-image/build.sh), built once;
//! 6. checks the whole path with the OpenSSH client, and writes the env file the tests read.
//!
//! Everything lives in [`DIR`]. `down` stops and removes only what `up` started or created (it
//! records each in `DIR/created`), restores `net.ipv4.ip_forward`, and keeps the package and
//! image caches. Packages stay installed.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::system;

/// Where the hypervisor's state lives (world-traversable: QEMU runs as libvirt-qemu).
pub(crate) const DIR: &str = "/tmp/egress-hv";
/// The file the tests read (`KEY=value` lines).
pub(crate) const ENV_FILE: &str = "/tmp/egress-hv/env";
/// sshd's port on 127.0.0.1.
const SSH_PORT: u16 = 2222;
/// The unprivileged user the tests log in as.
const USER: &str = "egress-hv";
/// libvirt's socket on this host.
const LIBVIRT_SOCKET: &str = "/run/libvirt/libvirt-sock";
/// The pool and network the tests use.
const POOL: &str = "default";
const NETWORK: &str = "default";
const BRIDGE: &str = "virbr0";
const GATEWAY: &str = "192.168.122.1";

/// Packages from the machine's own suite.
const PACKAGES: &[&str] = &[
    "libvirt-daemon-system",
    "libvirt-daemon-system-sysv",
    "libvirt-clients",
    "libvirt-daemon-driver-qemu",
    "libvirt-dev",
    "pkg-config",
    "ovmf",
    "dnsmasq-base",
    "openssh-server",
    "openssh-client",
    "iproute2",
    "iptables",
    "mtools",
    "dosfstools",
    "fdisk",
    "cpio",
    "qemu-utils",
];
/// QEMU, when it can come from the machine's suite.
const QEMU: &[&str] = &["qemu-system-x86"];
/// QEMU from bookworm-backports, to match a backports qemu-utils (which Breaks the older
/// qemu-system-common); QEMU 10 needs the newer seabios too.
const QEMU_BACKPORTS: &[&str] = &[
    "qemu-system-x86/bookworm-backports",
    "qemu-system-common/bookworm-backports",
    "qemu-system-data/bookworm-backports",
    "qemu-block-extra/bookworm-backports",
    "seabios/bookworm-backports",
];

fn dir() -> PathBuf {
    PathBuf::from(DIR)
}

fn virsh(args: &[&str]) -> Command {
    let mut c = Command::new("virsh");
    c.args(["-q", "-c", "qemu:///system"]).args(args);
    c
}

/// Runs a command; its output is returned when it succeeds.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether a command succeeds (its output discarded).
fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The pid in `pid_file`, when it is a live process running `program` (a pid file can outlive
/// its daemon, and the pid be reused by anything).
fn running_pid(pid_file: &Path, program: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let zombie = stat
        .rsplit(')')
        .next()
        .is_some_and(|rest| rest.trim_start().starts_with('Z'));
    (exe.file_name().is_some_and(|n| n == program) && !zombie).then_some(pid)
}

/// Whether the pid in `pid_file` is a live `program`.
fn alive(pid_file: &Path, program: &str) -> bool {
    running_pid(pid_file, program).is_some()
}

/// What `up` created, so `down` undoes exactly that.
struct Created(BTreeSet<String>);

impl Created {
    fn path() -> PathBuf {
        dir().join("created")
    }

    fn load() -> Self {
        Self(
            std::fs::read_to_string(Self::path())
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect(),
        )
    }

    fn add(&mut self, what: &str) -> Result<()> {
        if self.0.insert(what.to_owned()) {
            let text: String = self.0.iter().map(|w| format!("{w}\n")).collect();
            std::fs::write(Self::path(), text)?;
        }
        Ok(())
    }

    fn has(&self, what: &str) -> bool {
        self.0.contains(what)
    }
}

fn say(started: Instant, what: &str) {
    println!("hypervisor [{:>5.1}s] {what}", started.elapsed().as_secs_f64());
}

pub(crate) fn up(root: &Path) -> Result<()> {
    if !system::is_root() {
        bail!("cargo xtask hypervisor up needs root (apt, daemons, a user, sshd)");
    }
    let started = Instant::now();
    std::fs::create_dir_all(dir())?;
    set_mode(&dir(), 0o755)?;
    let mut created = Created::load();

    packages()?;
    say(started, "packages installed");

    daemons(&mut created)?;
    say(started, "libvirtd and virtlogd running");

    storage_and_network(&mut created)?;
    say(started, &format!("pool {POOL} and network {NETWORK} ({BRIDGE}) active"));

    ssh(&mut created)?;
    say(started, &format!("sshd on 127.0.0.1:{SSH_PORT}, user {USER}"));

    let image = dir().join("guest/guest.qcow2");
    if !image.exists() {
        say(started, "building the test guest image");
        let status = Command::new(root.join("fixtures/guest-image/build.sh"))
            .arg(dir().join("guest"))
            .arg(dir().join("cache/debs"))
            .status()
            .context("running fixtures/guest-image/build.sh")?;
        if !status.success() {
            bail!("building the test guest image failed ({status})");
        }
    }
    say(started, &format!("test guest image {}", image.display()));

    self_check()?;
    std::fs::write(ENV_FILE, env_text(&image))?;
    say(started, &format!("ready; settings in {ENV_FILE}"));
    Ok(())
}

fn env_text(image: &Path) -> String {
    let ssh = dir().join("ssh");
    let mut text = String::from("# Written by cargo xtask hypervisor up; read by the libvirt tests.\n");
    for (key, value) in [
        ("EGRESS_HV_SSH_ADDRESS", format!("127.0.0.1:{SSH_PORT}")),
        ("EGRESS_HV_SSH_USER", USER.to_owned()),
        ("EGRESS_HV_SSH_KEY", ssh.join("id_ed25519").display().to_string()),
        ("EGRESS_HV_KNOWN_HOSTS", ssh.join("known_hosts").display().to_string()),
        ("EGRESS_HV_LIBVIRT_SOCKET", LIBVIRT_SOCKET.to_owned()),
        ("EGRESS_HV_POOL", POOL.to_owned()),
        ("EGRESS_HV_NETWORK", NETWORK.to_owned()),
        ("EGRESS_HV_BRIDGE", BRIDGE.to_owned()),
        ("EGRESS_HV_GATEWAY", GATEWAY.to_owned()),
        // KVM cannot run guests here (no VMX/SVM): software emulation.
        ("EGRESS_HV_DOMAIN_TYPE", "qemu".to_owned()),
        ("EGRESS_HV_GUEST_IMAGE", image.display().to_string()),
    ] {
        let _ = writeln!(text, "{key}={value}");
    }
    text
}

fn packages() -> Result<()> {
    let backports = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "qemu-utils"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("bpo"));
    let mut wanted: Vec<&str> = PACKAGES.to_vec();
    let qemu_missing = !system::installed("qemu-system-x86");
    let missing: Vec<&str> = wanted.iter().copied().filter(|p| !system::installed(p)).collect();
    if missing.is_empty() && !qemu_missing {
        return Ok(());
    }
    let mut apt_options: Vec<String> = Vec::new();
    if backports {
        let state = dir().join("cache/apt-backports");
        std::fs::create_dir_all(state.join("lists/partial"))?;
        std::fs::create_dir_all(state.join("archives/partial"))?;
        let sources = state.join("sources.list");
        std::fs::write(
            &sources,
            "deb http://deb.debian.org/debian bookworm main\n\
             deb http://deb.debian.org/debian bookworm-updates main\n\
             deb http://deb.debian.org/debian-security bookworm-security main\n\
             deb http://deb.debian.org/debian bookworm-backports main\n",
        )?;
        apt_options = vec![
            format!("-oDir::Etc::sourcelist={}", sources.display()),
            "-oDir::Etc::sourceparts=-".to_owned(),
            format!("-oDir::State::lists={}", state.join("lists").display()),
            format!("-oDir::Cache::archives={}", state.join("archives").display()),
        ];
        wanted.extend(QEMU_BACKPORTS);
    } else {
        wanted.extend(QEMU);
    }
    // No init system: maintainer scripts must not try to start the services.
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let made_policy = !policy.exists();
    if made_policy {
        std::fs::write(policy, "#!/bin/sh\nexit 101\n")?;
        set_mode(policy, 0o755)?;
    }
    println!("hypervisor: installing {}", wanted.join(" "));
    let result = run(Command::new("apt-get").args(&apt_options).args(["update", "-qq"])).and_then(|_| {
        run(Command::new("apt-get")
            .args(&apt_options)
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&wanted)
            .env("DEBIAN_FRONTEND", "noninteractive"))
    });
    if made_policy {
        let _ = std::fs::remove_file(policy);
    }
    result.map(drop)
}

fn daemons(created: &mut Created) -> Result<()> {
    if Path::new("/dev/kvm").exists() {
        let _ = run(Command::new("chgrp").args(["kvm", "/dev/kvm"]));
        let _ = set_mode(Path::new("/dev/kvm"), 0o660);
    }
    let conf = dir().join("libvirtd.conf");
    // No polkit or D-Bus here: the socket's group decides who may use it.
    std::fs::write(
        &conf,
        "unix_sock_group = \"libvirt\"\nunix_sock_ro_perms = \"0777\"\nunix_sock_rw_perms = \"0770\"\n\
         auth_unix_ro = \"none\"\nauth_unix_rw = \"none\"\n",
    )?;
    std::fs::create_dir_all("/run/libvirt")?;
    if !alive(Path::new("/run/virtlogd.pid"), "virtlogd") {
        run(Command::new("virtlogd").arg("-d"))?;
        created.add("virtlogd")?;
    }
    if !alive(Path::new("/run/libvirtd.pid"), "libvirtd") {
        run(Command::new("libvirtd").arg("-d").arg("-f").arg(&conf))?;
        created.add("libvirtd")?;
    }
    // The first start probes QEMU's capabilities (several seconds).
    let deadline = Instant::now() + Duration::from_secs(90);
    while !succeeds(&mut virsh(&["version"])) {
        if Instant::now() > deadline {
            bail!("libvirtd did not answer within 90 s");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

fn storage_and_network(created: &mut Created) -> Result<()> {
    let pool_dir = dir().join("pool");
    std::fs::create_dir_all(&pool_dir)?;
    set_mode(&pool_dir, 0o755)?;
    if !succeeds(&mut virsh(&["pool-info", POOL])) {
        run(&mut virsh(&[
            "pool-define-as",
            POOL,
            "dir",
            "--target",
            &pool_dir.display().to_string(),
        ]))?;
        run(&mut virsh(&["pool-build", POOL]))?;
        created.add("pool")?;
    }
    if !reports(&["pool-info", POOL], "State:", "running") {
        run(&mut virsh(&["pool-start", POOL]))?;
    }
    run(&mut virsh(&["pool-refresh", POOL]))?;

    let forward = dir().join("ip_forward.orig");
    if !forward.exists() {
        std::fs::copy("/proc/sys/net/ipv4/ip_forward", &forward)?;
    }
    if !succeeds(&mut virsh(&["net-info", NETWORK])) {
        let xml = dir().join("network.xml");
        std::fs::write(
            &xml,
            format!(
                "<network>\n  <name>{NETWORK}</name>\n  <forward mode='nat'/>\n  <bridge name='{BRIDGE}' stp='on' delay='0'/>\n  \
                 <ip address='{GATEWAY}' netmask='255.255.255.0'>\n    <dhcp><range start='192.168.122.2' end='192.168.122.254'/></dhcp>\n  \
                 </ip>\n</network>\n"
            ),
        )?;
        run(&mut virsh(&["net-define", &xml.display().to_string()]))?;
        created.add("network")?;
    }
    if !reports(&["net-info", NETWORK], "Active:", "yes") {
        run(&mut virsh(&["net-start", NETWORK]))?;
    }
    Ok(())
}

fn ssh(created: &mut Created) -> Result<()> {
    let ssh = dir().join("ssh");
    std::fs::create_dir_all(&ssh)?;
    set_mode(&ssh, 0o700)?;
    if !succeeds(Command::new("id").arg(USER)) {
        run(Command::new("useradd").args(["-m", "-s", "/bin/sh", USER]))?;
        created.add("user")?;
    }
    run(Command::new("usermod").args(["-aG", "libvirt,kvm", USER]))?;
    // Unlocked without a password: with UsePAM no, sshd refuses locked accounts even for keys.
    run(Command::new("usermod").args(["-p", "*", USER]))?;
    for (file, comment) in [
        ("id_ed25519", "egress-hv-client"),
        ("ssh_host_ed25519_key", "egress-hv-host"),
    ] {
        if !ssh.join(file).exists() {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
                .arg(ssh.join(file)))?;
        }
    }
    let home = run(Command::new("getent").args(["passwd", USER]))?
        .split(':')
        .nth(5)
        .map(str::to_owned)
        .context("the user has no home directory")?;
    // The authorized key lives in the home directory: sshd's StrictModes refuses one under /tmp.
    let dot_ssh = Path::new(&home).join(".ssh");
    run(Command::new("install")
        .args(["-d", "-m", "700", "-o", USER, "-g", USER])
        .arg(&dot_ssh))?;
    run(Command::new("install")
        .args(["-m", "600", "-o", USER, "-g", USER])
        .arg(ssh.join("id_ed25519.pub"))
        .arg(dot_ssh.join("authorized_keys")))?;
    let config = ssh.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "Port {SSH_PORT}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {pid}\n\
             AuthenticationMethods publickey\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPermitRootLogin no\nUsePAM no\nAllowUsers {USER}\n\
             AllowTcpForwarding yes\nAllowStreamLocalForwarding yes\nX11Forwarding no\nPrintMotd no\n\
             LogLevel VERBOSE\n",
            host_key = ssh.join("ssh_host_ed25519_key").display(),
            pid = ssh.join("sshd.pid").display(),
        ),
    )?;
    std::fs::create_dir_all("/run/sshd")?;
    set_mode(Path::new("/run/sshd"), 0o755)?;
    run(Command::new("/usr/sbin/sshd").arg("-t").arg("-f").arg(&config))?;
    if !alive(&ssh.join("sshd.pid"), "sshd") {
        run(Command::new("/usr/sbin/sshd")
            .arg("-f")
            .arg(&config)
            .arg("-E")
            .arg(ssh.join("sshd.log")))?;
        created.add("sshd")?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let scanned = Command::new("ssh-keyscan")
            .args(["-p", &SSH_PORT.to_string(), "-t", "ed25519", "127.0.0.1"])
            .stderr(Stdio::null())
            .output()?;
        if scanned.status.success() && !scanned.stdout.is_empty() {
            std::fs::write(ssh.join("known_hosts"), &scanned.stdout)?;
            break;
        }
        if Instant::now() > deadline {
            bail!("sshd did not answer ssh-keyscan within 20 s");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    set_mode(&ssh.join("known_hosts"), 0o644)?;
    Ok(())
}

/// Logs in as the test user with the OpenSSH client and lists the pools through libvirt.
fn self_check() -> Result<()> {
    let ssh = dir().join("ssh");
    let pools = run(Command::new("ssh")
        .arg("-i")
        .arg(ssh.join("id_ed25519"))
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", ssh.join("known_hosts").display()))
        .args([
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-p",
            &SSH_PORT.to_string(),
            &format!("{USER}@127.0.0.1"),
            "virsh -q -c qemu:///system pool-list --name",
        ]))
    .context("logging in over SSH and asking libvirt for its pools")?;
    if !pools.lines().any(|l| l.trim() == POOL) {
        bail!("libvirt, asked over SSH, does not list pool {POOL}: {pools:?}");
    }
    Ok(())
}

/// Whether `virsh <args>` answers with a `<field> ... <value>` line (a pool running, a network
/// active).
fn reports(args: &[&str], field: &str, value: &str) -> bool {
    run(&mut virsh(args)).is_ok_and(|out| out.lines().any(|l| l.starts_with(field) && l.contains(value)))
}

/// What `up` provides, each with whether it is running now.
fn checks() -> [(&'static str, bool); 7] {
    let ssh = dir().join("ssh");
    [
        ("virtlogd", alive(Path::new("/run/virtlogd.pid"), "virtlogd")),
        (
            "libvirtd",
            alive(Path::new("/run/libvirtd.pid"), "libvirtd") && succeeds(&mut virsh(&["version"])),
        ),
        ("pool default", reports(&["pool-info", POOL], "State:", "running")),
        ("network default", reports(&["net-info", NETWORK], "Active:", "yes")),
        ("sshd", alive(&ssh.join("sshd.pid"), "sshd")),
        ("test guest image", dir().join("guest/guest.qcow2").exists()),
        ("env file", Path::new(ENV_FILE).exists()),
    ]
}

/// Whether the hypervisor is up now. The env file alone does not say so: a run that was killed
/// (or a machine that restarted) leaves it behind with the daemons gone.
pub(crate) fn is_up() -> bool {
    checks().iter().all(|(_, ok)| *ok)
}

pub(crate) fn status() -> Result<()> {
    let rows = checks();
    for (what, ok) in rows {
        println!("{what:<18} {}", if ok { "up" } else { "down" });
    }
    if rows.iter().all(|(_, ok)| *ok) {
        println!("settings: {ENV_FILE}");
    }
    Ok(())
}

pub(crate) fn down() -> Result<()> {
    if !system::is_root() {
        bail!("cargo xtask hypervisor down needs root");
    }
    let created = Created::load();
    let ssh = dir().join("ssh");
    let _ = std::fs::remove_file(ENV_FILE);
    if created.has("sshd") {
        stop(&ssh.join("sshd.pid"), "sshd");
    }
    if succeeds(&mut virsh(&["version"])) {
        // Test domains left behind (a crashed test): ours carry the test prefix.
        if let Ok(names) = run(&mut virsh(&["list", "--all", "--name"])) {
            for name in names.lines().map(str::trim).filter(|n| n.starts_with("egress-test-")) {
                let _ = run(&mut virsh(&["destroy", name]));
                let _ = run(&mut virsh(&["undefine", name, "--nvram"]));
            }
        }
        if created.has("network") {
            let _ = run(&mut virsh(&["net-destroy", NETWORK]));
            let _ = run(&mut virsh(&["net-undefine", NETWORK]));
        }
        if created.has("pool") {
            let _ = run(&mut virsh(&["pool-destroy", POOL]));
            let _ = run(&mut virsh(&["pool-undefine", POOL]));
        }
    }
    if created.has("libvirtd") {
        stop(Path::new("/run/libvirtd.pid"), "libvirtd");
    }
    if created.has("virtlogd") {
        stop(Path::new("/run/virtlogd.pid"), "virtlogd");
    }
    if let Ok(value) = std::fs::read_to_string(dir().join("ip_forward.orig")) {
        let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", value);
    }
    if created.has("user") {
        let _ = run(Command::new("userdel").args(["-r", USER]));
    }
    // Keep the caches (packages, the guest image); remove the rest.
    for entry in std::fs::read_dir(dir()).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if name != "cache" && name != "guest" {
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
    println!("hypervisor: down (packages, {DIR}/cache and {DIR}/guest kept)");
    Ok(())
}

/// SIGTERM to the `program` whose pid is in `pid_file`, then waits up to 10 s for it to go,
/// then SIGKILL. A pid that is not (or no longer) that program is left alone.
fn stop(pid_file: &Path, program: &str) {
    let Some(pid) = running_pid(pid_file, program).and_then(rustix::process::Pid::from_raw) else {
        return;
    };
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid_file, program) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if alive(pid_file, program) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}
