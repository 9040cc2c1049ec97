//! Placement resolution, before any lock, dial or call: the host (`zone`), the machine profile
//! (`machineType`) and the image (`image`: a catalogue key, or an http(s) URL taken as qcow2
//! with UEFI). `region` is ignored (it is still part of the spec hash, so changing it replaces
//! the VM). Every failure is Permanent and names the field and value.

use crate::config::{KvmConfig, KvmHost};
use egress_provider::Placement;

use super::url_guard::UrlHosts;

use crate::generation::Generation;

/// The image a placement asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// The catalogue key, or the URL's key ([`Generation::url_key`]).
    pub key: String,
    /// Where to download it.
    pub url: String,
    /// The expected SHA-256, lowercase; `None` when not configured.
    pub sha256: Option<String>,
    /// `qcow2` or `raw`.
    pub format: String,
    /// `uefi` or `bios`.
    pub firmware: String,
    /// Given by URL in the placement (its format is read from its first bytes at create).
    pub from_url: bool,
}

/// A placement, resolved against the entry's config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved<'a> {
    /// The hypervisor.
    pub host: &'a KvmHost,
    /// Virtual CPUs.
    pub vcpus: i32,
    /// Memory in MiB.
    pub memory_mib: i64,
    /// The image.
    pub image: Image,
}

/// Whether `raw` is an absolute http(s) URL with a host (a placement's image given directly).
fn is_http_url(raw: &str) -> bool {
    let lower = raw.to_ascii_lowercase();
    let rest = lower.strip_prefix("http://").or_else(|| lower.strip_prefix("https://"));
    rest.is_some_and(|r| {
        let authority = r.split(['/', '?', '#']).next().unwrap_or_default();
        let host = authority.rsplit('@').next().unwrap_or_default();
        !host.is_empty() && !host.starts_with(':') && !raw.chars().any(|c| c.is_ascii_control() || c == ' ')
    })
}

/// Why the operator will not fetch the placement's image URL `raw`, if it will not: the URL
/// read by the parser the download uses, its host judged by `hosts` (a name is judged again
/// where it resolves, as the download connects).
fn url_refusal(hosts: &UrlHosts, raw: &str) -> Option<String> {
    // Review L24: credentials in the URL stay out of the message.
    let shown = egress_provider::redact(raw);
    let why = match reqwest::Url::parse(raw) {
        Err(e) => format!("not a URL the download can read ({e})"),
        Ok(url) => hosts.refusal(&url)?,
    };
    Some(format!("placement.image {shown:?}: {why}"))
}

