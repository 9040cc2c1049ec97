//! The `instances.insert` request (spec/providers.md §5.4.1): its JSON body and its
//! `requestId`. Pure functions of the request and the entry's settings.

use egress_provider::{CreateRequest, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_MANAGED_YES, LABEL_UID};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::settings::{Settings, Where};

/// The metadata item that carries cloud-init.
pub const USER_DATA_KEY: &str = "user-data";
/// The metadata item that says the user-data is base64.
pub const USER_DATA_ENCODING_KEY: &str = "user-data-encoding";
/// The metadata item with the Proxy's htpasswd line (the user name and a salted SHA-512-crypt
/// hash, never the password), when it has credentials. The VM reads it from the metadata server:
/// `http://metadata.google.internal/computeMetadata/v1/instance/attributes/egress-proxy-htpasswd`.
pub const HTPASSWD_KEY: &str = "egress-proxy-htpasswd";
/// The most a metadata value may hold (the API's limit for one value).
pub const USER_DATA_LIMIT: usize = 256 * 1024;

/// The insert body for `req` in `at`.
///
/// # Errors
/// The cloud-init is too large for a metadata value (see [`user_data_items`]).
pub fn insert_body(req: &CreateRequest, at: &Where<'_>, settings: &Settings) -> Result<Value, String> {
    let mut labels = serde_json::Map::new();
    labels.insert(LABEL_MANAGED.to_owned(), json!(LABEL_MANAGED_YES));
    labels.insert(LABEL_UID.to_owned(), json!(req.uid));
    if let Some(installation) = &req.installation {
        labels.insert(LABEL_INSTALLATION.to_owned(), json!(installation));
    }
    let mut body = json!({
        "name": req.name,
        "machineType": format!("zones/{}/machineTypes/{}", at.zone, at.machine_type),
        "disks": [{
            "boot": true,
            "autoDelete": true,
            "initializeParams": {
                "sourceImage": at.image,
                // int64 fields travel as JSON strings.
                "diskSizeGb": settings.disk_size_gb.to_string(),
            },
        }],
        "networkInterfaces": [{
            "network": settings.network_path(),
            "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
        }],
        "labels": labels,
        "tags": {"items": [settings.network_tag]},
    });
    if let Some(subnetwork) = settings.subnetwork_path(at.zone) {
        body["networkInterfaces"][0]["subnetwork"] = json!(subnetwork);
    }
    let mut items = Vec::new();
    if !req.cloud_init.is_empty()
        && let Value::Array(user_data) = user_data_items(&req.cloud_init)?
    {
        items.extend(user_data);
    }
    if let Some(credentials) = &req.credentials {
        items.push(json!({"key": HTPASSWD_KEY, "value": credentials.htpasswd}));
    }
    if !items.is_empty() {
        body["metadata"] = json!({"items": items});
    }
    Ok(body)
}

/// The metadata items that deliver `cloud_init` byte for byte: UTF-8 text as it is (what the Go
/// provider sent), anything else (gzip, say) base64-encoded with `user-data-encoding: base64`,
/// which cloud-init's GCE datasource decodes.
///
/// # Errors
/// The value would be over [`USER_DATA_LIMIT`]. The message does not quote it.
pub fn user_data_items(cloud_init: &[u8]) -> Result<Value, String> {
    let (value, encoded) = match std::str::from_utf8(cloud_init) {
        Ok(text) => (text.to_owned(), false),
        Err(_) => (data_encoding::BASE64.encode(cloud_init), true),
    };
    if value.len() > USER_DATA_LIMIT {
        return Err(format!(
            "cloud-init is {} bytes{}, over the {USER_DATA_LIMIT} bytes a gcp metadata value may hold",
            value.len(),
            if encoded { " in base64" } else { "" }
        ));
    }
    let mut items = vec![json!({"key": USER_DATA_KEY, "value": value})];
    if encoded {
        items.push(json!({"key": USER_DATA_ENCODING_KEY, "value": "base64"}));
    }
    Ok(Value::Array(items))
}

