//! The spec hash: what an instance was built from. A change replaces the instance.
//!
//! The value is [`VERSION_PREFIX`] (`v1:`) and then the lowercase hex SHA-256 of the canonical
//! JSON `{"placement":{"region","zone","machineType","image"},"cloudInit":"<base64 of the
//! resolved bytes>","port":N}` (keys in that order, no spaces), with `,"credentials":"Generated"` after the port when the Proxy's credentials are
//! generated. It covers exactly the placement, the resolved cloud-init, the port and whether the
//! proxy demands credentials (a proxy is built with or without them); nothing else in the spec
//! (mode, provider, attributes, maxLeases, healthCheck, endpoint) replaces an instance, and the
//! credentials themselves never enter it: a rotation replaces nothing. A Proxy without
//! credentials hashes as it always did.
//!
//! The prefix makes the value recognisably this operator's ([`is_own`]): a value without it was
//! written by someone else (the Go operator, whose hash is computed differently, or a build of
//! this one from before the prefix), and compares to nothing. The reconciler adopts such an
//! instance instead of replacing it (docs/controller.md). The version names the input: a build
//! that changes the input takes a new prefix and keeps computing the old one to compare.

use egress_api::ProxySpec;
use serde::Serialize;
use sha2::{Digest, Sha256};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PlacementInput<'a> {
    region: &'a str,
    zone: &'a str,
    machine_type: &'a str,
    image: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HashInput<'a> {
    placement: PlacementInput<'a>,
    cloud_init: String,
    port: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    credentials: Option<&'static str>,
}

/// What every hash this operator writes starts with.
pub const VERSION_PREFIX: &str = "v1:";

/// Whether `value` is a hash this operator writes: the prefix and 64 lowercase hex digits.
pub fn is_own(value: &str) -> bool {
    value
        .strip_prefix(VERSION_PREFIX)
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The hash of a spec with its cloud-init resolved to `cloud_init`.
pub fn spec_hash(spec: &ProxySpec, cloud_init: &[u8]) -> String {
    let placement = spec.placement.clone().unwrap_or_default();
    let input = HashInput {
        placement: PlacementInput {
            region: &placement.region,
            zone: &placement.zone,
            machine_type: &placement.machine_type,
            image: &placement.image,
        },
        cloud_init: data_encoding::BASE64.encode(cloud_init),
        port: spec.port,
        credentials: (spec.credentials_type() == egress_api::CredentialsType::Generated).then_some("Generated"),
    };
    let canonical = serde_json::to_vec(&input).expect("the hash input serialises");
    format!(
        "{VERSION_PREFIX}{}",
        data_encoding::HEXLOWER.encode(&Sha256::digest(&canonical))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::{Mode, Placement};

    fn spec() -> ProxySpec {
        ProxySpec {
            provider: "kvm-home".into(),
            placement: Some(Placement {
                zone: "hv1".into(),
                machine_type: "small".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_canonical_input_is_pinned() {
        // The input this hash is computed over, fixed so that a refactor cannot change every
        // Proxy's hash (which would replace every instance).
        let expected_input = r#"{"placement":{"region":"","zone":"hv1","machineType":"small","image":""},"cloudInit":"I2Nsb3VkLWNvbmZpZwo=","port":3128}"#;
        let expected = data_encoding::HEXLOWER.encode(&Sha256::digest(expected_input.as_bytes()));
        assert_eq!(spec_hash(&spec(), b"#cloud-config\n"), format!("v1:{expected}"));
    }

    #[test]
    fn generated_credentials_change_the_hash_and_nothing_else_about_them_does() {
        use egress_api::{Credentials, CredentialsType};
        let base = spec_hash(&spec(), b"a");
        let with = |type_| ProxySpec {
            credentials: Some(Credentials {
                type_,
                secret_ref: None,
            }),
            ..spec()
        };
        // An explicit None hashes as an absent field, as every Proxy from before did.
        assert_eq!(spec_hash(&with(CredentialsType::None), b"a"), base);
        let generated = spec_hash(&with(CredentialsType::Generated), b"a");
        assert_ne!(generated, base);
        let input = r#"{"placement":{"region":"","zone":"hv1","machineType":"small","image":""},"cloudInit":"YQ==","port":3128,"credentials":"Generated"}"#;
        assert_eq!(
            generated,
            format!(
                "v1:{}",
                data_encoding::HEXLOWER.encode(&Sha256::digest(input.as_bytes()))
            )
        );
    }

    #[test]
    fn only_the_prefixed_value_is_this_operators() {
        let own = spec_hash(&spec(), b"a");
        assert!(is_own(&own), "{own}");
        // Another operator's value, this operator's before the prefix, and near misses.
        for foreign in [
            own.trim_start_matches(VERSION_PREFIX),
            "",
            "v1:",
            "v2:0000000000000000000000000000000000000000000000000000000000000000",
            &own[..own.len() - 1],
            &own.to_uppercase(),
            &format!("{own}0"),
            "5f3c9a0e",
        ] {
            assert!(!is_own(foreign), "{foreign:?}");
        }
    }

    #[test]
    fn placement_cloud_init_and_port_matter_and_nothing_else() {
        let base = spec_hash(&spec(), b"a");
        assert_ne!(spec_hash(&spec(), b"b"), base);
        assert_ne!(spec_hash(&ProxySpec { port: 8080, ..spec() }, b"a"), base);
        let mut moved = spec();
        moved.placement.as_mut().unwrap().zone = "hv2".into();
        assert_ne!(spec_hash(&moved, b"a"), base);
        let mut other = spec();
        other.mode = Mode::Managed;
        other.provider = "elsewhere".into();
        other.attributes.insert("geo".into(), "x".into());
        other.max_leases = Some(0);
        assert_eq!(spec_hash(&other, b"a"), base);
        // No placement at all hashes like an empty one.
        assert_eq!(
            spec_hash(
                &ProxySpec {
                    placement: None,
                    ..spec()
                },
                b"a"
            ),
            spec_hash(
                &ProxySpec {
                    placement: Some(Placement::default()),
                    ..spec()
                },
                b"a"
            )
        );
    }
}
