//! The seam between the libvirt providers and libvirt: the calls they make on one hypervisor,
//! by name (domains, pools, volumes), each bounded and cancellable.
//!
//! `egress-libvirt-ssh` implements it over SSH with libvirt's C client; [`crate::fake`] (feature
//! `fake`) implements it in memory, with fault injection, for the providers' conformance suites.
//! Errors carry libvirt's error number ([`code`]), so a provider classifies them by its table,
//! and say whether the connection failed rather than the daemon (always worth a retry).

use std::fmt;
use std::io::Read;
use std::net::IpAddr;

use async_trait::async_trait;
use egress_provider::OpCtx;

/// libvirt's error numbers the providers branch on (`virErrorNumber`).
pub mod code {
    /// Internal error.
    pub const INTERNAL_ERROR: i32 = 1;
    /// Invalid argument.
    pub const INVALID_ARG: i32 = 8;
    /// System (I/O) error.
    pub const SYSTEM_ERROR: i32 = 38;
    /// RPC error.
    pub const RPC: i32 = 39;
    /// No such domain.
    pub const NO_DOMAIN: i32 = 42;
    /// No such storage pool.
    pub const NO_STORAGE_POOL: i32 = 49;
    /// No such storage volume.
    pub const NO_STORAGE_VOL: i32 = 50;
    /// The operation is not valid in the object's state (already running, not running...).
    pub const OPERATION_INVALID: i32 = 55;
    /// Access denied.
    pub const ACCESS_DENIED: i32 = 88;
    /// The domain has no metadata in that namespace.
    pub const NO_DOMAIN_METADATA: i32 = 80;
    /// The guest agent does not answer.
    pub const AGENT_UNRESPONSIVE: i32 = 86;
    /// The storage volume already exists.
    pub const STORAGE_VOL_EXIST: i32 = 90;
}

/// What stopped a connection from being made, for the providers' classification and the
/// checkers' reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DialFailure {
    /// The key file cannot be read (missing, say, until its Secret is mounted).
    KeyUnreadable,
    /// The key file holds no usable private key (a public key, a passphrase, garbage).
    KeyInvalid,
    /// The known_hosts file cannot be read.
    KnownHostsUnreadable,
    /// The known_hosts file does not parse.
    KnownHostsInvalid,
    /// The host's key is not in known_hosts, or another key is.
    HostKey,
    /// The server refused the key.
    Auth,
    /// The dial ran out of time or was abandoned.
    Timeout,
    /// TCP or SSH failed (refused, reset, unreachable, protocol).
    Network,
    /// The host refused the channel to its libvirt socket.
    Socket,
    /// libvirt's own handshake failed.
    Libvirt,
}

/// A libvirt call that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibvirtError {
    /// libvirt's error number; 0 when the connection failed before libvirt answered.
    pub code: i32,
    /// What happened (libvirt's message, or the transport's).
    pub message: String,
    /// Whether the connection failed rather than the daemon (a dead link, an abandoned or
    /// overlong call, an I/O error): always Transient, worth a retry over a new connection.
    pub transport: bool,
    /// When no connection could be made: where that failed.
    pub dial: Option<DialFailure>,
    /// Whether the call ran out of time or its caller gave up (a transport failure too). For a
    /// dial: whether its caller gave up (a dial's own budget running out is
    /// [`DialFailure::Timeout`] alone: a host that does not answer).
    pub timed_out: bool,
}

impl LibvirtError {
    /// An answer of the daemon with error number `code`.
    pub fn daemon(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            transport: false,
            dial: None,
            timed_out: false,
        }
    }

    /// A failure of the connection.
    pub fn transport(message: impl Into<String>) -> Self {
        Self {
            code: 0,
            message: message.into(),
            transport: true,
            dial: None,
            timed_out: false,
        }
    }

    /// A call that ran out of time, or whose caller gave up.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self {
            timed_out: true,
            ..Self::transport(message)
        }
    }

    /// No connection could be made, for `failure`.
    pub fn dial(failure: DialFailure, message: impl Into<String>) -> Self {
        Self {
            dial: Some(failure),
            ..Self::transport(message)
        }
    }

    /// Whether libvirt answered with `code`.
    pub fn is(&self, code: i32) -> bool {
        !self.transport && self.code == code
    }
}

