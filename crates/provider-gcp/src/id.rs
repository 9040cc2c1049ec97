//! The providerID `zones/<zone>/instances/<name>` (spec/providers.md §5.5). The project is not
//! part of it; it comes from the config.

use crate::names::is_name;

/// The id of instance `name` in `zone`.
pub fn format(zone: &str, name: &str) -> String {
    format!("zones/{zone}/instances/{name}")
}

/// The zone and name of an id.
///
/// # Errors
/// Anything but exactly `zones/<zone>/instances/<name>` with both parts names the API takes
/// (they go into request paths, so nothing else may pass).
pub fn parse(id: &str) -> Result<(&str, &str), String> {
    match id.split('/').collect::<Vec<_>>().as_slice() {
        ["zones", zone, "instances", name] if is_name(zone) && is_name(name) => Ok((zone, name)),
        _ => Err(format!(
            "malformed gcp providerID {id:?}: want zones/<zone>/instances/<name>"
        )),
    }
}

/// The last segment of a resource URL (the zone of an instance's `zone` field).
pub fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_malformed_ones_are_refused() {
        let id = format("europe-west1-b", "proxy-abc");
        assert_eq!(id, "zones/europe-west1-b/instances/proxy-abc");
        assert_eq!(parse(&id), Ok(("europe-west1-b", "proxy-abc")));
        for bad in [
            "",
            "proxy-abc",
            "zones//instances/x",
            "zones/z/instances/",
            "zone/z/instances/x",
            "zones/z/instance/x",
            "zones/z/instances/x/y",
            "projects/p/zones/z/instances/x",
            "zones/z?a=b/instances/x",
            "zones/z/instances/x%2Fy",
            "zones/Z/instances/x",
            "zones/z/instances/..",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            last_segment("https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a"),
            "us-central1-a"
        );
    }
}
