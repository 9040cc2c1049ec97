//! The ProxyPool controller (docs/pools.md): one pass per pool keeps its member Proxies at the
//! number and roles its spec asks for. It calls no backend: the Proxy reconciler provisions
//! each member as it provisions any Proxy.
//!
//! ```text
//!  pool, members (Proxy cache), leases ─► view ─► remediation ─► decide::plan ─► writes
//!                                          │        (gate)          (pure)        │
//!                                          └── autoscale (pure) ──► replicas       └─► status
//! ```
//!
//! The pure parts: [`member`] (a member as the decision sees it), [`view`] (the spec with its
//! defaults, members read from their Proxies, the pool's status), [`remediation`] (when failed
//! members may be replaced), [`decide`] (the steps of a pass) and [`autoscale`] (the size a
//! pool's load asks for).
//!
//! The I/O shell: [`controller`] runs a [`pass`] per change; a pass keeps what this leader has
//! seen of each pool's members in `watch` and of its load in [`autoscaler`], and performs its
//! steps with [`writes`]. [`metrics`] holds the controller's families.

pub mod autoscale;
pub mod autoscaler;
pub mod controller;
pub mod decide;
pub mod member;
pub mod metrics;
pub mod pass;
pub mod remediation;
pub mod shared_exit;
pub mod view;
mod watch;
pub mod writes;