/// The insert's `requestId`: a UUID derived from the Proxy's UID, the instance's zone and name
/// and `generation`, so a retried insert carries the same one and the API never creates twice.
/// `generation` changes once the provider has deleted the instance or seen its insert fail: the
/// API remembers a requestId for an hour and would answer a fresh insert with the old operation.
pub fn request_id(uid: &str, zone: &str, name: &str, generation: u64) -> String {
    let digest = Sha256::digest(format!("{uid}\n{zone}\n{name}\n{generation}").as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    // An RFC 4122 name-based UUID: version 5 layout.
    egress_provider::uuid_text(b, 5)
}

#[cfg(test)]
mod tests {
    use egress_provider::Placement;

    use super::*;
    use crate::settings::placement;

    fn request(cloud_init: &[u8]) -> CreateRequest {
        CreateRequest {
            name: "proxy-abcdefghijklmnop".into(),
            uid: "7d4c1f7e-0000-4000-8000-000000000001".into(),
            namespace: "crawl".into(),
            proxy_name: "p1".into(),
            placement: Placement {
                region: "europe-west1".into(),
                zone: "europe-west1-b".into(),
                machine_type: "e2-micro".into(),
                image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into(),
            },
            cloud_init: cloud_init.to_vec(),
            port: 3128,
            installation: None,
            credentials: None,
            spread_group: None,
        }
    }

    #[test]
    fn the_body_field_by_field() {
        let req = request(b"#cloud-config\npackages: [squid]\n");
        let at = placement(&req.placement).expect("a placement");
        let body = insert_body(&req, &at, &Settings::for_project("p")).expect("a body");
        assert_eq!(
            body,
            json!({
                "name": "proxy-abcdefghijklmnop",
                "machineType": "zones/europe-west1-b/machineTypes/e2-micro",
                "disks": [{"boot": true, "autoDelete": true, "initializeParams": {
                    "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
                    "diskSizeGb": "10"}}],
                "networkInterfaces": [{"network": "global/networks/default",
                    "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}],
                "labels": {"proxy-operator-managed": "true", "proxy-operator-uid": "7d4c1f7e-0000-4000-8000-000000000001"},
                "metadata": {"items": [{"key": "user-data", "value": "#cloud-config\npackages: [squid]\n"}]},
                "tags": {"items": ["egress-proxy"]}
            })
        );
    }

    #[test]
    fn a_subnetwork_goes_on_the_nic_in_the_zones_region() {
        let req = request(b"");
        let at = placement(&req.placement).expect("a placement");
        let settings = Settings::from_config(&crate::config::GcpConfig {
            project: "p".into(),
            network: Some("custom-vpc".into()),
            subnetwork: Some("proxies".into()),
            ..crate::config::GcpConfig::default()
        });
        let body = insert_body(&req, &at, &settings).expect("a body");
        assert_eq!(
            body["networkInterfaces"][0],
            json!({"network": "global/networks/custom-vpc",
                "subnetwork": "regions/europe-west1/subnetworks/proxies",
                "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]})
        );
    }

    #[test]
    fn the_installation_mark_and_an_empty_cloud_init() {
        let mut req = request(b"");
        req.installation = Some("blue".into());
        let at = placement(&req.placement).expect("a placement");
        let body = insert_body(&req, &at, &Settings::for_project("p")).expect("a body");
        assert_eq!(body["labels"]["proxy-operator-installation"], "blue");
        assert!(body.get("metadata").is_none(), "no metadata block without cloud-init");
    }

    #[test]
    fn binary_cloud_init_travels_in_base64_and_too_much_is_refused_without_quoting_it() {
        let gzip = [0x1f, 0x8b, 0x08, 0xff, 0xfe];
        let req = request(&gzip);
        let at = placement(&req.placement).expect("a placement");
        let body = insert_body(&req, &at, &Settings::for_project("p")).expect("a body");
        assert_eq!(
            body["metadata"]["items"],
            json!([{"key": "user-data", "value": "H4sI//4="}, {"key": "user-data-encoding", "value": "base64"}])
        );
        let big = vec![b'a'; USER_DATA_LIMIT + 1];
        let req = request(&big);
        let e = insert_body(&req, &at, &Settings::for_project("p")).expect_err("too big");
        assert!(e.contains("262145 bytes") && !e.contains("aaaa"), "{e}");
        let e = user_data_items(&vec![0xff; USER_DATA_LIMIT]).expect_err("too big once encoded");
        assert!(e.contains("in base64"), "{e}");
    }

    #[test]
    fn credentials_send_only_the_htpasswd_line() {
        let mut req = request(b"#cloud-config\n");
        let c = egress_provider::Credentials::new("u1", "SENTINEL-password").unwrap();
        req.credentials = Some(egress_provider::ProxyCredentials::new(c, "s"));
        let at = placement(&req.placement).expect("a placement");
        let body = insert_body(&req, &at, &Settings::for_project("p")).expect("a body");
        let items = body["metadata"]["items"].as_array().unwrap();
        assert_eq!(items[0]["key"], "user-data");
        assert_eq!(items[1]["key"], HTPASSWD_KEY);
        let line = items[1]["value"].as_str().unwrap();
        assert!(line.starts_with("u1:$6$"), "{line}");
        assert!(
            !body.to_string().contains("SENTINEL"),
            "the password went into the body"
        );
        // Without cloud-init the line still goes.
        let mut bare = request(b"");
        bare.credentials = req.credentials.clone();
        let body = insert_body(&bare, &at, &Settings::for_project("p")).expect("a body");
        assert_eq!(body["metadata"]["items"][0]["key"], HTPASSWD_KEY);
    }

    #[test]
    fn request_ids_are_uuids_stable_per_generation() {
        let a = request_id("u", "z", "n", 0);
        assert_eq!(a, request_id("u", "z", "n", 0));
        assert_ne!(a, request_id("u", "z", "n", 1));
        assert_ne!(a, request_id("v", "z", "n", 0));
        let parts: Vec<_> = a.split('-').map(str::len).collect();
        assert_eq!(parts, vec![8, 4, 4, 4, 12], "{a}");
        assert_eq!(&a[14..15], "5");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
