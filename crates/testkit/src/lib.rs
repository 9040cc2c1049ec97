//! Test helpers shared by the workspace's test targets, so none reaches into another crate's
//! `tests/` by path: a test PKI, TLS and HTTP targets, a scripted proxy, real tinyproxy
//! processes, scratch directories, example programs run as their users run them, a Secret volume laid out as the kubelet lays it out, an image mirror that can
//! misbehave, a restart of the test hypervisor's libvirtd, a frozen host (a user's processes
//! stopped), redis-servers and Redis Clusters of a test's own ([`redis`]), real Squid
//! ([`squid`]) and tests re-run in a network namespace of their own ([`netns`]). A dev-dependency
//! only; never linked into the operator.

pub mod echo;
pub mod examples;
pub mod freeze;
pub mod image_server;
mod libvirtd;
pub mod netns;
mod pki;
pub mod real;
pub mod redis;
mod scratch;
pub mod secret_volume;
pub mod squid;
mod targets;
mod tinyproxy;
mod tools;

pub use libvirtd::restart_libvirtd;
pub use pki::{Pki, pki, pki_for};
pub use scratch::{ScratchDir, scratch_dir};
pub use targets::{
    DeadAddress, Fault, Seen, StoppableTlsTarget, connect, dead_address, fault_proxy, free_port, http_target,
    http_target_at, tls_greeting_target, tls_target, tls_target_at, try_free_port,
};
pub use tinyproxy::{Tinyproxy, tinyproxy_available};
pub use tools::{make_fifo, on_path};
