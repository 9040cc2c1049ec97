//! The settings of a test hypervisor, as `cargo xtask hypervisor up` writes them (`KEY=value`
//! lines in `/tmp/egress-hv/env`, or the file `EGRESS_HV_ENV` names), for the tests and the
//! real-mode conformance runs of the libvirt crates.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where `cargo xtask hypervisor up` writes the settings.
pub const DEFAULT_ENV_FILE: &str = "/tmp/egress-hv/env";

/// One test hypervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HypervisorEnv {
    /// sshd's `host:port`.
    pub ssh_address: String,
    /// The unprivileged user in the `libvirt` group.
    pub ssh_user: String,
    /// The user's private key.
    pub ssh_key: PathBuf,
    /// known_hosts naming sshd's address.
    pub known_hosts: PathBuf,
    /// libvirt's socket on the host.
    pub libvirt_socket: String,
    /// The storage pool.
    pub pool: String,
    /// The libvirt network.
    pub network: String,
    /// The bridge guests attach to.
    pub bridge: String,
    /// The bridge's own address (guests reach the host there).
    pub gateway: String,
    /// `qemu` where KVM cannot run guests.
    pub domain_type: String,
    /// The test guest's disk image.
    pub guest_image: PathBuf,
}

impl HypervisorEnv {
    /// The file the settings are read from.
    pub fn file() -> PathBuf {
        std::env::var_os("EGRESS_HV_ENV").map_or_else(|| PathBuf::from(DEFAULT_ENV_FILE), PathBuf::from)
    }

    /// The settings, or `None` when the file is missing.
    ///
    /// # Errors
    /// A file that cannot be read (other than missing), or that lacks a setting.
    pub fn load() -> Result<Option<Self>, String> {
        let path = Self::file();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Self::parse(&text, &path.display().to_string()).map(Some)
    }

    /// The settings in `text` (`KEY=value` lines, `#` comments), read from `file`.
    ///
    /// # Errors
    /// `<file>: <KEY> is missing`.
    pub fn parse(text: &str, file: &str) -> Result<Self, String> {
        let map: BTreeMap<&str, &str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .collect();
        let get = |key: &str| {
            map.get(key)
                .map(|v| (*v).to_owned())
                .ok_or_else(|| format!("{file}: {key} is missing"))
        };
        Ok(Self {
            ssh_address: get("EGRESS_HV_SSH_ADDRESS")?,
            ssh_user: get("EGRESS_HV_SSH_USER")?,
            ssh_key: get("EGRESS_HV_SSH_KEY")?.into(),
            known_hosts: get("EGRESS_HV_KNOWN_HOSTS")?.into(),
            libvirt_socket: get("EGRESS_HV_LIBVIRT_SOCKET")?,
            pool: get("EGRESS_HV_POOL")?,
            network: get("EGRESS_HV_NETWORK")?,
            bridge: get("EGRESS_HV_BRIDGE")?,
            gateway: get("EGRESS_HV_GATEWAY")?,
            domain_type: get("EGRESS_HV_DOMAIN_TYPE")?,
            guest_image: get("EGRESS_HV_GUEST_IMAGE")?.into(),
        })
    }

    /// The settings for a test that needs the hypervisor: `None` (the test skips, saying so)
    /// when it is not up, unless real backends are required
    /// ([`egress_testkit::real::skip_or_fail`]; `cargo xtask test` brings it up as root). For
    /// tests only (feature `testing`).
    ///
    /// # Panics
    /// When it is not up and real backends are required, or when the file is incomplete.
    #[cfg(feature = "testing")]
    pub fn for_test() -> Option<Self> {
        match Self::load() {
            Ok(Some(env)) => Some(env),
            Ok(None) => {
                egress_testkit::real::skip_or_fail(
                    "a test on the test hypervisor",
                    &format!(
                        "{} is missing (cargo xtask hypervisor up, as root, brings it up)",
                        Self::file().display()
                    ),
                );
                None
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: [&str; 11] = [
        "EGRESS_HV_SSH_ADDRESS",
        "EGRESS_HV_SSH_USER",
        "EGRESS_HV_SSH_KEY",
        "EGRESS_HV_KNOWN_HOSTS",
        "EGRESS_HV_LIBVIRT_SOCKET",
        "EGRESS_HV_POOL",
        "EGRESS_HV_NETWORK",
        "EGRESS_HV_BRIDGE",
        "EGRESS_HV_GATEWAY",
        "EGRESS_HV_DOMAIN_TYPE",
        "EGRESS_HV_GUEST_IMAGE",
    ];

    #[test]
    fn a_complete_file_parses_and_a_missing_setting_is_named() {
        let full: String = KEYS.iter().map(|k| format!("{k}=v-{k}\n")).collect();
        let env = HypervisorEnv::parse(&format!("# comment\n{full}"), "env").unwrap();
        assert_eq!(env.ssh_address, "v-EGRESS_HV_SSH_ADDRESS");
        assert_eq!(env.guest_image, PathBuf::from("v-EGRESS_HV_GUEST_IMAGE"));
        let without_pool: String = full
            .lines()
            .filter(|l| !l.starts_with("EGRESS_HV_POOL="))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            HypervisorEnv::parse(&without_pool, "/tmp/env"),
            Err("/tmp/env: EGRESS_HV_POOL is missing".to_owned())
        );
        assert!(HypervisorEnv::parse("garbage without equals", "f").is_err());
    }
}
