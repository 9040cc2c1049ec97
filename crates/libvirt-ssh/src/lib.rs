//! libvirt over SSH, for the libvirt providers.
//!
//! ```text
//!  Pool::get(host) ─► Dialer::dial: key + known_hosts ─► TCP ─► SSH (host key, public key)
//!                        ─► direct-streamlocal channel to the host's libvirt socket
//!                        ─► private unix socket (Bridge) ◄─ virt (libvirt's C client):
//!                           qemu+unix:///system?socket=/tmp/egress-libvirt-…/libvirt.sock
//!  Connection::call(cx, rpc, budget, |conn| …)   on a blocking thread; a call that outlives
//!                        its budget or its caller kills the link: the TCP socket is shut down,
//!                        the bridge ends, the C call returns, the next user redials
//! ```
//!
//! The [`Link`] of each connection is its liveness: marking it dead fires its signal first and
//! closes the transport afterwards, outside any lock, so a stuck teardown delays no one.
//! Keepalive: an idle session is probed every 15 s and is dead after one unanswered period. A
//! busy one is dead when bytes wait to go to the host and none is accepted for the stall limit
//! (30 s by default; `pump`), with the socket's `TCP_USER_TIMEOUT` behind it.
//! Errors keep their cause ([`DialError`], [`CallError`]) so each provider classifies them, and
//! each checker maps them to its reasons, by its own policy.

mod bridge;
mod connection;
mod dial;
mod error;
mod key_file;
mod link;
mod pool;
mod pump;
mod remote;
#[cfg(feature = "testing")]
pub mod testing;

pub use connection::{
    CLOSE_BUDGET, Connection, DOMAIN_CREATE_BUDGET, RPC_BUDGET, SMALL_UPLOAD_BUDGET, SMALL_UPLOAD_BYTES,
    TRANSFER_BUDGET,
};
pub use dial::{DialOptions, Dialer, HostKeys, HostTarget};
pub use error::{CallError, DialCause, DialError, Stage};
pub use key_file::decode_private_key;
pub use link::Link;
pub use pool::Pool;
pub use remote::{RemoteHost, hosts_of};

/// Stops libvirt's C library from printing every error to stderr; errors are returned instead.
/// Call once at start (idempotent).
pub fn quiet_libvirt() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(virt::error::clear_error_callback);
}
