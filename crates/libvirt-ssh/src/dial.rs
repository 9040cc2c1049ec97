//! Dialing a host: credentials, TCP, SSH (host key, public key), a direct-streamlocal channel to
//! the host's libvirt socket bridged to a private local unix socket, and libvirt's handshake over
//! it. The whole dial has one budget; a step that outlives it (or the caller) is unblocked by
//! closing the TCP connection under it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_provider::OpCtx;
use russh::client;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg};
use tokio::net::TcpStream;
use tracing::Instrument;

use crate::bridge::Bridge;
use crate::connection::Connection;
use crate::error::{DialCause, DialError, Stage};
use crate::link::Link;

/// One hypervisor, as a provider's config names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTarget {
    /// The host's configured name (in errors and logs).
    pub name: String,
    /// `host:port` to dial; also the name looked up in known_hosts.
    pub address: String,
    /// The SSH user (a member of the host's `libvirt` group).
    pub user: String,
    /// libvirt's socket on the host.
    pub socket: String,
}

/// How the host key is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostKeys {
    /// Against an OpenSSH known_hosts file (hashed entries and `[host]:port` included).
    KnownHosts(PathBuf),
    /// Any key is accepted (`insecureIgnoreHostKey`).
    AcceptAny,
}

/// The SSH material and how long things may take.
#[derive(Clone, Debug)]
pub struct DialOptions {
    /// The private key file (OpenSSH or PEM, no passphrase).
    pub key_file: PathBuf,
    /// How host keys are checked.
    pub host_keys: HostKeys,
    /// Read the key file again whenever it has changed (its modification time, size or inode:
    /// a rotated Secret takes effect on the next connection, and a round of checks over many
    /// hosts parses it once, review L19); otherwise it is read until one read succeeds, then
    /// kept.
    pub reread_material: bool,
    /// The whole dial's budget (credentials to libvirt handshake).
    pub budget: Duration,
    /// How often an idle connection is probed; it is dead after one unanswered probe period.
    pub keepalive: Duration,
    /// How long bytes may wait to go to the host with none accepted before the host is taken
    /// for dead (a host that froze in the middle of an upload, say). The socket's
    /// `TCP_USER_TIMEOUT` is twice this plus ten seconds, a second line behind it.
    pub stall_limit: Duration,
    /// The span each dial runs in (a provider's `kvm2.dial`), given the host; none by default.
    /// Its `otel.status_code` field, when it has one, is set to `ok` or `error`.
    pub span: Option<fn(&HostTarget) -> tracing::Span>,
}

impl DialOptions {
    /// The budget of a whole dial.
    pub const DIAL_BUDGET: Duration = Duration::from_secs(10);
    /// The keepalive period.
    pub const KEEPALIVE: Duration = Duration::from_secs(15);
    /// The stall limit when none is configured.
    pub const STALL_LIMIT: Duration = Duration::from_secs(30);

    /// Options with the standard budgets.
    pub fn new(key_file: impl Into<PathBuf>, host_keys: HostKeys) -> Self {
        Self {
            key_file: key_file.into(),
            host_keys,
            reread_material: true,
            budget: Self::DIAL_BUDGET,
            keepalive: Self::KEEPALIVE,
            stall_limit: Self::STALL_LIMIT,
            span: None,
        }
    }
}

/// How far inside a caller's deadline a dial gives up by itself.
const DEADLINE_MARGIN: Duration = Duration::from_millis(100);

/// Dials hosts with one set of options.
#[derive(Debug)]
pub struct Dialer {
    options: DialOptions,
    cached_key: Mutex<Option<CachedKey>>,
}

/// A parsed key and the stamp of the file it came from (none when the key is kept whatever
/// happens to the file).
#[derive(Debug)]
struct CachedKey {
    stamp: Option<FileStamp>,
    key: Arc<PrivateKey>,
}