impl fmt::Display for LibvirtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.transport {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{} (libvirt error {})", self.message, self.code)
        }
    }
}

impl std::error::Error for LibvirtError {}

/// A call's result.
pub type LvResult<T> = Result<T, LibvirtError>;

/// A domain's state (`virDomainState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainState {
    /// No state.
    NoState,
    /// Running.
    Running,
    /// Blocked on a resource (still running).
    Blocked,
    /// Paused, and why (an administrator, a full disk, a migration, a crash...).
    Paused(PauseReason),
    /// Being shut down.
    Shutdown,
    /// Shut off.
    Shutoff,
    /// Crashed.
    Crashed,
    /// Suspended by guest power management.
    PmSuspended,
    /// A value libvirt added later.
    Other(u32),
}

impl DomainState {
    /// From libvirt's state number and its reason (`virDomainGetState`); the reason matters
    /// only for a paused domain.
    pub fn from_raw(raw: u32, reason: u32) -> Self {
        match raw {
            0 => Self::NoState,
            1 => Self::Running,
            2 => Self::Blocked,
            3 => Self::Paused(PauseReason(reason)),
            4 => Self::Shutdown,
            5 => Self::Shutoff,
            6 => Self::Crashed,
            7 => Self::PmSuspended,
            other => Self::Other(other),
        }
    }

    /// Whether the domain runs (running or blocked).
    pub fn is_active(self) -> bool {
        matches!(self, Self::Running | Self::Blocked)
    }

    /// libvirt's name for it (`DomainRunning`...), as messages show it.
    pub fn name(self) -> String {
        match self {
            Self::NoState => "DomainNostate".to_owned(),
            Self::Running => "DomainRunning".to_owned(),
            Self::Blocked => "DomainBlocked".to_owned(),
            Self::Paused(_) => "DomainPaused".to_owned(),
            Self::Shutdown => "DomainShutdown".to_owned(),
            Self::Shutoff => "DomainShutoff".to_owned(),
            Self::Crashed => "DomainCrashed".to_owned(),
            Self::PmSuspended => "DomainPmsuspended".to_owned(),
            Self::Other(n) => format!("DomainState({n})"),
        }
    }
}

/// Why a domain is paused (`virDomainPausedReason`), as libvirt numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseReason(pub u32);

impl PauseReason {
    /// libvirt did not say.
    pub const UNKNOWN: Self = Self(0);
    /// `virsh suspend` or another API caller.
    pub const USER: Self = Self(1);
    /// QEMU stopped the guest on a disk error (a full pool, a lost disk).
    pub const IO_ERROR: Self = Self(5);
    /// The guest powered off and QEMU was kept, paused, behind it.
    pub const SHUTTING_DOWN: Self = Self(8);
    /// The guest crashed (a kernel panic) and was kept, paused, for a dump.
    pub const CRASHED: Self = Self(10);
    /// A post-copy migration failed; neither side holds the whole guest any more.
    pub const POSTCOPY_FAILED: Self = Self(13);

    /// Whether the guest behind this pause is gone for good, so that resuming it cannot bring
    /// the proxy back (review M1): it powered off, crashed, or lost half its memory in a failed
    /// migration. Every other pause (an administrator, a full disk, a save, a snapshot, a
    /// migration under way, an unknown reason) is waited out.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::SHUTTING_DOWN | Self::CRASHED | Self::POSTCOPY_FAILED)
    }
}

/// Where interface addresses come from (`virDomainInterfaceAddressesSource`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddressSource {
    /// libvirt's DHCP leases (its own networks only).
    Lease,
    /// The guest agent.
    Agent,
    /// The host's ARP table.
    Arp,
}

impl AddressSource {
    /// The source's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::Agent => "agent",
            Self::Arp => "arp",
        }
    }
}

/// One address of an interface, as libvirt reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// The address type libvirt tagged it with: 0 IPv4, 1 IPv6.
    pub kind: i32,
    /// The address as text (parsed by the provider).
    pub text: String,
}

/// One interface of a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// The guest's interface name.
    pub name: String,
    /// Its MAC address.
    pub hwaddr: String,
    /// Its addresses, in libvirt's order.
    pub addresses: Vec<Address>,
}

