//! What Compute Engine accepts as a name or a reference, checked before anything is sent: a
//! value the API would refuse fails the config at load (or a Proxy's create at once) with a
//! message that says what the value must look like, instead of every insert failing later.
//!
//! The rules are the API reference's: resource names (networks, subnetworks, zones, machine
//! types, instances) and network tags follow RFC 1035, `[a-z]([-a-z0-9]{0,61}[a-z0-9])?`;
//! project IDs are 6 to 30 lowercase letters, digits and hyphens that start with a letter and
//! do not end with a hyphen, optionally after a `domain:` prefix (older domain-scoped projects);
//! a project's number (digits) names it too. A zone is its region and one more part
//! (`europe-west1-b`, and AI zones such as `us-central1-ai1a`).

/// The hosts a full resource URL may name, before `projects/…`.
const URL_PREFIXES: [&str; 2] = [
    "https://www.googleapis.com/compute/v1/",
    "https://compute.googleapis.com/compute/v1/",
];

/// What an RFC 1035 name must look like, for messages.
pub const NAME_RULE: &str =
    "1 to 63 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen";

/// Whether `s` is an RFC 1035 name of at most 63 characters, as Compute Engine names are.
pub fn is_name(s: &str) -> bool {
    // An RFC 1123 label that starts with a letter.
    egress_provider::is_dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// Whether `s` is a project ID or a project number (see the module docs).
pub fn is_project(s: &str) -> bool {
    if !s.is_empty() && s.len() <= 20 && s.bytes().all(|c| c.is_ascii_digit()) {
        return true;
    }
    let id = match s.rsplit_once(':') {
        Some((domain, id)) => {
            let domain_ok = !domain.is_empty()
                && domain.len() <= 63
                && domain
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.');
            if !domain_ok {
                return false;
            }
            id
        }
        None => s,
    };
    (6..=30).contains(&id.len()) && is_name(id)
}

/// Whether `s` names a network: a name, `global/networks/<name>`,
/// `projects/<project>/global/networks/<name>`, or that path as a full API URL.
pub fn is_network_ref(s: &str) -> bool {
    match in_project(s) {
        None => is_name(s),
        Some(Some(path)) => matches!(path.as_slice(), ["global", "networks", name] if is_name(name)),
        Some(None) => false,
    }
}

/// Whether `s` names a subnetwork: a name (looked up in the region of each Proxy's zone),
/// `regions/<region>/subnetworks/<name>`, `projects/<project>/regions/<region>/subnetworks/<name>`,
/// or that path as a full API URL.
pub fn is_subnetwork_ref(s: &str) -> bool {
    match in_project(s) {
        None => is_name(s),
        Some(Some(path)) => matches!(
            path.as_slice(),
            ["regions", region, "subnetworks", name] if is_name(region) && is_name(name)
        ),
        Some(None) => false,
    }
}

/// The segments of a reference's path below its project: `None` for a bare name (no `/`),
/// `Some(None)` for a path the API would not take (a URL without `projects/<p>/`, or a project
/// that is not one).
fn in_project(s: &str) -> Option<Option<Vec<&str>>> {
    if !s.contains('/') {
        return None;
    }
    let path = strip_url(s);
    let rest = match path.strip_prefix("projects/") {
        Some(rest) => match rest.split_once('/') {
            Some((project, rest)) if is_project(project) => rest,
            _ => return Some(None),
        },
        // A relative path, but not a full URL without its project.
        None if path.len() == s.len() => path,
        None => return Some(None),
    };
    Some(Some(rest.split('/').collect()))
}

/// The region of a zone: the zone name without its last `-` part (`europe-west1-b` and
/// `us-central1-ai1a` are in `europe-west1` and `us-central1`); `None` when the name is not a
/// name or has no region part ending in a digit (every region name does).
pub fn region_of(zone: &str) -> Option<&str> {
    let (region, _) = zone.rsplit_once('-')?;
    (is_name(zone) && is_name(region) && region.ends_with(|c: char| c.is_ascii_digit())).then_some(region)
}

/// The project a network path or URL names (`projects/<p>/global/networks/<n>`), if any.
pub fn project_of(reference: &str) -> Option<&str> {
    let (project, _) = strip_url(reference).strip_prefix("projects/")?.split_once('/')?;
    Some(project)
}

/// `s` without a full URL's scheme, host and API version, when it has them.
fn strip_url(s: &str) -> &str {
    URL_PREFIXES.iter().find_map(|p| s.strip_prefix(p)).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_rfc_1035() {
        for ok in ["a", "egress-proxy", "e2-micro", "n2-custom-4-8192", &"a".repeat(63)] {
            assert!(is_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Egress",
            "1st",
            "-a",
            "a-",
            "a_b",
            "a.b",
            "a b",
            &"a".repeat(64),
            "é",
        ] {
            assert!(!is_name(bad), "{bad}");
        }
    }

    #[test]
    fn project_ids_and_domain_scoped_ones() {
        for ok in [
            "egress-test",
            "my-project-123456",
            "example.com:my-project",
            &format!("a{}", "b".repeat(29)),
            "123456789012",
        ] {
            assert!(is_project(ok), "{ok}");
        }
        for bad in [
            "",
            "short",
            "My-Project",
            "1project",
            "project-",
            &"a".repeat(31),
            ":my-project",
            "a b:my-project",
        ] {
            assert!(!is_project(bad), "{bad}");
        }
    }

    #[test]
    fn network_references_in_every_form_the_api_takes() {
        for ok in [
            "default",
            "global/networks/vpc-a",
            "projects/host-project/global/networks/shared",
            "https://www.googleapis.com/compute/v1/projects/host-project/global/networks/shared",
            "https://compute.googleapis.com/compute/v1/projects/host-project/global/networks/shared",
        ] {
            assert!(is_network_ref(ok), "{ok}");
        }
        for bad in [
            "VPC",
            "networks/vpc-a",
            "global/networks/",
            "global/networks/vpc-a/extra",
            "projects/global/networks/vpc-a",
            "projects/host-project/regions/r/networks/vpc-a",
            "http://www.googleapis.com/compute/v1/projects/host-project/global/networks/shared",
            "https://evil.example/compute/v1/projects/host-project/global/networks/shared",
            "https://www.googleapis.com/compute/v1/global/networks/shared",
        ] {
            assert!(!is_network_ref(bad), "{bad}");
        }
    }

    #[test]
    fn subnetwork_references_in_every_form_the_api_takes() {
        for ok in [
            "proxies",
            "regions/europe-west1/subnetworks/proxies",
            "projects/host-project/regions/europe-west1/subnetworks/proxies",
            "https://www.googleapis.com/compute/v1/projects/host-project/regions/europe-west1/subnetworks/proxies",
        ] {
            assert!(is_subnetwork_ref(ok), "{ok}");
        }
        for bad in [
            "Proxies",
            "subnetworks/proxies",
            "regions/Europe/subnetworks/proxies",
            "global/networks/default",
            "regions/europe-west1/subnetworks/proxies/x",
        ] {
            assert!(!is_subnetwork_ref(bad), "{bad}");
        }
    }

    #[test]
    fn the_project_of_a_network_path() {
        assert_eq!(
            project_of("projects/host-project/global/networks/shared"),
            Some("host-project")
        );
        assert_eq!(
            project_of("https://www.googleapis.com/compute/v1/projects/host-project/global/networks/shared"),
            Some("host-project")
        );
        assert_eq!(project_of("global/networks/default"), None);
        assert_eq!(project_of("default"), None);
    }

    #[test]
    fn a_zones_region_is_its_name_without_the_last_letter() {
        assert_eq!(region_of("europe-west1-b"), Some("europe-west1"));
        assert_eq!(region_of("northamerica-northeast1-a"), Some("northamerica-northeast1"));
        assert_eq!(region_of("us-central1-ai1a"), Some("us-central1"));
        for bad in [
            "europe",
            "europe-west1-",
            "europe-west1",
            "Europe-west1-b",
            "-b",
            "zone-b",
        ] {
            assert_eq!(region_of(bad), None, "{bad}");
        }
    }
}