/// What tells a changed file from the same one without reading it: a Secret's update swaps a
/// symlink to a new file (another inode); an edit in place moves the modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    modified: Option<std::time::SystemTime>,
    len: u64,
    dev: u64,
    ino: u64,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            modified: meta.modified().ok(),
            len: meta.len(),
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

impl Dialer {
    /// A dialer; it reads nothing until the first dial. libvirt's C library stops printing
    /// errors to stderr from here on: they are returned, and the providers log them.
    pub fn new(options: DialOptions) -> Self {
        crate::quiet_libvirt();
        Self {
            options,
            cached_key: Mutex::new(None),
        }
    }

    /// The options.
    pub fn options(&self) -> &DialOptions {
        &self.options
    }

    /// A new connection to `host`.
    ///
    /// # Errors
    /// The stage that failed and why; a dial that outlives its budget or `cx` is
    /// [`DialCause::Budget`] or [`DialCause::Cancelled`] at the stage it was in.
    pub async fn dial(&self, cx: &OpCtx, host: &HostTarget) -> Result<Connection, DialError> {
        let span = self.options.span.map_or_else(tracing::Span::none, |make| make(host));
        let result = self.dial_unobserved(cx, host).instrument(span.clone()).await;
        match &result {
            Ok(_) => span.record("otel.status_code", "ok"),
            Err(e) => span
                .record("otel.status_code", "error")
                .record("otel.status_description", e.to_string()),
        };
        result
    }

    async fn dial_unobserved(&self, cx: &OpCtx, host: &HostTarget) -> Result<Connection, DialError> {
        let started = Instant::now();
        let link = Link::new();
        let mut stage = Stage::Credentials;
        let steps = self.steps(host, &link, &mut stage);
        // Review L17: the dial's own budget ends just inside the caller's deadline, so a host
        // that does not answer reads as unreachable rather than as the caller's timeout.
        let budget = match cx.deadline() {
            Some(deadline) => self.options.budget.min(
                deadline
                    .saturating_duration_since(tokio::time::Instant::now())
                    .saturating_sub(DEADLINE_MARGIN),
            ),
            None => self.options.budget,
        };
        let result = tokio::select! {
            biased;
            why = cx.done() => Err(DialCause::Cancelled(why.to_string())),
            r = steps => r,
            () = tokio::time::sleep(budget) => Err(DialCause::Budget(budget)),
        };
        match result {
            Ok(connection) => {
                tracing::debug!(host = %host.name, address = %host.address, user = %host.user, duration = ?started.elapsed(), "libvirt host connected");
                Ok(connection)
            }
            Err(cause) => {
                // A half-open link must not linger: close what was opened.
                link.mark_dead(format!("dial failed: {cause}"));
                let err = DialError {
                    host: host.name.clone(),
                    stage,
                    cause,
                };
                tracing::debug!(host = %host.name, address = %host.address, user = %host.user, duration = ?started.elapsed(), stage = %stage, error = %err, "libvirt host connect failed");
                Err(err)
            }
        }
    }

    async fn steps(&self, host: &HostTarget, link: &Link, stage: &mut Stage) -> Result<Connection, DialCause> {
        let key = self.key().await?;
        let (host_name, port) = split_address(&host.address);
        let mut preferred = russh::Preferred::DEFAULT;
        let mut known_hosts = None;
        if let HostKeys::KnownHosts(path) = &self.options.host_keys {
            known_hosts = Some(read_known_hosts(path).await?);
            preferred.key = host_key_preference(&host_name, port, path);
        }

        *stage = Stage::Tcp;
        let tcp = self.tcp(host, link).await?;

        *stage = Stage::Ssh;
        let handler = ClientHandler {
            host_keys: self.options.host_keys.clone(),
            known_hosts,
            host: host_name,
            port,
            verdict: Arc::new(Mutex::new(None)),
            link: link.clone(),
        };
        let handle = self.ssh(host, tcp, handler, preferred, key).await?;

        *stage = Stage::Socket;
        let first = handle
            .channel_open_direct_streamlocal(host.socket.clone())
            .await
            .map_err(|e| DialCause::ChannelRejected {
                socket: host.socket.clone(),
                reason: e.to_string(),
            })?;
        let bridge = Bridge::start(handle, first, host.socket.clone(), link.clone(), self.stall_limit())
            .map_err(DialCause::Io)?;

        *stage = Stage::Libvirt;
        let uri = format!("qemu+unix:///system?socket={}", bridge.path.display());
        let open = tokio::task::spawn_blocking(move || virt::connect::Connect::open(Some(&uri)));
        // NB: if this dial is abandoned while the handshake runs, the link's kill closes the
        // TCP connection, the bridge ends, and the C call returns; its result is then dropped
        // on the blocking thread (see Connection's drop).
        let opened = open.await.map_err(|e| DialCause::Libvirt(e.to_string()))?;
        let conn = opened.map_err(|e| DialCause::Libvirt(e.message().to_owned()))?;
        Ok(Connection::new(host.name.clone(), conn, link.clone(), bridge))
    }

