//! A host gone silent, for real: every process of a user (the test hypervisor's SSH user, so
//! its sshd sessions and what they run) stopped with SIGSTOP, and continued again.

use rustix::process::{Pid, Signal, kill_process};

/// Every process of one user, stopped until dropped (then continued).
#[derive(Debug)]
pub struct Frozen {
    pids: Vec<Pid>,
}

impl Frozen {
    /// Stops every process whose real user is `uid`. Panics when there is none: a test that
    /// meant to freeze a session and found none has gone wrong.
    pub fn freeze(uid: u32) -> Self {
        let pids = processes_of(uid);
        assert!(!pids.is_empty(), "user {uid} has no process: no session to freeze");
        for pid in &pids {
            let _ = kill_process(*pid, Signal::STOP);
        }
        Self { pids }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for pid in &self.pids {
            let _ = kill_process(*pid, Signal::CONT);
        }
    }
}

/// The processes whose real user is `uid`, from /proc.
fn processes_of(uid: u32) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|ids| ids.split_whitespace().next()?.parse::<u32>().ok())
                    == Some(uid)
            })
        })
        .filter_map(Pid::from_raw)
        .collect()
}

/// The uid of `user`, from /etc/passwd.
///
/// # Panics
/// When /etc/passwd has no such user.
pub fn uid_of(user: &str) -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    passwd
        .lines()
        .find_map(|l| {
            let mut fields = l.split(':');
            (fields.next() == Some(user)).then(|| fields.nth(1)?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no user {user} in /etc/passwd"))
}
