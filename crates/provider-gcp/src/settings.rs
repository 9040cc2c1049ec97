//! The `gcp:` block with its defaults (spec/providers.md §5.2), and what a Proxy's placement
//! must give.

use crate::config::GcpConfig;
use crate::names::{NAME_RULE, is_name, project_of, region_of};
use egress_provider::Placement;

/// The VPC network when the block names none: the auto-created one.
pub const DEFAULT_NETWORK: &str = "default";
/// The network tag when the block names none. The firewall rule that lets clients reach the
/// proxies targets this tag, so an installation with an existing rule sets `networkTag` to
/// that rule's target tag.
pub const DEFAULT_NETWORK_TAG: &str = "egress-proxy";
/// The boot disk size when the block names none.
pub const DEFAULT_DISK_SIZE_GB: i64 = 10;

/// One entry's settings, defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The project every call addresses (never taken from the credentials).
    pub project: String,
    /// The NIC's network: a name, or a path or URL when it contains `/`.
    pub network: String,
    /// The NIC's subnetwork, when the block names one: a name (in each zone's region), or a
    /// path or URL.
    pub subnetwork: Option<String>,
    /// The instance's network tag.
    pub network_tag: String,
    /// The boot disk size.
    pub disk_size_gb: i64,
}

impl Settings {
    /// The settings of a `gcp:` block (already validated at load).
    pub fn from_config(block: &GcpConfig) -> Self {
        let or = |v: &Option<String>, d: &str| v.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| d.to_owned());
        Self {
            project: block.project.clone(),
            network: or(&block.network, DEFAULT_NETWORK),
            subnetwork: block.subnetwork.clone().filter(|s| !s.is_empty()),
            network_tag: or(&block.network_tag, DEFAULT_NETWORK_TAG),
            disk_size_gb: block.disk_size_gb.filter(|s| *s > 0).unwrap_or(DEFAULT_DISK_SIZE_GB),
        }
    }

    /// Settings for `project` with every default.
    pub fn for_project(project: impl Into<String>) -> Self {
        Self::from_config(&GcpConfig {
            project: project.into(),
            ..GcpConfig::default()
        })
    }

    /// The NIC's `network` field: `global/networks/<name>`, or the configured value unchanged
    /// when it is already a path or URL (another project's network, say).
    pub fn network_path(&self) -> String {
        if self.network.contains('/') {
            self.network.clone()
        } else {
            format!("global/networks/{}", self.network)
        }
    }

    /// The NIC's `subnetwork` field for an instance in `zone`: a bare name becomes
    /// `regions/<zone's region>/subnetworks/<name>`, in the network's project when the network
    /// names another (a Shared VPC host's subnetworks live there); a path or URL goes unchanged.
    pub fn subnetwork_path(&self, zone: &str) -> Option<String> {
        let subnetwork = self.subnetwork.as_deref()?;
        match (subnetwork.contains('/'), region_of(zone)) {
            (false, Some(region)) => {
                let path = format!("regions/{region}/subnetworks/{subnetwork}");
                Some(match project_of(&self.network) {
                    Some(host) => format!("projects/{host}/{path}"),
                    None => path,
                })
            }
            _ => Some(subnetwork.to_owned()),
        }
    }
}

/// What create needs from a Proxy's placement; `region` is ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Where<'a> {
    /// The zone.
    pub zone: &'a str,
    /// The machine type name.
    pub machine_type: &'a str,
    /// The boot image reference.
    pub image: &'a str,
}

