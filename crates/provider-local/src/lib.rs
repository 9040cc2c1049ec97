//! Egress proxies as tinyproxy processes on this machine: the `local`
//! provider type, for development (`cargo xtask dev`) and tests.
//!
//! Each instance is a real tinyproxy listening on its own loopback address
//! (127.a.b.c, derived from its name) at the Proxy's port, so any number of
//! them share one machine and the usual `ip:port` contract holds. It also
//! leaves from that address (`Bind`): each proxy has its own exit, as in a
//! real fleet, and a local target can tell them apart. Its marks,
//! address, port and pid live in a record in the state directory; the
//! process runs in its own process group, so it outlives an operator
//! restart and the next operator finds it by its record.
//!
//! ```text
//!  create ─► one machine call: record (marks, address) + tinyproxy -d -c <dir>/tinyproxy.conf
//!  get    ─► record ─► launched.pid ─► /proc/<pid> (ours? alive?) ─► /proc/net/tcp (listening?)
//!            no record: NotFound · never started: Provisioning · dead: Stopped ·
//!            alive, not listening: Provisioning · listening: Running at 127.a.b.c
//!  delete ─► record.deleting ─► SIGTERM (SIGKILL after 3 s) ─► files removed
//! ```
//!
//! Placement: `zone` empty or `local`; the other fields must be empty.
//! Cloud-init has no meaning for a tinyproxy process and is not used (nor
//! written anywhere). The id is `local/<name>`.
//!
//! ```yaml
//! providers:
//!   - name: dev
//!     type: local
//!     local:
//!       stateDir: /var/tmp/egress-local     # required
//!       tinyproxyPath: /usr/bin/tinyproxy   # the default
//! ```

pub mod config;
mod machine;
mod provider;
mod record;

use std::sync::Arc;

use egress_provider::config::ProviderConfig;
use egress_provider::{BoxError, Provider, ProviderType};

pub use config::LocalConfig;
pub use machine::{
    BIND, CREATE, INSPECT, LAUNCH, LIST, Liveness, Machine, MachineMessage, PREPARE, READ, REMOVE, STOP, SystemMachine,
    VERSION, WRITE, drop_names, own_error,
};
pub use provider::{CALL_BUDGET, LAUNCH_BUDGET, LocalProvider, LocalSettings, STOP_BUDGET, classify};
pub use record::{LOCATION, ParsedId, Record, Rules, address_candidate, id_of, parse_id, timestamp, tinyproxy_config};

/// The `type:` value.
pub const TYPE_NAME: &str = "local";

/// The `local` provider type for a [`Registry`](egress_provider::Registry).
pub fn provider_type() -> ProviderType {
    ProviderType::with_block::<LocalConfig>(TYPE_NAME, construct)
}

/// Builds a provider from a validated `local` entry. Touches nothing: the
/// state directory is created by the first create (or the checker).
///
/// # Errors
/// When the entry has no `local` block (the validator refuses that first).
pub fn construct(entry: &ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> {
    let local: LocalConfig = entry.block()?.ok_or("local block is required")?;
    let machine = SystemMachine::new(&local.state_dir, local.effective_tinyproxy_path());
    let settings = LocalSettings {
        entry: entry.name.clone(),
        salt: local.state_dir.clone(),
        drop_to: drop_names().map(|(u, g)| (u.to_owned(), g.to_owned())),
        connect_ports: local.effective_connect_ports(),
    };
    Ok(Arc::new(LocalProvider::new(settings, Arc::new(machine))))
}