    /// The TCP connection to `host`, whose shutdown `link`'s kill is from now on.
    async fn tcp(&self, host: &HostTarget, link: &Link) -> Result<TcpStream, DialCause> {
        let tcp = TcpStream::connect(&host.address).await.map_err(DialCause::Io)?;
        let _ = tcp.set_nodelay(true);
        // A second handle on the socket: shutting it down wakes every reader and writer of the
        // SSH session without taking any of its locks (spec H1).
        let std = tcp.into_std().map_err(DialCause::Io)?;
        // The kernel's own bound on data the host does not acknowledge, behind the pump's
        // write-progress deadline (which sees a zero window too, and comes first).
        if let Err(e) = rustix::net::sockopt::set_tcp_user_timeout(&std, tcp_user_timeout_millis(self.stall_limit())) {
            tracing::debug!(host = %host.name, error = %e, "TCP_USER_TIMEOUT could not be set");
        }
        let killer = std.try_clone().map_err(DialCause::Io)?;
        let tcp = TcpStream::from_std(std).map_err(DialCause::Io)?;
        link.on_kill(move || {
            let _ = killer.shutdown(std::net::Shutdown::Both);
        });
        Ok(tcp)
    }

    /// The SSH session over `tcp`: the host key checked by `handler`, then `key` offered for
    /// the host's user.
    async fn ssh(
        &self,
        host: &HostTarget,
        tcp: TcpStream,
        handler: ClientHandler,
        preferred: russh::Preferred,
        key: Arc<PrivateKey>,
    ) -> Result<client::Handle<ClientHandler>, DialCause> {
        let verdict = handler.verdict.clone();
        let config = Arc::new(client::Config {
            preferred,
            // Review L1: a zero interval would probe without pause; the default instead.
            keepalive_interval: Some(if self.options.keepalive.is_zero() {
                DialOptions::KEEPALIVE
            } else {
                self.options.keepalive
            }),
            keepalive_max: 1,
            nodelay: true,
            ..client::Config::default()
        });
        let mut handle = match client::connect_stream(config, tcp, handler).await {
            Ok(h) => h,
            Err(e) => {
                let recorded = verdict.lock().unwrap_or_else(|p| p.into_inner()).take();
                return Err(recorded.unwrap_or_else(|| DialCause::Ssh(e.to_string())));
            }
        };
        let hash = handle
            .best_supported_rsa_hash()
            .await
            .map_err(|e| DialCause::Ssh(e.to_string()))?
            .flatten();
        let auth = handle
            .authenticate_publickey(&host.user, PrivateKeyWithHashAlg::new(key, hash))
            .await
            .map_err(|e| DialCause::Ssh(e.to_string()))?;
        if !auth.success() {
            return Err(DialCause::AuthRefused {
                user: host.user.clone(),
            });
        }
        Ok(handle)
    }

    /// The configured stall limit; a zero one (which would take every write for a stall)
    /// is the default instead.
    fn stall_limit(&self) -> Duration {
        if self.options.stall_limit.is_zero() {
            DialOptions::STALL_LIMIT
        } else {
            self.options.stall_limit
        }
    }

