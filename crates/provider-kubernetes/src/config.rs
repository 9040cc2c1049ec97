//! The `kubernetes:` block of the providers file and its rules: the
//! namespace, the Squid container's resources and the access rules each
//! generated Squid config enforces.

use std::collections::BTreeMap;

use egress_provider::config::{Block, go_quote};
use serde::{Deserialize, Serialize};

/// The `kubernetes:` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
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
    /// The private ranges of the one list of internal destinations.
    pub const DEFAULT_DENIED_DESTINATIONS: &'static [&'static str] = egress_netguard::PRIVATE;

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
    egress_netguard::Range::parse(text).map(|r| r.to_string())
}

/// `kubernetes.resources`: Kubernetes quantities (`100m`, `64Mi`) by resource name (`cpu`,
/// `memory`, `ephemeral-storage`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
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

impl Block for KubernetesConfig {
    /// The `kubernetes` block: `namespace` a DNS-1123 label; resource names and quantities of
    /// `resources`, in sorted order.
    ///
    /// # Errors
    /// The first bad entry, e.g. `kubernetes.resources.limits["memory"] must be a quantity such as 100m or 64Mi (got "lots")`.
    fn validate(_type_name: &str, block: Option<&Self>) -> Result<(), String> {
        if let Some(namespace) = block.and_then(|k| k.namespace.as_deref())
            && !egress_provider::is_dns1123_label(namespace)
        {
            return Err(format!(
                "kubernetes.namespace must be a namespace name (a DNS-1123 label), got {}",
                go_quote(namespace)
            ));
        }
        if let Some(access) = block.and_then(|k| k.access.as_ref()) {
            access_rules(access)?;
        }
        let Some(resources) = block.and_then(|k| k.resources.as_ref()) else {
            return Ok(());
        };
        for (kind, map) in [("requests", &resources.requests), ("limits", &resources.limits)] {
            for (name, value) in map {
                let at = format!("kubernetes.resources.{kind}[{}]", go_quote(name));
                if !matches!(name.as_str(), "cpu" | "memory" | "ephemeral-storage") {
                    return Err(format!("{at}: the resource must be cpu, memory or ephemeral-storage"));
                }
                if !is_quantity(value) {
                    return Err(format!(
                        "{at} must be a quantity such as 100m or 64Mi (got {})",
                        go_quote(value)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A Kubernetes quantity: digits (a decimal point allowed) and an optional suffix.
fn is_quantity(s: &str) -> bool {
    let digits_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    !number.is_empty()
        && number.bytes().filter(|b| *b == b'.').count() <= 1
        && number.bytes().any(|b| b.is_ascii_digit())
        && matches!(
            suffix,
            "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
        )
}

/// `kubernetes.access`: port lists not empty and without 0; every range an address or
/// `address/prefix` without host bits; `allowedSources` neither empty nor a whole address family
/// (leave it out for any client).
fn access_rules(access: &ProxyAccess) -> Result<(), String> {
    for (field, ports) in [
        ("connectPorts", &access.connect_ports),
        ("httpPorts", &access.http_ports),
    ] {
        let Some(ports) = ports else { continue };
        if ports.is_empty() {
            return Err(format!("kubernetes.access.{field} must list at least one port"));
        }
        if ports.contains(&0) {
            return Err(format!("kubernetes.access.{field}: 0 is not a port"));
        }
    }
    for (field, ranges) in [
        ("deniedDestinations", &access.denied_destinations),
        ("allowedSources", &access.allowed_sources),
    ] {
        for range in ranges.iter().flatten() {
            let canonical = canonical_range(range).map_err(|why| format!("kubernetes.access.{field}: {why}"))?;
            if field == "allowedSources" && canonical.ends_with("/0") {
                return Err(format!(
                    "kubernetes.access.allowedSources: {range:?} is every address; leave allowedSources out to accept any client"
                ));
            }
        }
    }
    if access.allowed_sources.as_ref().is_some_and(Vec::is_empty) {
        return Err(
            "kubernetes.access.allowedSources is empty, which would refuse every client; leave it out to accept any"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rules_refuse_what_would_lock_out_or_open_up() {
        let ok = ProxyAccess {
            connect_ports: Some(vec![443, 8443]),
            http_ports: Some(vec![80]),
            denied_destinations: Some(vec![]),
            allowed_sources: Some(vec!["10.8.0.0/16".into()]),
        };
        assert_eq!(access_rules(&ok), Ok(()));
        let cases = [
            (
                ProxyAccess {
                    connect_ports: Some(vec![]),
                    ..ProxyAccess::default()
                },
                "connectPorts must list at least one port",
            ),
            (
                ProxyAccess {
                    http_ports: Some(vec![0]),
                    ..ProxyAccess::default()
                },
                "httpPorts: 0 is not a port",
            ),
            (
                ProxyAccess {
                    denied_destinations: Some(vec!["10.0.0.1/8".into()]),
                    ..ProxyAccess::default()
                },
                "deniedDestinations: \"10.0.0.1/8\" has bits set",
            ),
            (
                ProxyAccess {
                    allowed_sources: Some(vec![]),
                    ..ProxyAccess::default()
                },
                "allowedSources is empty",
            ),
            (
                ProxyAccess {
                    allowed_sources: Some(vec!["::/0".into()]),
                    ..ProxyAccess::default()
                },
                "is every address",
            ),
        ];
        for (access, want) in cases {
            let err = access_rules(&access).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let defaults = ProxyAccess::default();
        assert_eq!(defaults.effective_connect_ports(), [443]);
        assert_eq!(defaults.effective_http_ports(), [80]);
        assert_eq!(defaults.effective_denied_destinations().len(), 5);
    }
}
