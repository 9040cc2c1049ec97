//! Where the operator's packets go, as the kernel sees them: the binary run under strace
//! (Debian's `strace`, which `cargo xtask test` installs), recording every `connect`, `sendto`,
//! `sendmsg` and `sendmmsg` of every thread with the socket address it names. A test then reads
//! the addresses back, so "nothing was dialled" is checked below every library the binary uses,
//! name resolution included (a lookup is a datagram to a name server).

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

/// The calls that name a destination: a stream is dialled with `connect`, a datagram may name
/// its destination in any of the send calls.
const CALLS: &str = "trace=connect,sendto,sendmsg,sendmmsg";

/// Whether strace can run here; without it a test skips the trace with a reason, and fails when
/// real backends are required (`egress_testkit::real`, as under `cargo xtask test`, which
/// installs it).
pub fn strace_available() -> bool {
    let found = Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        egress_testkit::real::skip_or_fail(
            "tracing the packets",
            "strace is not installed (cargo xtask test installs it)",
        );
    }
    found
}

/// A command that runs `binary` under strace, writing the trace to `file`. strace keeps its own
/// default of blocking fatal signals, so a test stops the binary by signalling it (strace's only
/// child), and strace then exits with the binary's status.
pub fn traced(binary: &Path, file: &Path) -> Command {
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-e", CALLS, "-e", "signal=none", "-o"])
        .arg(file)
        .arg("--")
        .arg(binary);
    cmd
}

/// Every IPv4 and IPv6 address the trace names as a destination, in order. strace writes them
/// as `inet_addr("192.0.2.1")` and `inet_pton(AF_INET6, "2001:db8::1", ...)`.
pub fn destinations(trace: &str) -> Vec<IpAddr> {
    const MARKERS: [&str; 2] = ["inet_addr(\"", "inet_pton(AF_INET6, \""];
    let mut found = Vec::new();
    for line in trace.lines() {
        for marker in MARKERS {
            for (at, _) in line.match_indices(marker) {
                let rest = &line[at + marker.len()..];
                let literal = &rest[..rest.find('"').unwrap_or(rest.len())];
                let ip = literal
                    .parse()
                    .unwrap_or_else(|e| panic!("strace wrote {literal:?} ({e}) in {line}"));
                found.push(ip);
            }
        }
    }
    found
}

/// Whether `ip` stays on this machine's loopback device (IPv4-mapped forms included).
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}
