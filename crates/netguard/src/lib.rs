//! The one list of internal destinations: what the Squid config of every kubernetes proxy
//! refuses, what an External Proxy may not point at, and what an image URL may not fetch.
//! Keeping one list means a range added for one of them is refused by all.
//!
//! - [`Range`]: an address range, parsed strictly and written canonically (`10.0.0.0/8`).
//! - The lists: [`LOCALHOST`], [`LINK_LOCAL`], [`TRANSLATED`], [`METADATA_ADDRESSES`],
//!   [`METADATA_NAMES`], [`PRIVATE`] and [`CLUSTER_NAME_SUFFIXES`].
//! - [`Guard`]: decides whether an address or a host name is internal, with the cluster's own
//!   ranges added and an allowlist for the tests and development setups whose targets are on
//!   127.0.0.1. An address is judged as what it reaches: the IPv4 address inside an
//!   IPv4-mapped IPv6 one is judged as IPv4, and a host written as a number in the forms the C
//!   resolver takes (`2852039166`, `0xa9fea9fe`, `169.254.43518`) is judged as that address.

mod range;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use range::Range;

/// Loopback and unspecified addresses (`0.0.0.0` reaches the local host too).
pub const LOCALHOST: &[&str] = &["127.0.0.0/8", "0.0.0.0/8", "::1/128", "::/128"];
/// Link-local addresses, where the cloud metadata servers live.
pub const LINK_LOCAL: &[&str] = &["169.254.0.0/16", "fe80::/10"];
/// IPv6 ranges that embed an IPv4 address a gateway forwards to: the NAT64 prefixes (RFC 6052,
/// RFC 8215) and 6to4 (RFC 3056). `[64:ff9b::a9fe:a9fe]` is 169.254.169.254 on a network with
/// NAT64.
pub const TRANSLATED: &[&str] = &["64:ff9b::/96", "64:ff9b:1::/48", "2002::/16"];
/// Metadata services outside link-local: Alibaba Cloud's and EC2's IPv6 one.
pub const METADATA_ADDRESSES: &[&str] = &["100.100.100.200/32", "fd00:ec2::254/128"];
/// Metadata services by name (a leading dot takes the subdomains too).
pub const METADATA_NAMES: &[&str] = &[
    ".metadata.google.internal",
    ".metadata.goog",
    "metadata",
    "instance-data",
    ".instance-data.ec2.internal",
];
/// Private networks: RFC 1918, shared address space (RFC 6598, where some clusters put Pods and
/// Services) and unique-local IPv6.
pub const PRIVATE: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
];
/// Names the cluster's DNS answers for its own Services and Pods.
pub const CLUSTER_NAME_SUFFIXES: &[&str] = &[".svc", ".cluster.local"];

/// Why a destination is internal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Internal {
    Localhost,
    LinkLocal,
    Translated,
    Metadata,
    Private,
    /// In a range the cluster's own (`--cluster-cidrs`).
    Cluster,
    /// A name the cluster's DNS answers, or one without a dot (which its search domains
    /// complete into one).
    ClusterName,
}

impl Internal {
    /// What it is, for a condition's message.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Localhost => "a loopback or unspecified address",
            Self::LinkLocal => "a link-local address",
            Self::Translated => "an IPv6 address that embeds an IPv4 one (NAT64, 6to4)",
            Self::Metadata => "a cloud metadata service",
            Self::Private => "a private address",
            Self::Cluster => "an address in the cluster's ranges",
            Self::ClusterName => "a cluster name (a Service, a Pod, or a name without a dot)",
        }
    }
}

/// The fixed lists as ranges, each with why it is internal.
fn fixed_ranges() -> impl Iterator<Item = (Range, Internal)> {
    let lists: [(&[&str], Internal); 5] = [
        (LOCALHOST, Internal::Localhost),
        (LINK_LOCAL, Internal::LinkLocal),
        (TRANSLATED, Internal::Translated),
        (METADATA_ADDRESSES, Internal::Metadata),
        (PRIVATE, Internal::Private),
    ];
    lists.into_iter().flat_map(|(list, why)| {
        list.iter()
            .map(move |r| (Range::parse(r).expect("the built-in ranges parse"), why))
    })
}

