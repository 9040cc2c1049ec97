//! What can go wrong reaching a host, and running a libvirt call on it.
//!
//! Errors keep their cause's kind (a missing key file, a changed host key, a refused key, a
//! network error) so each provider can apply its own classification and each checker its own
//! reasons; the stage only names where the dial stopped.

use std::fmt;
use std::io;
use std::time::Duration;

/// Where a dial stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Reading and parsing the key and known_hosts files.
    Credentials,
    /// The TCP connection to the host's address.
    Tcp,
    /// The SSH handshake: host key and authentication.
    Ssh,
    /// The direct-streamlocal channel to the host's libvirt socket.
    Socket,
    /// libvirt's own handshake through the channel.
    Libvirt,
}

impl Stage {
    /// The stage's tag, as dial messages and logs show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Credentials => "credentials",
            Self::Tcp => "tcp",
            Self::Ssh => "ssh",
            Self::Socket => "socket",
            Self::Libvirt => "libvirt",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
pub enum DialCause {
    /// The key file could not be read.
    #[error("reading ssh key file {path}: {source}")]
    KeyRead {
        /// The file.
        path: String,
        /// What the system said.
        source: io::Error,
    },
    /// The key file holds no usable private key (a public key, a passphrase, garbage).
    #[error("parsing ssh key file {path}: {reason}")]
    KeyParse {
        /// The file.
        path: String,
        /// What the parser said (never the file's content).
        reason: String,
    },
    /// The key file may be read by others than its owner and group: a private key kept so is
    /// taken as exposed, and not used.
    #[error(
        "ssh key file {path} may be read by others (mode {mode:03o}): a private key must not be; make it 0600, or 0440 with the Pod's fsGroup (the Secret volume's defaultMode)"
    )]
    KeyExposed {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The known_hosts file could not be read.
    #[error("reading known_hosts file {path}: {source}")]
    KnownHostsRead {
        /// The file.
        path: String,
        /// What the system said.
        source: io::Error,
    },
    /// The known_hosts file could not be parsed.
    #[error("parsing known_hosts file {path}: {reason}")]
    KnownHostsParse {
        /// The file.
        path: String,
        /// What the parser said.
        reason: String,
    },
    /// The host's key is not in known_hosts.
    #[error("knownhosts: key is unknown for {host}")]
    HostKeyUnknown {
        /// The `host:port` looked up.
        host: String,
    },
    /// known_hosts holds another key of the same type for the host.
    #[error("knownhosts: key mismatch for {host} (known_hosts line {line})")]
    HostKeyChanged {
        /// The `host:port` looked up.
        host: String,
        /// The known_hosts line that holds the other key.
        line: usize,
    },
    /// The key the host showed is on an `@revoked` line of known_hosts (review L2): refused
    /// whatever else the file says about the host.
    #[error("knownhosts: the key {host} showed is revoked (known_hosts line {line})")]
    HostKeyRevoked {
        /// The `host:port` looked up.
        host: String,
        /// The `@revoked` line.
        line: usize,
    },
    /// The server refused our key.
    #[error("ssh: unable to authenticate as {user}: the server refused the key")]
    AuthRefused {
        /// The user we tried.
        user: String,
    },
    /// A network error (refused, reset, unreachable).
    #[error("{0}")]
    Io(#[source] io::Error),
    /// The SSH protocol failed.
    #[error("ssh: {0}")]
    Ssh(String),
    /// The host refused the streamlocal channel (forwarding off, no such socket).
    #[error("opening {socket}: {reason}")]
    ChannelRejected {
        /// The remote socket.
        socket: String,
        /// What russh reported.
        reason: String,
    },
    /// libvirt's handshake failed.
    #[error("connecting to libvirt: {0}")]
    Libvirt(String),
    /// The dial's budget ran out.
    #[error("dial exceeded its {0:?} budget")]
    Budget(Duration),
    /// The caller gave up.
    #[error("dial abandoned: {0}")]
    Cancelled(String),
}

/// A dial that failed: `dialing host <name> (<stage>): <cause>`.
#[derive(Debug, thiserror::Error)]
#[error("dialing host {host} ({stage}): {cause}")]
pub struct DialError {
    /// The host's configured name.
    pub host: String,
    /// Where it stopped.
    pub stage: Stage,
    /// Why.
    #[source]
    pub cause: DialCause,
}

impl DialError {
    /// Whether the key file is missing or unreadable, or holds no usable key.
    pub fn is_key_error(&self) -> bool {
        matches!(
            self.cause,
            DialCause::KeyRead { .. } | DialCause::KeyParse { .. } | DialCause::KeyExposed { .. }
        )
    }

    /// Whether the host key could not be verified (unknown, changed, revoked, or known_hosts
    /// unusable).
    pub fn is_host_key_error(&self) -> bool {
        matches!(
            self.cause,
            DialCause::HostKeyUnknown { .. }
                | DialCause::HostKeyChanged { .. }
                | DialCause::HostKeyRevoked { .. }
                | DialCause::KnownHostsRead { .. }
                | DialCause::KnownHostsParse { .. }
        )
    }

    /// Whether the server refused our key.
    pub fn is_auth_error(&self) -> bool {
        matches!(self.cause, DialCause::AuthRefused { .. })
    }

    /// Whether the dial ran out of time or was abandoned.
    pub fn is_timeout(&self) -> bool {
        matches!(self.cause, DialCause::Budget(_) | DialCause::Cancelled(_))
            || matches!(&self.cause, DialCause::Io(e) if e.kind() == io::ErrorKind::TimedOut)
    }
}

/// A libvirt call that failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The connection was already dead; nothing was sent.
    #[error("libvirt call {rpc} on {host}: connection is closed: {reason}")]
    Closed {
        /// The call.
        rpc: String,
        /// The host.
        host: String,
        /// Why the connection died.
        reason: String,
    },
    /// The caller had already given up; nothing was sent.
    #[error("libvirt call {rpc} on {host} not started: {why}")]
    NotStarted {
        /// The call.
        rpc: String,
        /// The host.
        host: String,
        /// Cancelled or past its deadline.
        why: String,
    },
    /// The caller gave up during the call; the connection was torn down.
    #[error("libvirt call {rpc} on {host} abandoned: {why}")]
    Abandoned {
        /// The call.
        rpc: String,
        /// The host.
        host: String,
        /// Cancelled or past its deadline.
        why: String,
    },
    /// The call outlived its budget; the connection was torn down.
    #[error("libvirt call {rpc} on {host} exceeded its {budget:?} budget")]
    OverBudget {
        /// The call.
        rpc: String,
        /// The host.
        host: String,
        /// The budget.
        budget: Duration,
    },
    /// The connection died while this call waited: another caller killed it, or the bridge
    /// took the host for dead, and the call's own failure (if it had one) came from that.
    #[error("libvirt call {rpc} on {host}: connection closed while waiting: {reason}")]
    ClosedWhileWaiting {
        /// The call.
        rpc: String,
        /// The host.
        host: String,
        /// Why the connection died.
        reason: String,
    },
    /// libvirt answered with an error.
    #[error("libvirt call {rpc} on {host}: {error}")]
    Libvirt {
        /// The call.
        rpc: String,
        /// The host.
        host: String,
        /// libvirt's error (code, domain, message).
        error: virt::error::Error,
        /// Whether the error came from the connection rather than the daemon (the connection
        /// was then marked dead).
        transport: bool,
    },
}

impl CallError {
    /// libvirt's error, when libvirt answered.
    pub fn libvirt(&self) -> Option<&virt::error::Error> {
        match self {
            Self::Libvirt { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether the failure is the connection's (always worth a retry over a new one), not an
    /// answer of the daemon.
    pub fn is_transport(&self) -> bool {
        !matches!(self, Self::Libvirt { transport: false, .. })
    }
}
