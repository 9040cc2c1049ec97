//! The providers config file (`providers.yaml`): its model, the strict
//! loader and the validation rules.
//!
//! ```text
//!  bytes ──► strict YAML parse ──► per-entry checks ──► type validator ──► ProvidersConfig
//!            (unknown or dup keys)  (name, type, blocks)  (from the Registry)
//! ```
//!
//! Loading is fail-fast and happens once per process: the first problem
//! aborts with one line naming the file, the entry and the field. The list
//! of accepted `type` values, and each type's block validator, come from the
//! [`Registry`](crate::Registry) that also constructs the providers, so the
//! two cannot drift.
//!
//! Maps are ordered (`BTreeMap`) so that, with several bad keys, the one
//! reported is always the first in sorted order.

use std::collections::BTreeMap;

use serde::Deserialize;

mod load;
mod validate;

pub use load::{ConfigError, Loaded};
pub use validate::validators;

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersConfig {
    /// Entries, validated and built in file order.
    pub providers: Vec<ProviderConfig>,
}

/// One configured provider ("entry"): a name, a type, and at most the one
/// block named by the type.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// What `Proxy.spec.provider` refers to; a lowercase DNS-1123 label,
    /// unique in the file.
    #[serde(default)]
    pub name: String,
    /// The provider type (`kubernetes`, `gcp`, `kvm`, `kvm2`, `local`, ...).
    /// A plain string so the validator, not the parser, reports unknown types.
    #[serde(rename = "type", default)]
    pub type_name: String,
    /// Settings of the `kubernetes` type.
    #[serde(default)]
    pub kubernetes: Option<KubernetesConfig>,
    /// Settings of the `gcp` type.
    #[serde(default)]
    pub gcp: Option<GcpConfig>,
    /// Settings of the `kvm` type.
    #[serde(default)]
    pub kvm: Option<KvmConfig>,
    /// Settings of the `kvm2` type (same shape as `kvm`).
    #[serde(default)]
    pub kvm2: Option<KvmConfig>,
    /// Settings of the `local` type (tinyproxy processes on this machine).
    #[serde(default)]
    pub local: Option<LocalConfig>,
}

impl ProviderConfig {
    /// The non-null blocks, in the fixed order the set-blocks rule checks them.
    pub fn blocks_present(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.kubernetes.is_some() {
            out.push("kubernetes");
        }
        if self.gcp.is_some() {
            out.push("gcp");
        }
        if self.kvm.is_some() {
            out.push("kvm");
        }
        if self.kvm2.is_some() {
            out.push("kvm2");
        }
        if self.local.is_some() {
            out.push("local");
        }
        out
    }

    /// The libvirt block of a `kvm` or `kvm2` entry (the one named by the type).
    pub fn libvirt_block(&self) -> Option<&KvmConfig> {
        match self.type_name.as_str() {
            "kvm" => self.kvm.as_ref(),
            "kvm2" => self.kvm2.as_ref(),
            _ => None,
        }
    }
}

/// The `kubernetes:` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The one namespace this entry places Pods in (a DNS-1123 label); Proxies elsewhere are
    /// refused, and Pods are listed only there, so the entry's RBAC can be a Role in it.
    /// `None`: each Proxy's own namespace, listed cluster-wide.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The Squid image; default [`KubernetesConfig::DEFAULT_IMAGE`].
    #[serde(default)]
    pub image: Option<String>,
    /// Requests and limits of the Squid container.
    #[serde(default)]
    pub resources: Option<KubernetesResources>,
    /// Where the proxies may connect and who may use them; every field has a safe default.
    #[serde(default)]
    pub access: Option<ProxyAccess>,
}

/// `kubernetes.access`: the rules each generated Squid config enforces, credentials or not.
///
/// Always refused, whatever these say: loopback and unspecified addresses (`127.0.0.0/8`,
/// `0.0.0.0/8`, `::1`, `::`), link-local ones (`169.254.0.0/16`, `fe80::/10`) and the cloud
/// metadata services by name and address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyAccess {
    /// The ports a `CONNECT` may reach; default [`ProxyAccess::DEFAULT_CONNECT_PORTS`] (443).
    #[serde(default)]
    pub connect_ports: Option<Vec<u16>>,
    /// The ports a plain-HTTP request may reach; default [`ProxyAccess::DEFAULT_HTTP_PORTS`] (80).
    #[serde(default)]
    pub http_ports: Option<Vec<u16>>,
    /// Further destination ranges refused (`10.0.0.0/8`, `fd00::/8`, or one address); default
    /// [`ProxyAccess::DEFAULT_DENIED_DESTINATIONS`]: the RFC 1918, shared (RFC 6598, where some
    /// clusters put Pods and Services) and unique-local ranges. An
    /// empty list refuses none beyond the ones always refused.
    #[serde(default)]
    pub denied_destinations: Option<Vec<String>>,
    /// The client ranges the proxies accept; absent: any client (which still needs the Proxy's
    /// credentials when it has them).
    #[serde(default)]
    pub allowed_sources: Option<Vec<String>>,
}