/// Decides what is internal: the fixed lists, the cluster's ranges, minus an allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guard {
    cluster: Vec<Range>,
    allowed_ranges: Vec<Range>,
    allowed_names: Vec<String>,
}

impl Guard {
    /// A guard that also refuses `cluster` (the cluster's Pod and Service ranges) and lets
    /// `allowed` through: addresses, ranges or host names (tests and development setups whose
    /// targets are on 127.0.0.1).
    ///
    /// # Errors
    /// A cluster range that does not parse, with the range.
    pub fn new(cluster: &[String], allowed: &[String]) -> Result<Self, String> {
        let cluster = cluster.iter().map(|r| Range::parse(r)).collect::<Result<_, _>>()?;
        let (mut allowed_ranges, mut allowed_names) = (Vec::new(), Vec::new());
        for a in allowed {
            match Range::parse(a) {
                Ok(range) => allowed_ranges.push(range),
                Err(_) => allowed_names.push(normal_name(a)),
            }
        }
        Ok(Self {
            cluster,
            allowed_ranges,
            allowed_names,
        })
    }

    /// Why `ip` is internal, or `None` when it may be reached.
    pub fn address(&self, ip: IpAddr) -> Option<Internal> {
        let ip = reached(ip);
        if self.allowed_ranges.iter().any(|r| r.contains(ip)) {
            return None;
        }
        if let Some((_, why)) = fixed_ranges().find(|(r, _)| r.contains(ip)) {
            return Some(why);
        }
        self.cluster.iter().any(|r| r.contains(ip)).then_some(Internal::Cluster)
    }

    /// Why host `host` (a URL's host part or an endpoint's, brackets allowed) is internal by
    /// itself, or `None`. A name that passes may still resolve to an internal address: whoever
    /// dials it checks what it resolved to with [`Guard::address`].
    pub fn host(&self, host: &str) -> Option<Internal> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Some(ip) = literal_address(bare) {
            return self.address(ip);
        }
        let name = normal_name(bare);
        if self.allowed_names.contains(&name) {
            return None;
        }
        if name == "localhost" || name.ends_with(".localhost") {
            return Some(Internal::Localhost);
        }
        let metadata = METADATA_NAMES.iter().any(|m| match m.strip_prefix('.') {
            Some(domain) => name == domain || name.ends_with(m),
            None => name == *m,
        });
        if metadata {
            return Some(Internal::Metadata);
        }
        let cluster = CLUSTER_NAME_SUFFIXES.iter().any(|s| name.ends_with(s)) || !name.contains('.');
        cluster.then_some(Internal::ClusterName)
    }
}

/// A host name as resolvers compare it: lower case, without the root's trailing dot.
fn normal_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The address `ip` reaches: an IPv4-mapped IPv6 address reaches its IPv4 one.
fn reached(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `host` as an address, when it is one in any form the C resolver takes: IPv6, dotted IPv4, or
/// IPv4 written as one to four numbers in decimal, octal (`0` first) or hex (`0x` first), the
/// last filling the remaining bytes (`inet_aton`).
fn literal_address(host: &str) -> Option<IpAddr> {
    if let Ok(v6) = host.parse::<Ipv6Addr>() {
        return Some(IpAddr::V6(v6));
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    let parts: Vec<u64> = host.split('.').map(number).collect::<Option<_>>()?;
    let (last, leading) = parts.split_last()?;
    if leading.len() > 3 || leading.iter().any(|p| *p > 255) {
        return None;
    }
    let last_bytes = 4 - leading.len() as u32;
    if *last >= 1u64 << (8 * last_bytes) {
        return None;
    }
    let high = leading
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, p)| acc | (p << (8 * (3 - i as u32))));
    Some(IpAddr::V4(Ipv4Addr::from((high | last) as u32)))
}

/// One part of a numeric IPv4 address: decimal, octal (`0` first) or hex (`0x` first).
fn number(part: &str) -> Option<u64> {
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() && radix != 16 || digits.len() > 12 {
        return None;
    }
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests;