/// The first usable IPv4 address: tagged IPv4, a plain IPv4 literal, not loopback, link-local
/// or unspecified; interfaces and addresses in the order reported.
pub fn first_ipv4(interfaces: &[Interface]) -> Option<IpAddr> {
    interfaces
        .iter()
        .flat_map(|i| i.addresses.iter())
        .filter(|a| a.kind == 0)
        .filter_map(|a| a.text.parse::<std::net::Ipv4Addr>().ok())
        .find(|ip| !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified())
        .map(IpAddr::V4)
}

/// A storage pool's state and space (`virStoragePoolInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolInfo {
    /// libvirt's pool state (2 = running).
    pub state: u32,
    /// Bytes in all.
    pub capacity: u64,
    /// Bytes allocated.
    pub allocation: u64,
    /// Bytes free.
    pub available: u64,
}

/// The pool state libvirt reports for a running pool.
pub const POOL_RUNNING: u32 = 2;

/// `virDomainUndefineFlags`: managed save, snapshot metadata, NVRAM, checkpoint metadata.
pub const UNDEFINE_FLAGS: u32 = 1 | 2 | 4 | 16;

/// An upload's source. A read error ends the stream cleanly (as at its end), is kept, and is
/// returned once the upload call has finished, so a failing source never wedges the stream.
pub type UploadSource = Box<dyn Read + Send>;

/// One hypervisor, as the providers use it.
#[async_trait]
pub trait Host: Send + Sync + fmt::Debug {
    /// The host's configured name.
    fn name(&self) -> &str;

    /// libvirt's version (`major * 1_000_000 + minor * 1000 + release`) and the host's name.
    async fn version(&self, cx: &OpCtx) -> LvResult<(u32, String)>;

    /// The names of every domain, running or not.
    async fn domain_names(&self, cx: &OpCtx) -> LvResult<Vec<String>>;

    /// The metadata element of `domain` in `namespace`; `None` when it has none there.
    ///
    /// # Errors
    /// [`code::NO_DOMAIN`] when the domain does not exist.
    async fn domain_metadata(&self, cx: &OpCtx, domain: &str, namespace: &str) -> LvResult<Option<String>>;

    /// Replaces the metadata element of `domain` in `namespace` with `element` (given without a
    /// namespace declaration: it and its children are put in `namespace`), in the domain's
    /// persistent definition and, while it runs, in its live one too, so a read sees it at once
    /// and a restart keeps it (`virDomainSetMetadata`).
    ///
    /// # Errors
    /// [`code::NO_DOMAIN`] when the domain does not exist.
    async fn set_domain_metadata(&self, cx: &OpCtx, domain: &str, namespace: &str, element: &str) -> LvResult<()>;

    /// The state of `domain`.
    async fn domain_state(&self, cx: &OpCtx, domain: &str) -> LvResult<DomainState>;

    /// Defines a domain from `xml`.
    async fn define_domain(&self, cx: &OpCtx, xml: &str) -> LvResult<()>;

    /// Starts `domain` ([`code::OPERATION_INVALID`] when it already runs).
    async fn start_domain(&self, cx: &OpCtx, domain: &str) -> LvResult<()>;

    /// Stops `domain` at once ([`code::OPERATION_INVALID`] when it does not run).
    async fn destroy_domain(&self, cx: &OpCtx, domain: &str) -> LvResult<()>;

    /// Undefines `domain` with `flags` ([`UNDEFINE_FLAGS`]).
    async fn undefine_domain(&self, cx: &OpCtx, domain: &str, flags: u32) -> LvResult<()>;

    /// The interfaces of `domain` as `source` reports them.
    async fn interface_addresses(&self, cx: &OpCtx, domain: &str, source: AddressSource) -> LvResult<Vec<Interface>>;

    /// State and space of `pool`.
    async fn pool_info(&self, cx: &OpCtx, pool: &str) -> LvResult<PoolInfo>;

    /// Makes libvirt re-read `pool`'s volumes (sizes and formats after an upload).
    async fn refresh_pool(&self, cx: &OpCtx, pool: &str) -> LvResult<()>;

