//! The `gcp:` block of the providers file and its rules.

use egress_provider::config::Block;
use serde::{Deserialize, Serialize};

use crate::names::{NAME_RULE, is_name, is_network_ref, is_project, is_subnetwork_ref};

/// The largest boot disk the block accepts, in GB: a persistent disk's maximum (64 TB).
pub const MAX_DISK_SIZE_GB: i64 = 65_536;

/// The `gcp:` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GcpConfig {
    /// The GCP project id (required).
    #[serde(default)]
    pub project: String,
    /// The VPC network; defaulted by the gcp provider.
    #[serde(default)]
    pub network: Option<String>,
    /// The subnetwork of the NIC: required by custom-mode networks, optional otherwise. A bare
    /// name is looked up in the region of each Proxy's zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnetwork: Option<String>,
    /// The network tag put on instances; defaulted by the gcp provider.
    #[serde(rename = "networkTag", default)]
    pub network_tag: Option<String>,
    /// Boot disk size in GB (default 10).
    #[serde(rename = "diskSizeGb", default)]
    pub disk_size_gb: Option<i64>,
}

impl Block for GcpConfig {
    /// The `gcp` block: a project is mandatory, and every value must be one the Compute API
    /// accepts (see [`crate::names`]), so a typo fails the load instead of every insert.
    ///
    /// # Errors
    /// `gcp.project is required`, and for a value the API would refuse, a message naming the
    /// field, quoting the value and saying what it must look like (docs/providers/gcp.md lists
    /// them all).
    fn validate(_type_name: &str, block: Option<&Self>) -> Result<(), String> {
        let Some(gcp) = block.filter(|g| !g.project.is_empty()) else {
            return Err("gcp.project is required".to_owned());
        };
        if !is_project(&gcp.project) {
            return Err(format!(
                "gcp.project {:?} is not a project ID: 6 to 30 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen",
                gcp.project
            ));
        }
        let set = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        if let Some(network) = set(&gcp.network)
            && !is_network_ref(&network)
        {
            return Err(format!(
                "gcp.network {network:?} is not a network: a name ({NAME_RULE}), global/networks/<name> or projects/<project>/global/networks/<name>"
            ));
        }
        if let Some(subnetwork) = set(&gcp.subnetwork)
            && !is_subnetwork_ref(&subnetwork)
        {
            return Err(format!(
                "gcp.subnetwork {subnetwork:?} is not a subnetwork: a name ({NAME_RULE}), regions/<region>/subnetworks/<name> or projects/<project>/regions/<region>/subnetworks/<name>"
            ));
        }
        if let Some(tag) = set(&gcp.network_tag)
            && !is_name(&tag)
        {
            return Err(format!("gcp.networkTag {tag:?} is not a network tag: {NAME_RULE}"));
        }
        match gcp.disk_size_gb {
            Some(size) if size < 0 => Err("gcp.diskSizeGb must not be negative".to_owned()),
            Some(size) if size > MAX_DISK_SIZE_GB => Err(format!(
                "gcp.diskSizeGb {size} is over the {MAX_DISK_SIZE_GB} GB a persistent disk may hold"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(edit: impl FnOnce(&mut GcpConfig)) -> Result<(), String> {
        let mut block = GcpConfig {
            project: "egress-test".into(),
            ..GcpConfig::default()
        };
        edit(&mut block);
        GcpConfig::validate("gcp", Some(&block))
    }

    #[test]
    fn a_block_with_values_the_api_takes_loads() {
        assert_eq!(check(|_| {}), Ok(()));
        assert_eq!(
            check(|b| {
                b.project = "example.com:egress-test".into();
                b.network = Some("projects/host-project/global/networks/shared".into());
                b.subnetwork = Some("proxies".into());
                b.network_tag = Some("squid-3128".into());
                b.disk_size_gb = Some(MAX_DISK_SIZE_GB);
            }),
            Ok(())
        );
        // Empty strings mean "the default", as an absent key does.
        assert_eq!(
            check(|b| {
                b.network = Some(String::new());
                b.network_tag = Some(String::new());
            }),
            Ok(())
        );
    }

    #[test]
    fn each_value_the_api_refuses_fails_the_load_with_its_field_and_rule() {
        assert_eq!(GcpConfig::validate("gcp", None), Err("gcp.project is required".into()));
        for (edit, starts) in [
            (
                (|b: &mut GcpConfig| b.project = "Egress_Test".into()) as fn(&mut GcpConfig),
                "gcp.project \"Egress_Test\" is not a project ID: 6 to 30",
            ),
            (
                |b| b.network = Some("My VPC".into()),
                "gcp.network \"My VPC\" is not a network: a name (1 to 63",
            ),
            (
                |b| b.subnetwork = Some("subnetworks/x".into()),
                "gcp.subnetwork \"subnetworks/x\" is not a subnetwork",
            ),
            (
                |b| b.network_tag = Some("Egress".into()),
                "gcp.networkTag \"Egress\" is not a network tag: 1 to 63 lowercase",
            ),
            (|b| b.disk_size_gb = Some(-1), "gcp.diskSizeGb must not be negative"),
            (
                |b| b.disk_size_gb = Some(65_537),
                "gcp.diskSizeGb 65537 is over the 65536 GB",
            ),
        ] {
            let e = check(edit).expect_err(starts);
            assert!(e.starts_with(starts), "{e}");
        }
    }
}