    /// The private key: read (and parsed) again when the file has changed, or once and kept.
    async fn key(&self) -> Result<Arc<PrivateKey>, DialCause> {
        let path = self.options.key_file.display().to_string();
        let read_error = |source| DialCause::KeyRead {
            path: path.clone(),
            source,
        };
        let stamp = if self.options.reread_material {
            let meta = tokio::fs::metadata(&self.options.key_file).await.map_err(read_error)?;
            Some(FileStamp::of(&meta))
        } else {
            None
        };
        if let Some(cached) = self.cached_key.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
            && (stamp.is_none() || stamp == cached.stamp)
        {
            return Ok(cached.key.clone());
        }
        let parse_error = |reason: String| DialCause::KeyParse {
            path: path.clone(),
            reason,
        };
        // A file that cannot hold a key (a device, a pipe, a directory; one over the cap) is
        // the key's problem, as an unparsable one is; one that cannot be read may yet be.
        let bytes = egress_files::read_regular_file_async(&self.options.key_file, KEY_FILE_LIMIT)
            .await
            .map_err(|e| match e.problem {
                egress_files::Problem::Io(source) => read_error(source),
                egress_files::Problem::NotRegular => parse_error(e.problem.to_string()),
                egress_files::Problem::TooLarge { .. } => {
                    parse_error(format!("{}, which no private key is", e.problem))
                }
            })?;
        let text = String::from_utf8(bytes).map_err(|_| parse_error("not text: not a private key".to_owned()))?;
        let key = crate::key_file::decode_private_key(&text).map_err(|e| parse_error(key_error_text(&e)))?;
        // Checked once the file is known to hold a key, so a file that holds none says so.
        let meta = tokio::fs::metadata(&self.options.key_file).await.map_err(read_error)?;
        if let Some(mode) = egress_files::others_may_access(&meta) {
            return Err(DialCause::KeyExposed {
                path: path.clone(),
                mode,
            });
        }
        let key = Arc::new(key);
        // NB: the stamp taken before the read: a file replaced between the two is read again
        // on the next dial rather than kept under the newer stamp.
        *self.cached_key.lock().unwrap_or_else(|p| p.into_inner()) = Some(CachedKey {
            stamp,
            key: key.clone(),
        });
        Ok(key)
    }
}

/// The most a private key file is read: a 16 384-bit RSA key, the largest OpenSSH makes, is
/// about 13 KiB in its format, and a file that never ends (a device, a pipe) must not take the
/// memory.
const KEY_FILE_LIMIT: u64 = 64 * 1024;

/// What a key parse error says, without any of the file's content.
fn key_error_text(e: &russh::keys::Error) -> String {
    match e {
        russh::keys::Error::CouldNotReadKey => "not a private key (a public key, or not a key at all?)".to_owned(),
        russh::keys::Error::KeyIsEncrypted => "the key is encrypted (passphrases are not supported)".to_owned(),
        other => other.to_string(),
    }
}

/// The most of a known_hosts file that is read: about 25 000 hashed ed25519 entries, or 5 000
/// RSA ones. russh reads the file again itself, on the async runtime's thread, so that read
/// too must be short and must end.
const KNOWN_HOSTS_LIMIT: u64 = 4 * 1024 * 1024;

/// Reads the known_hosts file, so its absence is reported as itself (russh's own lookup treats
/// an unreadable file as "no entries"). Only a regular file of at most [`KNOWN_HOSTS_LIMIT`]
/// bytes is taken (the one bounded read, [`egress_files::read_regular_file`]): russh's later
/// reads of a pipe or a device would never end.
async fn read_known_hosts(path: &Path) -> Result<String, DialCause> {
    let unreadable = |source| DialCause::KnownHostsRead {
        path: path.display().to_string(),
        source,
    };
    let unparsable = |reason: String| DialCause::KnownHostsParse {
        path: path.display().to_string(),
        reason,
    };
    let bytes = egress_files::read_regular_file_async(path, KNOWN_HOSTS_LIMIT)
        .await
        .map_err(|e| match e.problem {
            egress_files::Problem::Io(source) => unreadable(source),
            egress_files::Problem::NotRegular => unreadable(std::io::Error::other(e.problem.to_string())),
            egress_files::Problem::TooLarge { .. } => unparsable(e.problem.to_string()),
        })?;
    String::from_utf8(bytes).map_err(|_| unparsable("not text".to_owned()))
}