/// The placement's zone, machine type and image, each required.
///
/// # Errors
/// `placement.<field> is required` for the first one missing.
pub fn placement(p: &Placement) -> Result<Where<'_>, String> {
    for (field, value) in [("zone", &p.zone), ("machineType", &p.machine_type), ("image", &p.image)] {
        if value.trim().is_empty() {
            return Err(format!("placement.{field} is required"));
        }
    }
    // Both go into request paths, so anything but a plain name is refused here.
    if region_of(&p.zone).is_none() {
        return Err(format!(
            "placement.zone {:?} is not a zone name (a region and one more part, such as europe-west1-b)",
            p.zone
        ));
    }
    if !is_name(&p.machine_type) {
        return Err(format!(
            "placement.machineType {:?} is not a machine type name: {NAME_RULE}",
            p.machine_type
        ));
    }
    Ok(Where {
        zone: &p.zone,
        machine_type: &p.machine_type,
        image: &p.image,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_the_block_leaves_out() {
        let s = Settings::for_project("p");
        assert_eq!(
            (s.network.as_str(), s.network_tag.as_str(), s.disk_size_gb),
            ("default", DEFAULT_NETWORK_TAG, 10)
        );
        let s = Settings::from_config(&GcpConfig {
            project: "p".into(),
            network: Some("vpc-a".into()),
            network_tag: Some("squid".into()),
            disk_size_gb: Some(20),
            ..GcpConfig::default()
        });
        assert_eq!(
            (s.network_path().as_str(), s.network_tag.as_str(), s.disk_size_gb),
            ("global/networks/vpc-a", "squid", 20)
        );
        let s = Settings::from_config(&GcpConfig {
            project: "p".into(),
            network: Some("projects/host/global/networks/shared".into()),
            ..GcpConfig::default()
        });
        assert_eq!(s.network_path(), "projects/host/global/networks/shared");
        assert_eq!(s.subnetwork_path("europe-west1-b"), None);
    }

    #[test]
    fn a_bare_subnetwork_name_is_looked_up_in_the_zones_region() {
        let with = |subnetwork: &str| {
            Settings::from_config(&GcpConfig {
                project: "p".into(),
                subnetwork: Some(subnetwork.into()),
                ..GcpConfig::default()
            })
        };
        assert_eq!(
            with("proxies").subnetwork_path("us-central1-a").as_deref(),
            Some("regions/us-central1/subnetworks/proxies")
        );
        let path = "projects/host/regions/europe-west1/subnetworks/shared";
        assert_eq!(with(path).subnetwork_path("us-central1-a").as_deref(), Some(path));
        // With a Shared VPC host's network, a name is the host's subnetwork.
        let mut shared = with("proxies");
        shared.network = "projects/host-project/global/networks/shared".into();
        assert_eq!(
            shared.subnetwork_path("europe-west1-b").as_deref(),
            Some("projects/host-project/regions/europe-west1/subnetworks/proxies")
        );
    }

    #[test]
    fn placement_needs_zone_machine_type_and_image() {
        let full = Placement {
            region: "ignored".into(),
            zone: "europe-west1-b".into(),
            machine_type: "e2-micro".into(),
            image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into(),
        };
        assert_eq!(placement(&full).map(|w| w.zone), Ok("europe-west1-b"));
        for (field, clear) in [
            ("zone", (|p: &mut Placement| p.zone.clear()) as fn(&mut Placement)),
            ("machineType", |p| p.machine_type.clear()),
            ("image", |p| p.image.clear()),
        ] {
            let mut p = full.clone();
            clear(&mut p);
            assert_eq!(placement(&p), Err(format!("placement.{field} is required")));
        }
        for zone in [
            "zones/europe-west1-b",
            "Europe-west1-b",
            "europe-west1",
            "europe-west1-b?x=1",
        ] {
            let mut p = full.clone();
            p.zone = zone.into();
            let e = placement(&p).expect_err(zone);
            assert!(
                e.starts_with(&format!("placement.zone {zone:?} is not a zone name")),
                "{e}"
            );
        }
        for machine_type in ["zones/z/machineTypes/e2-micro", "E2-MICRO", "e2 micro"] {
            let mut p = full.clone();
            p.machine_type = machine_type.into();
            assert!(placement(&p).is_err(), "{machine_type}");
        }
    }
}
