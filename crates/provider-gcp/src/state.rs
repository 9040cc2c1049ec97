//! What an `Instance` resource means to the reconciler (spec/providers.md §5.6).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::SystemTime;

use egress_provider::{Instance, InstanceState, LABEL_INSTALLATION, LABEL_UID};
use serde::Deserialize;

use crate::id;

/// The fields of a Compute Engine `Instance` this provider reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiInstance {
    /// The instance name.
    #[serde(default)]
    pub name: String,
    /// `PROVISIONING`, `RUNNING`, ...
    #[serde(default)]
    pub status: String,
    /// The zone's URL.
    #[serde(default)]
    pub zone: String,
    /// NICs, the first of which carries the external address.
    #[serde(default)]
    pub network_interfaces: Vec<ApiNic>,
    /// Labels (the marks).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The fingerprint of `labels`, which `setLabels` must send back (a stale one is refused).
    #[serde(default)]
    pub label_fingerprint: String,
    /// RFC 3339 with an offset.
    #[serde(default)]
    pub creation_timestamp: Option<String>,
}

/// A network interface.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiNic {
    /// External access configs.
    #[serde(default)]
    pub access_configs: Vec<ApiAccessConfig>,
}

/// An access config.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiAccessConfig {
    /// The external address, once assigned.
    #[serde(default, rename = "natIP")]
    pub nat_ip: Option<String>,
}

/// The state for a status and whether an external address is known. Unknown statuses are
/// Stopped on purpose: the reconciler then replaces the disposable VM, the safe reaction to a
/// status Google adds later.
pub fn map_status(status: &str, has_ip: bool) -> InstanceState {
    match status {
        "PROVISIONING" | "STAGING" | "REPAIRING" => InstanceState::Provisioning,
        "RUNNING" if has_ip => InstanceState::Running,
        "RUNNING" => InstanceState::Provisioning,
        "TERMINATED" => InstanceState::Terminated,
        _ => InstanceState::Stopped,
    }
}

impl ApiInstance {
    /// `networkInterfaces[0].accessConfigs[0].natIP`, when every step is there and parses.
    pub fn nat_ip(&self) -> Option<IpAddr> {
        self.network_interfaces
            .first()?
            .access_configs
            .first()?
            .nat_ip
            .as_deref()?
            .parse()
            .ok()
    }

    /// The instance as the reconciler sees it, under `id`. The address is reported only with
    /// Running, the one state where callers read it.
    pub fn to_instance(&self, id: String) -> Instance {
        let ip = self.nat_ip();
        let state = map_status(&self.status, ip.is_some());
        Instance::new(id, state)
            .with_ip(ip.filter(|_| state == InstanceState::Running))
            .with_uid(self.labels.get(LABEL_UID).cloned().unwrap_or_default())
            .with_created_at(self.creation_timestamp.as_deref().and_then(parse_time))
            .with_installation(self.labels.get(LABEL_INSTALLATION).cloned())
    }

    /// The instance as a list entry: its id from its own zone URL.
    pub fn to_listed_instance(&self) -> Instance {
        self.to_instance(id::format(id::last_segment(&self.zone), &self.name))
    }
}

/// An RFC 3339 time with an offset; `None` when it does not parse.
pub fn parse_time(text: &str) -> Option<SystemTime> {
    text.parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn the_state_table() {
        use InstanceState::*;
        for (status, ip, want) in [
            ("PROVISIONING", false, Provisioning),
            ("STAGING", true, Provisioning),
            ("REPAIRING", true, Provisioning),
            ("RUNNING", false, Provisioning),
            ("RUNNING", true, Running),
            ("STOPPING", true, Stopped),
            ("STOPPED", false, Stopped),
            ("SUSPENDING", true, Stopped),
            ("SUSPENDED", false, Stopped),
            ("TERMINATED", true, Terminated),
            ("HIBERNATING", true, Stopped),
            ("", false, Stopped),
        ] {
            assert_eq!(map_status(status, ip), want, "{status} with ip={ip}");
        }
    }

    #[test]
    fn fields_are_read_from_an_api_instance() {
        let raw = serde_json::json!({
            "name": "proxy-a",
            "status": "RUNNING",
            "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/europe-west1-b",
            "networkInterfaces": [{"networkIP": "10.0.0.2", "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "natIP": "34.1.2.3"}]}],
            "labels": {"proxy-operator-managed": "true", "proxy-operator-uid": "u-1", "proxy-operator-installation": "blue"},
            "creationTimestamp": "2026-09-16T04:05:06.789-07:00"
        });
        let api: ApiInstance = serde_json::from_value(raw).expect("an instance");
        let i = api.to_listed_instance();
        assert_eq!(i.id.as_str(), "zones/europe-west1-b/instances/proxy-a");
        assert_eq!(i.state, InstanceState::Running);
        assert_eq!(i.ip, Some(IpAddr::from([34, 1, 2, 3])));
        assert_eq!(i.uid, "u-1");
        assert_eq!(i.installation.as_deref(), Some("blue"));
        assert_eq!(
            i.created_at,
            Some(UNIX_EPOCH + Duration::from_millis(1_789_556_706_789))
        );
    }

    #[test]
    fn missing_pieces_mean_no_address_no_uid_no_time() {
        for raw in [
            serde_json::json!({"status": "RUNNING"}),
            serde_json::json!({"status": "RUNNING", "networkInterfaces": []}),
            serde_json::json!({"status": "RUNNING", "networkInterfaces": [{"accessConfigs": []}]}),
            serde_json::json!({"status": "RUNNING", "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]}),
        ] {
            let api: ApiInstance = serde_json::from_value(raw.clone()).expect("an instance");
            let i = api.to_instance("zones/z/instances/x".into());
            assert_eq!((i.state, i.ip), (InstanceState::Provisioning, None), "{raw}");
            assert_eq!(i.uid, "");
            assert_eq!(i.created_at, None);
        }
        let api: ApiInstance = serde_json::from_value(
            serde_json::json!({"status": "STOPPED", "creationTimestamp": "yesterday",
                "networkInterfaces": [{"accessConfigs": [{"natIP": "34.1.2.3"}]}]}),
        )
        .expect("an instance");
        let i = api.to_instance("zones/z/instances/x".into());
        assert_eq!((i.state, i.ip, i.created_at), (InstanceState::Stopped, None, None));
    }
}