/// Resolves `placement` for `generation`'s block of a validated config.
///
/// # Errors
/// The message of the first field that cannot work (Permanent for the provider).
pub fn resolve<'a>(
    generation: Generation,
    cfg: &'a KvmConfig,
    url_hosts: &UrlHosts,
    placement: &Placement,
) -> Result<Resolved<'a>, String> {
    let block = generation.block();
    let host = if placement.zone.is_empty() {
        match cfg.hosts.as_slice() {
            [only] => only,
            _ => {
                return Err(format!(
                    "placement.zone is required when {block}.hosts lists more than one host"
                ));
            }
        }
    } else {
        cfg.hosts
            .iter()
            .find(|h| h.name == placement.zone)
            .ok_or_else(|| format!("placement.zone {:?} is not in {block}.hosts", placement.zone))?
    };
    let machine = cfg.machine_types.get(&placement.machine_type).ok_or_else(|| {
        format!(
            "placement.machineType {:?} is not in {block}.machineTypes",
            placement.machine_type
        )
    })?;
    let image = match cfg.images.get(&placement.image) {
        Some(image) => Image {
            key: placement.image.clone(),
            url: image.url.clone(),
            sha256: (!image.sha256.is_empty()).then(|| image.sha256.to_ascii_lowercase()),
            format: image.effective_format().to_owned(),
            firmware: image.effective_firmware().to_owned(),
            from_url: false,
        },
        // Review M12: an image URL comes from the Proxy, not the operator's config. It may not
        // send the operator to an internal address (a cloud metadata service, a private or
        // cluster address), nor, where the entry lists the hosts URL images may come from,
        // anywhere else.
        None if is_http_url(&placement.image) => {
            if let Some(refusal) = url_refusal(url_hosts, &placement.image) {
                return Err(refusal);
            }
            Image {
                key: generation.url_key(&placement.image),
                url: placement.image.clone(),
                sha256: None,
                format: "qcow2".to_owned(),
                firmware: "uefi".to_owned(),
                from_url: true,
            }
        }
        None => {
            return Err(format!(
                "placement.image {:?} is neither a key in {block}.images nor an http(s) URL",
                egress_provider::redact(&placement.image)
            ));
        }
    };
    Ok(Resolved {
        host,
        vcpus: machine.vcpus,
        memory_mib: machine.memory_mib,
        image,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::config::{KvmImage, KvmMachineType};

    use super::*;

    fn host(name: &str) -> KvmHost {
        KvmHost {
            name: name.into(),
            address: format!("{name}:22"),
            user: "u".into(),
            bridge: "br0".into(),
            ..KvmHost::default()
        }
    }

    fn config(hosts: &[&str]) -> KvmConfig {
        KvmConfig {
            images: BTreeMap::from([(
                "debian-13".to_owned(),
                KvmImage {
                    url: "https://example.com/debian.qcow2".into(),
                    sha256: "AB".repeat(32),
                    ..KvmImage::default()
                },
            )]),
            machine_types: BTreeMap::from([(
                "small".to_owned(),
                KvmMachineType {
                    vcpus: 1,
                    memory_mib: 1024,
                },
            )]),
            hosts: hosts.iter().map(|h| host(h)).collect(),
            ..KvmConfig::default()
        }
    }

    /// `resolve` with the URL hosts of `cfg`'s `imageUrlHosts`, internal addresses refused.
    fn resolve<'a>(generation: Generation, cfg: &'a KvmConfig, p: &Placement) -> Result<Resolved<'a>, String> {
        let hosts = UrlHosts::for_proxies(cfg.image_url_hosts.as_deref(), egress_netguard::Guard::default());
        super::resolve(generation, cfg, &hosts, p)
    }

    fn placement(zone: &str, machine: &str, image: &str) -> Placement {
        Placement {
            region: "ignored".into(),
            zone: zone.into(),
            machine_type: machine.into(),
            image: image.into(),
        }
    }

    #[test]
    fn a_catalogue_placement_resolves_with_defaults() {
        let cfg = config(&["beelink", "nuc"]);
        let r = resolve(Generation::Kvm2, &cfg, &placement("nuc", "small", "debian-13")).unwrap();
        assert_eq!(r.host.name, "nuc");
        assert_eq!((r.vcpus, r.memory_mib), (1, 1024));
        assert_eq!(r.image.key, "debian-13");
        assert_eq!(r.image.sha256.as_deref(), Some("ab".repeat(32).as_str()));
        assert_eq!((r.image.format.as_str(), r.image.firmware.as_str()), ("qcow2", "uefi"));
    }

    #[test]
    fn an_empty_zone_means_the_only_host_and_a_url_image_is_qcow2_uefi() {
        let cfg = config(&["beelink"]);
        let url = "https://mirror.example.org/img/x.qcow2";
        let r = resolve(Generation::Kvm2, &cfg, &placement("", "small", url)).unwrap();
        assert_eq!(r.host.name, "beelink");
        assert_eq!(r.image.key, crate::names::url_key(url));
        assert_eq!(r.image.url, url);
        assert_eq!(r.image.sha256, None);
        assert_eq!((r.image.format.as_str(), r.image.firmware.as_str()), ("qcow2", "uefi"));
    }

    #[test]
    fn image_url_hosts_turn_url_images_off_or_limit_them() {
        let mut cfg = config(&["nuc"]);
        let url = "https://Mirror.Example/x.qcow2";
        cfg.image_url_hosts = Some(Vec::new());
        assert_eq!(
            resolve(Generation::Kvm, &cfg, &placement("", "small", url)).unwrap_err(),
            "placement.image \"https://Mirror.Example/x.qcow2\": URL images are off for this entry (imageUrlHosts is empty)"
        );
        // The catalogue is the operator's own: not restricted.
        assert!(resolve(Generation::Kvm, &cfg, &placement("", "small", "debian-13")).is_ok());

        cfg.image_url_hosts = Some(vec!["mirror.example".into(), "10.0.0.5".into(), "fd00::5".into()]);
        for listed in [url, "http://10.0.0.5:8080/x.qcow2", "http://[fd00::5]/x.qcow2"] {
            let r = resolve(Generation::Kvm2, &cfg, &placement("", "small", listed)).unwrap();
            assert_eq!(r.image.url, listed);
        }
        for (unlisted, shown, host) in [
            (
                "https://mirror.example.org/x.qcow2",
                "https://mirror.example.org/x.qcow2",
                "mirror.example.org",
            ),
            (
                "http://user:pw@10.0.0.6/x.qcow2",
                "http://user:[REDACTED]@10.0.0.6/x.qcow2",
                "10.0.0.6",
            ),
            (
                "http://169.254.169.254/x.qcow2",
                "http://169.254.169.254/x.qcow2",
                "169.254.169.254",
            ),
        ] {
            assert_eq!(
                resolve(Generation::Kvm2, &cfg, &placement("", "small", unlisted)).unwrap_err(),
                format!("placement.image {shown:?}: host {host} is not in imageUrlHosts")
            );
        }
    }

    #[test]
    fn what_cannot_work_is_named() {
        let two = config(&["beelink", "nuc"]);
        for (p, want) in [
            (
                placement("", "small", "debian-13"),
                "placement.zone is required when kvm2.hosts lists more than one host",
            ),
            (
                placement("pi", "small", "debian-13"),
                "placement.zone \"pi\" is not in kvm2.hosts",
            ),
            (
                placement("nuc", "huge", "debian-13"),
                "placement.machineType \"huge\" is not in kvm2.machineTypes",
            ),
            (
                placement("nuc", "small", "windows"),
                "placement.image \"windows\" is neither a key in kvm2.images nor an http(s) URL",
            ),
            (
                placement("nuc", "small", "ftp://example.com/x.qcow2"),
                "placement.image \"ftp://example.com/x.qcow2\" is neither a key in kvm2.images nor an http(s) URL",
            ),
            (
                placement("nuc", "small", "http://169.254.169.254/latest/meta-data/x.qcow2"),
                "placement.image \"http://169.254.169.254/latest/meta-data/x.qcow2\": host 169.254.169.254 is a link-local address; list it in imageUrlHosts to fetch from it",
            ),
            (
                placement("nuc", "small", "http://[fe80::1]:80/x.qcow2"),
                "placement.image \"http://[fe80::1]:80/x.qcow2\": host [fe80::1] is a link-local address; list it in imageUrlHosts to fetch from it",
            ),
            (
                placement("nuc", "small", "https:///x.qcow2"),
                "placement.image \"https:///x.qcow2\" is neither a key in kvm2.images nor an http(s) URL",
            ),
            (
                placement("nuc", "small", "http://mirror.default.svc/x.qcow2"),
                "placement.image \"http://mirror.default.svc/x.qcow2\": host mirror.default.svc is a cluster name (a Service, a Pod, or a name without a dot); list it in imageUrlHosts to fetch from it",
            ),
        ] {
            assert_eq!(resolve(Generation::Kvm2, &two, &p).unwrap_err(), want);
        }
    }
}