    /// The path of `volume` in `pool` ([`code::NO_STORAGE_VOL`] when there is none).
    async fn volume_path(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<String>;

    /// Creates a volume in `pool` from `xml` ([`code::STORAGE_VOL_EXIST`] when the name is taken).
    async fn create_volume(&self, cx: &OpCtx, pool: &str, xml: &str) -> LvResult<()>;

    /// The capacity of `volume` in `pool`: for an image, its virtual size once the pool was
    /// refreshed after its upload.
    async fn volume_capacity(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<u64>;

    /// The names of every volume in `pool`.
    async fn volume_names(&self, cx: &OpCtx, pool: &str) -> LvResult<Vec<String>>;

    /// Deletes `volume` from `pool`.
    async fn delete_volume(&self, cx: &OpCtx, pool: &str, volume: &str) -> LvResult<()>;

    /// Streams `length` bytes of `source` into `volume` from offset 0; returns the bytes read
    /// from the source.
    ///
    /// # Errors
    /// The upload's error; or, after an upload that libvirt accepted, the source's read error.
    async fn upload(&self, cx: &OpCtx, pool: &str, volume: &str, length: u64, source: UploadSource) -> LvResult<u64>;

    /// The first `max` bytes of `volume` (the rest is read and discarded).
    async fn download(&self, cx: &OpCtx, pool: &str, volume: &str, max: usize) -> LvResult<Vec<u8>>;

    /// The same host over a connection of its own, closed when dropped (long uploads, checks).
    async fn dedicated(&self, cx: &OpCtx) -> LvResult<Box<dyn Host>>;

    /// Closes a connection of its own (from [`Host::dedicated`]) and returns once libvirt let
    /// go of it (bounded); dropping only starts that. Nothing for the shared connection.
    ///
    /// Closing takes the connection, so nothing can call it afterwards (review L22):
    ///
    /// ```no_run
    /// # async fn check(host: &dyn egress_libvirt::host::Host, cx: &egress_provider::OpCtx) {
    /// let own = host.dedicated(cx).await.unwrap();
    /// let _ = own.version(cx).await;
    /// own.close().await;
    /// # }
    /// ```
    ///
    /// ```compile_fail,E0382
    /// # async fn check(host: &dyn egress_libvirt::host::Host, cx: &egress_provider::OpCtx) {
    /// let own = host.dedicated(cx).await.unwrap();
    /// own.close().await;
    /// let _ = own.version(cx).await; // used after close: refused by the compiler
    /// # }
    /// ```
    async fn close(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(kind: i32, text: &str) -> Address {
        Address {
            kind,
            text: text.to_owned(),
        }
    }

    #[test]
    fn the_first_usable_ipv4_in_reported_order() {
        let interfaces = vec![
            Interface {
                name: "lo".into(),
                hwaddr: String::new(),
                addresses: vec![addr(0, "127.0.0.1")],
            },
            Interface {
                name: "eth0".into(),
                hwaddr: "52:54:00:00:00:01".into(),
                addresses: vec![
                    addr(1, "fe80::1"),
                    addr(0, "169.254.1.1"),
                    addr(0, "bogus"),
                    addr(1, "192.168.1.40"),
                    addr(0, "::ffff:192.168.1.41"),
                    addr(0, "0.0.0.0"),
                    addr(0, "192.168.1.42"),
                    addr(0, "192.168.1.43"),
                ],
            },
        ];
        assert_eq!(first_ipv4(&interfaces), Some("192.168.1.42".parse().unwrap()));
        assert_eq!(first_ipv4(&interfaces[..1]), None);
    }

    #[test]
    fn errors_say_who_failed() {
        let e = LibvirtError::daemon(code::NO_DOMAIN, "Domain not found: no domain with matching name 'x'");
        assert!(e.is(code::NO_DOMAIN) && !e.transport);
        assert_eq!(
            e.to_string(),
            "Domain not found: no domain with matching name 'x' (libvirt error 42)"
        );
        let t = LibvirtError::transport("libvirt call X on h exceeded its 30s budget");
        assert!(!t.is(0) && t.transport);
        assert_eq!(DomainState::from_raw(7, 0).name(), "DomainPmsuspended");
        assert_eq!(DomainState::from_raw(3, 5), DomainState::Paused(PauseReason::IO_ERROR));
        assert!(DomainState::Blocked.is_active() && !DomainState::Paused(PauseReason::USER).is_active());
    }
}
