//! The `local:` block of the providers file and its rules.

use egress_provider::config::{Block, go_quote};
use serde::{Deserialize, Serialize};

/// The `local:` block: proxies as tinyproxy processes on the operator's own machine, for
/// development and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalConfig {
    /// Where each instance's record, tinyproxy config, pid and log live (required, absolute).
    #[serde(default)]
    pub state_dir: String,
    /// The tinyproxy binary; default [`LocalConfig::DEFAULT_TINYPROXY`].
    #[serde(default)]
    pub tinyproxy_path: Option<String>,
    /// The ports a `CONNECT` may reach; default [`LocalConfig::DEFAULT_CONNECT_PORTS`] (443).
    /// tinyproxy has no rules on destination addresses: a local proxy reaches whatever the
    /// machine does, which is one reason it is for development only.
    #[serde(default)]
    pub connect_ports: Option<Vec<u16>>,
}

impl LocalConfig {
    /// The tinyproxy binary used when none is configured (Debian's package).
    pub const DEFAULT_TINYPROXY: &'static str = "/usr/bin/tinyproxy";

    /// The `CONNECT` ports used when none are configured: HTTPS only.
    pub const DEFAULT_CONNECT_PORTS: &'static [u16] = &[443];

    /// The `CONNECT` ports after defaults.
    pub fn effective_connect_ports(&self) -> Vec<u16> {
        self.connect_ports
            .clone()
            .unwrap_or_else(|| Self::DEFAULT_CONNECT_PORTS.to_vec())
    }

    /// The tinyproxy binary after defaults.
    pub fn effective_tinyproxy_path(&self) -> &str {
        match self.tinyproxy_path.as_deref() {
            None | Some("") => Self::DEFAULT_TINYPROXY,
            Some(p) => p,
        }
    }
}

impl Block for LocalConfig {
    /// The `local` block: an absolute state directory, and an absolute tinyproxy path when
    /// one is given. Both end up quoted in a tinyproxy config file, so neither may hold a
    /// double quote or a line break.
    ///
    /// # Errors
    /// `local block is required`, `local.stateDir is required`, `local.stateDir must be an
    /// absolute path`, and the same for `local.tinyproxyPath`.
    fn validate(_type_name: &str, block: Option<&Self>) -> Result<(), String> {
        let Some(local) = block else {
            return Err("local block is required".to_owned());
        };
        if local.state_dir.is_empty() {
            return Err("local.stateDir is required".to_owned());
        }
        let usable = |field: &str, path: &str| {
            if !path.starts_with('/') {
                Err(format!(
                    "local.{field} must be an absolute path (got {})",
                    go_quote(path)
                ))
            } else if path.contains(['"', '\n', '\r']) {
                Err(format!(
                    "local.{field} must not contain a double quote or a line break (got {})",
                    go_quote(path)
                ))
            } else {
                Ok(())
            }
        };
        usable("stateDir", &local.state_dir)?;
        if let Some(ports) = &local.connect_ports {
            if ports.is_empty() {
                return Err("local.connectPorts must list at least one port".to_owned());
            }
            if ports.contains(&0) {
                return Err("local.connectPorts: 0 is not a port".to_owned());
            }
        }
        match local.tinyproxy_path.as_deref() {
            None | Some("") => Ok(()),
            Some(path) => usable("tinyproxyPath", path),
        }
    }
}