impl ProxyAccess {
    pub const DEFAULT_CONNECT_PORTS: &'static [u16] = &[443];
    pub const DEFAULT_HTTP_PORTS: &'static [u16] = &[80];
    pub const DEFAULT_DENIED_DESTINATIONS: &'static [&'static str] = &[
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "fc00::/7",
    ];

    /// The `CONNECT` ports after defaults.
    pub fn effective_connect_ports(&self) -> Vec<u16> {
        self.connect_ports
            .clone()
            .unwrap_or_else(|| Self::DEFAULT_CONNECT_PORTS.to_vec())
    }

    /// The plain-HTTP ports after defaults.
    pub fn effective_http_ports(&self) -> Vec<u16> {
        self.http_ports
            .clone()
            .unwrap_or_else(|| Self::DEFAULT_HTTP_PORTS.to_vec())
    }

    /// The refused ranges after defaults.
    pub fn effective_denied_destinations(&self) -> Vec<String> {
        self.denied_destinations.clone().unwrap_or_else(|| {
            Self::DEFAULT_DENIED_DESTINATIONS
                .iter()
                .map(|r| (*r).to_owned())
                .collect()
        })
    }
}

/// Parses an address range as `address/prefix` or a lone address (a whole-length prefix), and
/// writes it back in the canonical form Squid and people read: `10.0.0.0/8`, `fd00::/8`.
///
/// # Errors
/// Not an address, a prefix longer than the address, or host bits set below the prefix (a
/// typo that would otherwise mean another range than the one meant).
pub fn canonical_range(text: &str) -> Result<String, String> {
    use std::net::IpAddr;
    let (address, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let address: IpAddr = address
        .parse()
        .map_err(|_| format!("{text:?} is not an address or address/prefix range"))?;
    let bits: u8 = if address.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => bits,
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= bits)
            .ok_or_else(|| format!("{text:?}: the prefix must be a number from 0 to {bits}"))?,
    };
    let value = match address {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    let host_bits = u32::from(bits - prefix);
    let host_mask = if host_bits == 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    if value & host_mask != 0 {
        return Err(format!("{text:?} has bits set below its /{prefix} prefix"));
    }
    Ok(format!("{address}/{prefix}"))
}

/// `kubernetes.resources`: Kubernetes quantities (`100m`, `64Mi`) by resource name (`cpu`,
/// `memory`, `ephemeral-storage`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesResources {
    /// What the scheduler reserves.
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
    /// What the container may use at most.
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
}

impl KubernetesConfig {
    /// The Squid image used when none is configured.
    pub const DEFAULT_IMAGE: &'static str = "ubuntu/squid:6.6-24.04_edge";
}

/// The `local:` block: proxies as tinyproxy processes on the operator's own machine, for
/// development and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalConfig {
    /// Where each instance's record, tinyproxy config, pid and log live (required, absolute).
    #[serde(default)]
    pub state_dir: String,
    /// The tinyproxy binary; default [`LocalConfig::DEFAULT_TINYPROXY`].
    #[serde(default)]
    pub tinyproxy_path: Option<String>,
    /// The ports a `CONNECT` may reach; default [`ProxyAccess::DEFAULT_CONNECT_PORTS`] (443).
    /// tinyproxy has no rules on destination addresses: a local proxy reaches whatever the
    /// machine does, which is one reason it is for development only.
    #[serde(default)]
    pub connect_ports: Option<Vec<u16>>,
}

impl LocalConfig {
    /// The tinyproxy binary used when none is configured (Debian's package).
    pub const DEFAULT_TINYPROXY: &'static str = "/usr/bin/tinyproxy";

    /// The `CONNECT` ports after defaults.
    pub fn effective_connect_ports(&self) -> Vec<u16> {
        self.connect_ports
            .clone()
            .unwrap_or_else(|| ProxyAccess::DEFAULT_CONNECT_PORTS.to_vec())
    }

    /// The tinyproxy binary after defaults.
    pub fn effective_tinyproxy_path(&self) -> &str {
        match self.tinyproxy_path.as_deref() {
            None | Some("") => Self::DEFAULT_TINYPROXY,
            Some(p) => p,
        }
    }
}

/// The `gcp:` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpConfig {
    /// The GCP project id (required).
    #[serde(default)]
    pub project: String,
    /// The VPC network; defaulted by the gcp provider.
    #[serde(default)]
    pub network: Option<String>,
    /// The network tag put on instances; defaulted by the gcp provider.
    #[serde(rename = "networkTag", default)]
    pub network_tag: Option<String>,
    /// Boot disk size in GB (default 10).
    #[serde(rename = "diskSizeGb", default)]
    pub disk_size_gb: Option<i64>,
}

/// The `kvm:` and `kvm2:` blocks: libvirt hypervisors reached over SSH.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
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
    /// The hosts a Proxy's `placement.image` URL may name (review M12). Absent: any host but a
    /// link-local address (as Go). Empty: URL images are off for this entry. Catalogue URLs
    /// (`images`) are the operator's own and are not restricted.
    #[serde(default)]
    pub image_url_hosts: Option<Vec<String>>,
    /// Machine catalogue for `placement.machineType`.
    #[serde(default)]
    pub machine_types: BTreeMap<String, KvmMachineType>,
    /// Hypervisors; `placement.zone` names one.
    #[serde(default)]
    pub hosts: Vec<KvmHost>,
}

impl KvmConfig {
    /// Overlay size used when `diskSizeGb` is 0 or absent.
    pub const DEFAULT_DISK_SIZE_GB: i64 = 10;

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
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
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
}
