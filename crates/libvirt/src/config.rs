//! The `kvm:` and `kvm2:` blocks of the providers file (one shape; the block
//! key is the type) and their rules, in the order of kvm.md §1.2.
//!
//! The operator's loader decodes the block with the Go operator's rules and
//! checks its shape; [`Block::validate`] then applies these rules. Messages
//! are part of the contract (operators grep logs for them).

use std::collections::BTreeMap;

use egress_provider::config::Block;
use serde::{Deserialize, Serialize};

mod rules;
mod shared;
pub use rules::{MAX_DISK_SIZE_GB, MAX_MEMORY_MIB, MAX_VCPUS, is_http_url, is_url_host};
pub use shared::shared_pools;

/// The `kvm:` and `kvm2:` blocks: libvirt hypervisors reached over SSH.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KvmConfig {
    /// Private key for every host (OpenSSH or PEM).
    #[serde(default)]
    pub ssh_key_file: String,
    /// OpenSSH `known_hosts` file; required unless `insecureIgnoreHostKey`.
    #[serde(default)]
    pub known_hosts_file: String,
    /// Accept any host key (warned at startup).
    #[serde(default)]
    pub insecure_ignore_host_key: bool,
    /// Overlay capacity in GiB; 0 or absent means 10.
    #[serde(default)]
    pub disk_size_gb: i64,
    /// Extra cloud-init vendor-data put on every seed.
    #[serde(default)]
    pub vendor_data: String,
    /// Add the guest-agent script to vendor-data; absent means true.
    #[serde(default)]
    pub install_guest_agent: Option<bool>,
    /// `kvm` (default) or `qemu` (software emulation, where KVM is missing).
    #[serde(default)]
    pub domain_type: Option<String>,
    /// Domain CPU mode; default `host-passthrough` for kvm, none for qemu.
    #[serde(default)]
    pub cpu_mode: Option<String>,
    /// Image catalogue for `placement.image`.
    #[serde(default)]
    pub images: BTreeMap<String, KvmImage>,
    /// The hosts a Proxy's `placement.image` URL may name (review M12), whatever their address.
    /// Absent: any host that is not internal by name or address, and whose name resolves to no
    /// internal address (`engine::url_guard`). Empty: URL images are off for this entry.
    /// Catalogue URLs (`images`) are the operator's own and are not restricted.
    #[serde(default)]
    pub image_url_hosts: Option<Vec<String>>,
    /// Machine catalogue for `placement.machineType`.
    #[serde(default)]
    pub machine_types: BTreeMap<String, KvmMachineType>,
    /// Hypervisors; `placement.zone` names one.
    #[serde(default)]
    pub hosts: Vec<KvmHost>,
    /// How many seconds a host may accept none of the bytes waiting to go to it (an image
    /// upload, say) before it is taken for dead and the call fails as Transient; absent means
    /// [`KvmConfig::DEFAULT_STALL_TIMEOUT_SECONDS`]. Not in the Go operator's block.
    #[serde(default)]
    pub stall_timeout_seconds: Option<u64>,
}

impl KvmConfig {
    /// Overlay size used when `diskSizeGb` is 0 or absent.
    pub const DEFAULT_DISK_SIZE_GB: i64 = 10;
    /// The stall timeout used when `stallTimeoutSeconds` is absent.
    pub const DEFAULT_STALL_TIMEOUT_SECONDS: u64 = 30;
    /// The shortest stall timeout accepted: a busy host may pause for a few seconds.
    pub const MIN_STALL_TIMEOUT_SECONDS: u64 = 5;
    /// The longest stall timeout accepted.
    pub const MAX_STALL_TIMEOUT_SECONDS: u64 = 600;