/// The host-key algorithms to offer, those known_hosts pins for the host first (review L3): a
/// server that prefers another type then presents the pinned one, so an RSA-only pin works
/// against a server that would show its ed25519 key. Without pins, russh's order.
fn host_key_preference(host: &str, port: u16, path: &Path) -> std::borrow::Cow<'static, [russh::keys::Algorithm]> {
    let default = russh::Preferred::DEFAULT.key;
    let pinned: Vec<String> = match russh::keys::known_hosts::known_host_keys_path(host, port, path) {
        Ok(entries) if !entries.is_empty() => entries.iter().map(|(_, k)| key_family(&k.algorithm())).collect(),
        // An unparsable file is reported by the host-key check itself.
        _ => return default,
    };
    let is_pinned = |a: &russh::keys::Algorithm| pinned.contains(&key_family(a));
    let mut ordered: Vec<_> = default.iter().filter(|a| is_pinned(a)).cloned().collect();
    ordered.extend(default.iter().filter(|a| !is_pinned(a)).cloned());
    std::borrow::Cow::Owned(ordered)
}

/// An algorithm's key type: RSA keys sign with several hashes, one key.
fn key_family(a: &russh::keys::Algorithm) -> String {
    match a {
        russh::keys::Algorithm::Rsa { .. } => "rsa".to_owned(),
        other => other.to_string(),
    }
}

/// The line (from 1) of known_hosts text that marks `key` `@revoked`, if one does:
/// `@revoked <host patterns> <key type> <base64 key> [comment]`. The host patterns are not read:
/// a revoked key is never accepted, for any host.
fn revoked_line(text: &str, key: &russh::keys::PublicKey) -> Option<usize> {
    text.lines().enumerate().find_map(|(i, line)| {
        let mut fields = line.split_whitespace();
        if fields.next() != Some("@revoked") {
            return None;
        }
        let encoded = fields.nth(2)?;
        let listed = russh::keys::parse_public_key_base64(encoded).ok()?;
        (listed.key_data() == key.key_data()).then_some(i + 1)
    })
}

/// The socket's `TCP_USER_TIMEOUT` for `stall_limit`: twice it plus ten seconds, so the pump's
/// own deadline, which starts later (once the buffers in between are full), still comes first.
fn tcp_user_timeout_millis(stall_limit: Duration) -> u32 {
    let timeout = stall_limit.saturating_mul(2).saturating_add(Duration::from_secs(10));
    u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX)
}

/// `host:port` split for the known_hosts lookup (port 22 when none is given).
fn split_address(address: &str) -> (String, u16) {
    if let Some(rest) = address.strip_prefix('[')
        && let Some((host, port)) = rest.split_once("]:")
    {
        return (host.to_owned(), port.parse().unwrap_or(22));
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host.to_owned(), port.parse().unwrap_or(22)),
        _ => (address.to_owned(), 22),
    }
}

struct ClientHandler {
    host_keys: HostKeys,
    /// The known_hosts text read at the dial's start, when `host_keys` names a file.
    known_hosts: Option<String>,
    host: String,
    port: u16,
    verdict: Arc<Mutex<Option<DialCause>>>,
    link: Link,
}

