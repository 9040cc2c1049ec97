//! The `gcp:` block of the providers file and its rules.

use egress_provider::config::Block;
use serde::{Deserialize, Serialize};

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
    /// The network tag put on instances; defaulted by the gcp provider.
    #[serde(rename = "networkTag", default)]
    pub network_tag: Option<String>,
    /// Boot disk size in GB (default 10).
    #[serde(rename = "diskSizeGb", default)]
    pub disk_size_gb: Option<i64>,
}

impl Block for GcpConfig {
    /// The `gcp` block: a project is mandatory.
    ///
    /// # Errors
    /// `gcp.project is required`, `gcp.diskSizeGb must not be negative`.
    fn validate(_type_name: &str, block: Option<&Self>) -> Result<(), String> {
        let Some(gcp) = block.filter(|g| !g.project.is_empty()) else {
            return Err("gcp.project is required".to_owned());
        };
        if gcp.disk_size_gb.is_some_and(|size| size < 0) {
            return Err("gcp.diskSizeGb must not be negative".to_owned());
        }
        Ok(())
    }
}