    /// The stall timeout after defaults.
    pub fn effective_stall_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.stall_timeout_seconds
                .unwrap_or(Self::DEFAULT_STALL_TIMEOUT_SECONDS),
        )
    }

    /// The overlay size in GiB after defaults.
    pub fn effective_disk_size_gb(&self) -> i64 {
        if self.disk_size_gb == 0 {
            Self::DEFAULT_DISK_SIZE_GB
        } else {
            self.disk_size_gb
        }
    }

    /// Whether the guest-agent script is added (absent means yes).
    pub fn effective_install_guest_agent(&self) -> bool {
        self.install_guest_agent.unwrap_or(true)
    }

    /// The libvirt domain type after defaults (`kvm` or `qemu`).
    pub fn effective_domain_type(&self) -> &str {
        match self.domain_type.as_deref() {
            None | Some("") => "kvm",
            Some(t) => t,
        }
    }

    /// The CPU mode after defaults: `host-passthrough` for kvm, none for qemu.
    pub fn effective_cpu_mode(&self) -> Option<&str> {
        match self.cpu_mode.as_deref() {
            Some("") => None,
            Some(m) => Some(m),
            None if self.effective_domain_type() == "kvm" => Some("host-passthrough"),
            None => None,
        }
    }
}

/// One entry of a libvirt image catalogue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KvmImage {
    /// Absolute http(s) download URL.
    #[serde(default)]
    pub url: String,
    /// Expected SHA-256 of the download, 64 hex digits.
    #[serde(default)]
    pub sha256: String,
    /// `qcow2` (default) or `raw`.
    #[serde(default)]
    pub format: String,
    /// `uefi` (default) or `bios`.
    #[serde(default)]
    pub firmware: String,
}

impl KvmImage {
    /// The format after defaults.
    pub fn effective_format(&self) -> &str {
        if self.format.is_empty() { "qcow2" } else { &self.format }
    }

    /// The firmware after defaults.
    pub fn effective_firmware(&self) -> &str {
        if self.firmware.is_empty() {
            "uefi"
        } else {
            &self.firmware
        }
    }
}

/// One machine profile of a libvirt catalogue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KvmMachineType {
    /// Virtual CPUs, > 0.
    #[serde(default)]
    pub vcpus: i32,
    /// Memory in MiB, > 0.
    #[serde(rename = "memoryMiB", default)]
    pub memory_mib: i64,
}

/// One hypervisor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KvmHost {
    /// The host's name: `placement.zone` and the providerID segment.
    #[serde(default)]
    pub name: String,
    /// `host:port` to dial.
    #[serde(default)]
    pub address: String,
    /// SSH user (member of the `libvirt` group).
    #[serde(default)]
    pub user: String,
    /// Remote libvirt socket; default `/var/run/libvirt/libvirt-sock`.
    #[serde(default)]
    pub socket: String,
    /// Storage pool; default `default`.
    #[serde(default)]
    pub pool: String,
    /// Bridge the domain NIC attaches to.
    #[serde(default)]
    pub bridge: String,
}

impl KvmHost {
    /// The remote socket after defaults.
    pub fn effective_socket(&self) -> &str {
        if self.socket.is_empty() {
            "/var/run/libvirt/libvirt-sock"
        } else {
            &self.socket
        }
    }

    /// The storage pool after defaults.
    pub fn effective_pool(&self) -> &str {
        if self.pool.is_empty() { "default" } else { &self.pool }
    }

    /// The libvirt daemon this host reaches: its address (host part in lowercase) and socket.
    pub fn daemon(&self) -> (String, String) {
        (self.address.to_ascii_lowercase(), self.effective_socket().to_owned())
    }
}

impl Block for KvmConfig {
    /// The `kvm` and `kvm2` blocks (one shape; the block name is the type),
    /// checked in the order of kvm.md §1.2, stopping at the first problem.
    ///
    /// # Errors
    /// The first failing rule, e.g. `kvm2.sshKeyFile is required`.
    fn validate(type_name: &str, block: Option<&Self>) -> Result<(), String> {
        let b = type_name;
        let Some(cfg) = block else {
            return Err(format!("{b} block is required"));
        };
        rules::rules(b, cfg)
    }
}