impl client::Handler for ClientHandler {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &russh::keys::PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let HostKeys::KnownHosts(path) = &self.host_keys else {
            return Ok(true);
        };
        let russh::keys::PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            *self.verdict.lock().unwrap_or_else(|p| p.into_inner()) = Some(DialCause::Ssh(
                "the server offered a certificate; only plain host keys are checked".to_owned(),
            ));
            return Ok(false);
        };
        let shown = if self.port == 22 {
            self.host.clone()
        } else {
            format!("[{}]:{}", self.host, self.port)
        };
        // Review L2: russh's parser skips `@revoked` lines, so they are read here, first. A
        // revoked key is refused for every host, as OpenSSH refuses it.
        if let Some(line) = self.known_hosts.as_deref().and_then(|text| revoked_line(text, key)) {
            *self.verdict.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(DialCause::HostKeyRevoked { host: shown, line });
            return Ok(false);
        }
        // Accepted when any entry for the host holds this key (two keys of one type are normal
        // during a rotation); "changed" only when entries of this type exist and none matches.
        let verdict = match russh::keys::known_hosts::known_host_keys_path(&self.host, self.port, path) {
            Ok(entries) if entries.iter().any(|(_, k)| k == key) => return Ok(true),
            Ok(entries) => match entries.iter().find(|(_, k)| k.algorithm() == key.algorithm()) {
                Some((line, _)) => DialCause::HostKeyChanged {
                    host: shown,
                    line: *line,
                },
                None => DialCause::HostKeyUnknown { host: shown },
            },
            Err(e) => DialCause::KnownHostsParse {
                path: path.display().to_string(),
                reason: e.to_string(),
            },
        };
        *self.verdict.lock().unwrap_or_else(|p| p.into_inner()) = Some(verdict);
        Ok(false)
    }

    async fn disconnected(&mut self, reason: client::DisconnectReason<Self::Error>) -> Result<(), Self::Error> {
        let why = match &reason {
            client::DisconnectReason::ReceivedDisconnect(d) => {
                format!("ssh: the server disconnected: {:?}", d.reason_code)
            }
            client::DisconnectReason::Error(e) => format!("ssh: {e}"),
        };
        self.link.mark_dead(why);
        match reason {
            client::DisconnectReason::ReceivedDisconnect(_) => Ok(()),
            client::DisconnectReason::Error(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoked_keys_are_found_on_their_line_whatever_the_hosts() {
        let ed25519 = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
        let other = "AAAAC3NzaC1lZDI1NTE5AAAAIKx1yjW1rJa6U0R1vYh8mX8dLJ0lQw2J6T5m1bCwKf3Q";
        let key = russh::keys::parse_public_key_base64(ed25519).unwrap();
        let text =
            format!("# pins\n[hv1]:2222 ssh-ed25519 {other}\n@revoked other-host,* ssh-ed25519 {ed25519} old key\n");
        assert_eq!(revoked_line(&text, &key), Some(3));
        // The same key pinned, not revoked; a revoked line that does not parse; another marker.
        let pinned = format!("hv1 ssh-ed25519 {ed25519}\n@revoked hv1 ssh-ed25519 not-base64\n");
        assert_eq!(revoked_line(&pinned, &key), None);
        let authority = format!("@cert-authority * ssh-ed25519 {ed25519}\n");
        assert_eq!(revoked_line(&authority, &key), None);
    }

    #[test]
    fn the_kernel_timeout_stays_behind_the_stall_limit() {
        assert_eq!(tcp_user_timeout_millis(Duration::from_secs(30)), 70_000);
        assert_eq!(tcp_user_timeout_millis(Duration::from_secs(5)), 20_000);
        assert_eq!(tcp_user_timeout_millis(Duration::MAX), u32::MAX);
    }

    #[test]
    fn addresses_split_for_the_known_hosts_lookup() {
        assert_eq!(split_address("127.0.0.1:2222"), ("127.0.0.1".to_owned(), 2222));
        assert_eq!(split_address("hv1:22"), ("hv1".to_owned(), 22));
        assert_eq!(split_address("[::1]:2222"), ("::1".to_owned(), 2222));
        assert_eq!(split_address("hv1"), ("hv1".to_owned(), 22));
    }
}
