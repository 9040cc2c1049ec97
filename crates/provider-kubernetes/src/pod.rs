//! The Pod of one proxy (spec/providers.md §4.5), built by a pure function: Squid with the
//! generated config passed in `SQUID_CONF`, the GC marks as labels, owned by its Proxy, and able
//! to run under the `restricted` Pod Security Standard. A Proxy with credentials gets the
//! htpasswd key of its credentials Secret mounted read-only (the password never enters the Pod).
//! The Pods of one spread group (a pool's members) are spread over nodes, since each node is
//! one exit address.

use std::collections::BTreeMap;

use egress_provider::{CreateRequest, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_MANAGED_YES, LABEL_UID};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, KeyToPath, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, TopologySpreadConstraint, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use crate::squid::{AccessRules, CREDENTIALS_DIR, SquidFiles, squid_conf};

/// The Squid image when none is configured.
pub const DEFAULT_IMAGE: &str = "ubuntu/squid:6.6-24.04_edge";
/// The container's name.
pub const CONTAINER: &str = "squid";
/// The user Squid runs as: `proxy` in Debian and Ubuntu images (not root).
pub const SQUID_UID: i64 = 13;
/// Where the config is written; the root filesystem is read-only.
pub const CONFIG_PATH: &str = "/tmp/squid.conf";
/// The writable places Squid needs, each an `emptyDir`.
pub const SCRATCH: [(&str, &str); 3] = [("tmp", "/tmp"), ("spool", "/var/spool/squid"), ("run", "/run/squid")];
/// The Proxy custom resource, for the owner reference.
pub const PROXY_API_VERSION: &str = "crawl.example.com/v1alpha1";
/// The Proxy kind.
pub const PROXY_KIND: &str = "Proxy";
/// The name of that volume.
pub const CREDENTIALS_VOLUME: &str = "credentials";
/// The label naming a Pod's spread group ([`CreateRequest::spread_group`]): the Pods of one
/// group are spread over nodes.
pub const LABEL_SPREAD_GROUP: &str = "proxy-operator-spread-group";
/// What the Pods of a group are spread over: nodes, so that each group's Pods leave from as
/// many node addresses as the cluster has (a cluster masquerades Pod traffic as its node's).
pub const SPREAD_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// What the Pod is made of beside the request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSettings {
    /// The one namespace Pods may be placed in (`kubernetes.namespace`); `None`: any.
    pub namespace: Option<String>,
    /// The Squid image ([`DEFAULT_IMAGE`] when `None`).
    pub image: Option<String>,
    /// Requests and limits for the container.
    pub resources: Option<ResourceRequirements>,
    /// What Squid lets through (`kubernetes.access` with defaults).
    pub access: AccessRules,
}

/// Requests and limits from the config's quantities (validated at load).
pub fn requirements(requests: &BTreeMap<String, String>, limits: &BTreeMap<String, String>) -> ResourceRequirements {
    let quantities = |m: &BTreeMap<String, String>| {
        (!m.is_empty()).then(|| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone()),
                    )
                })
                .collect()
        })
    };
    ResourceRequirements {
        requests: quantities(requests),
        limits: quantities(limits),
        ..ResourceRequirements::default()
    }
}

/// The Pod of `req`. Labels carry the managed mark, the UID and (when set) the installation;
/// the Proxy owns the Pod (not blocking its deletion), so a Pod whose Proxy is gone without its
/// finalizer is still collected.
pub fn build_pod(req: &CreateRequest, settings: &PodSettings) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(req.name.clone()),
            namespace: Some(req.namespace.clone()),
            labels: Some(marks(req)),
            owner_references: owner(req),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![squid_container(req, settings)],
            // Squid never calls the API: a token in the Pod would only be there to be stolen
            // through it.
            automount_service_account_token: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            volumes: Some(volumes(req)),
            topology_spread_constraints: spread(req),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// The GC marks as labels: managed, the UID, and the installation when there is one.
fn marks(req: &CreateRequest) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (LABEL_MANAGED.to_owned(), LABEL_MANAGED_YES.to_owned()),
        (LABEL_UID.to_owned(), req.uid.clone()),
    ]);
    if let Some(installation) = &req.installation {
        labels.insert(LABEL_INSTALLATION.to_owned(), installation.clone());
    }
    if let Some(group) = &req.spread_group {
        labels.insert(LABEL_SPREAD_GROUP.to_owned(), group.clone());
    }
    labels
}

/// For a Pod in a spread group: at most one more of the group's Pods on any node than on
/// another, as a preference (`ScheduleAnyway`), so a Pod still runs when nodes are too few.
fn spread(req: &CreateRequest) -> Option<Vec<TopologySpreadConstraint>> {
    let group = req.spread_group.as_ref()?;
    Some(vec![TopologySpreadConstraint {
        max_skew: 1,
        topology_key: SPREAD_TOPOLOGY_KEY.to_owned(),
        when_unsatisfiable: "ScheduleAnyway".to_owned(),
        label_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(LABEL_SPREAD_GROUP.to_owned(), group.clone())])),
            ..LabelSelector::default()
        }),
        ..TopologySpreadConstraint::default()
    }])
}

/// Whether `value` may be a label value: at most 63 characters, letters, digits, `-`, `_` and
/// `.`, beginning and ending with a letter or digit (or empty).
pub fn is_label_value(value: &str) -> bool {
    let edge = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edge(value.chars().next())
        && edge(value.chars().last())
}

/// The Proxy as the Pod's controller (not blocking its deletion); none without a Proxy to name.
fn owner(req: &CreateRequest) -> Option<Vec<OwnerReference>> {
    (!req.proxy_name.is_empty() && !req.uid.is_empty()).then(|| {
        vec![OwnerReference {
            api_version: PROXY_API_VERSION.to_owned(),
            kind: PROXY_KIND.to_owned(),
            name: req.proxy_name.clone(),
            uid: req.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(false),
        }]
    })
}

/// Squid, started on the config passed in `SQUID_CONF`, as a non-root user on a read-only root.
fn squid_container(req: &CreateRequest, settings: &PodSettings) -> Container {
    Container {
        name: CONTAINER.to_owned(),
        image: Some(settings.image.clone().unwrap_or_else(|| DEFAULT_IMAGE.to_owned())),
        command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned()]),
        args: Some(vec![format!(
            "printf '%s\\n' \"$SQUID_CONF\" > {CONFIG_PATH} && exec squid -N -f {CONFIG_PATH}"
        )]),
        env: Some(vec![EnvVar {
            name: "SQUID_CONF".to_owned(),
            value: Some(squid_conf(
                req.port,
                &settings.access,
                req.credentials.is_some(),
                &SquidFiles::pod(),
            )),
            ..EnvVar::default()
        }]),
        ports: Some(vec![ContainerPort {
            container_port: i32::from(req.port),
            name: Some("proxy".to_owned()),
            ..ContainerPort::default()
        }]),
        resources: settings.resources.clone(),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(SQUID_UID),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(volume_mounts(req)),
        ..Container::default()
    }
}

/// The scratch places, and the credentials read-only when the Proxy has some.
fn volume_mounts(req: &CreateRequest) -> Vec<VolumeMount> {
    SCRATCH
        .iter()
        .map(|(name, path)| VolumeMount {
            name: (*name).to_owned(),
            mount_path: (*path).to_owned(),
            ..VolumeMount::default()
        })
        .chain(req.credentials.as_ref().map(|_| VolumeMount {
            name: CREDENTIALS_VOLUME.to_owned(),
            mount_path: CREDENTIALS_DIR.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        }))
        .collect()
}

/// An `emptyDir` per scratch place, and the credentials Secret's htpasswd key when the Proxy
/// has credentials.
fn volumes(req: &CreateRequest) -> Vec<Volume> {
    SCRATCH
        .iter()
        .map(|(name, _)| Volume {
            name: (*name).to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        })
        .chain(req.credentials.as_ref().map(|c| Volume {
            name: CREDENTIALS_VOLUME.to_owned(),
            // Only the salted hash: the password stays in the Secret.
            secret: Some(SecretVolumeSource {
                secret_name: Some(c.secret_name.clone()),
                items: Some(vec![KeyToPath {
                    key: egress_credentials::HTPASSWD_KEY.to_owned(),
                    path: egress_credentials::HTPASSWD_KEY.to_owned(),
                    mode: None,
                }]),
                default_mode: Some(0o444),
                optional: Some(false),
            }),
            ..Volume::default()
        }))
        .collect()
}

#[cfg(test)]
mod tests {
    use egress_provider::Placement;

    use super::*;

    fn req() -> CreateRequest {
        CreateRequest {
            name: "proxy-abcdefghijklmnop".into(),
            uid: "4f9a6c1e-0b7d-4d2a-9e55-1c2b3d4e5f60".into(),
            namespace: "crawl".into(),
            proxy_name: "eu-1".into(),
            placement: Placement::default(),
            cloud_init: b"#cloud-config SECRET".to_vec(),
            port: 3130,
            installation: Some("prod".into()),
            credentials: None,
            spread_group: None,
        }
    }

    #[test]
    fn the_pod_carries_the_marks_the_config_and_its_owner() {
        let pod = build_pod(&req(), &PodSettings::default());
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("proxy-abcdefghijklmnop"));
        assert_eq!(meta.namespace.as_deref(), Some("crawl"));
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_MANAGED], "true");
        assert_eq!(labels[LABEL_UID], "4f9a6c1e-0b7d-4d2a-9e55-1c2b3d4e5f60");
        assert_eq!(labels[LABEL_INSTALLATION], "prod");
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Proxy", "eu-1", "4f9a6c1e-0b7d-4d2a-9e55-1c2b3d4e5f60")
        );
        assert_eq!(owner.block_owner_deletion, Some(false));
        assert_eq!(
            (owner.api_version.as_str(), owner.controller),
            ("crawl.example.com/v1alpha1", Some(true))
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.containers.len(), 1);
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some(DEFAULT_IMAGE));
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 3130);
        let env = &c.env.as_ref().unwrap()[0];
        assert_eq!(env.name, "SQUID_CONF");
        assert_eq!(
            env.value.as_deref(),
            Some(squid_conf(3130, &AccessRules::default(), false, &SquidFiles::pod()).as_str())
        );
        // No credentials: no Secret mounted.
        assert!(!format!("{:?}", spec.volumes).contains("credentials"));
        // Cloud-init has no meaning for a Pod and goes nowhere in it.
        assert!(!format!("{pod:?}").contains("SECRET"));
    }

    #[test]
    fn a_pod_in_a_spread_group_is_spread_over_nodes_as_a_preference() {
        assert_eq!(
            build_pod(&req(), &PodSettings::default())
                .spec
                .unwrap()
                .topology_spread_constraints,
            None
        );
        let grouped = CreateRequest {
            spread_group: Some("7d1e2f40-pool-uid".into()),
            ..req()
        };
        let pod = build_pod(&grouped, &PodSettings::default());
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()[LABEL_SPREAD_GROUP],
            "7d1e2f40-pool-uid"
        );
        let spread = pod.spec.unwrap().topology_spread_constraints.unwrap();
        assert_eq!(spread.len(), 1);
        let c = &spread[0];
        assert_eq!(
            (c.max_skew, c.topology_key.as_str(), c.when_unsatisfiable.as_str()),
            (1, "kubernetes.io/hostname", "ScheduleAnyway")
        );
        let selector = c.label_selector.as_ref().unwrap();
        assert_eq!(
            selector.match_labels.as_ref().unwrap(),
            &BTreeMap::from([(LABEL_SPREAD_GROUP.to_owned(), "7d1e2f40-pool-uid".to_owned())])
        );
        assert_eq!(selector.match_expressions, None);
    }

    #[test]
    fn label_values_are_told_apart() {
        for ok in [
            "",
            "a",
            "7d1e2f40-0b7d-4d2a-9e55-1c2b3d4e5f60",
            "a.b_c-d",
            &"x".repeat(63),
        ] {
            assert!(is_label_value(ok), "{ok:?}");
        }
        for bad in ["-a", "a-", "a b", "a/b", "ü", &"x".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_pod_runs_under_the_restricted_standard() {
        let pod = build_pod(&req(), &PodSettings::default());
        let spec = pod.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(SQUID_UID));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
        assert_eq!(
            spec.automount_service_account_token,
            Some(false),
            "no API token in the Pod"
        );
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(psc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        assert_eq!(psc.run_as_non_root, Some(true));
        // The config goes where a read-only root still lets it.
        let mounts: Vec<&str> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, ["/tmp", "/var/spool/squid", "/run/squid"]);
        let volumes: Vec<_> = spec.volumes.as_ref().unwrap().iter().map(|v| v.name.as_str()).collect();
        assert_eq!(volumes, ["tmp", "spool", "run"]);
        assert!(spec.volumes.as_ref().unwrap().iter().all(|v| v.empty_dir.is_some()));
        // The script writes the config where a read-only root still lets it, then runs Squid on it.
        let script = &c.args.as_ref().unwrap()[0];
        assert!(CONFIG_PATH.starts_with("/tmp/"));
        assert!(script.contains("\"$SQUID_CONF\" > /tmp/squid.conf"), "{script}");
        assert!(script.contains("exec squid -N -f /tmp/squid.conf"), "{script}");
    }

    #[test]
    fn configured_quantities_become_requests_and_limits() {
        let r = requirements(
            &BTreeMap::from([("cpu".to_owned(), "100m".to_owned())]),
            &BTreeMap::from([("memory".to_owned(), "64Mi".to_owned())]),
        );
        assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "100m");
        assert_eq!(r.limits.as_ref().unwrap()["memory"].0, "64Mi");
        let none = requirements(&BTreeMap::new(), &BTreeMap::new());
        assert!(none.requests.is_none() && none.limits.is_none());
    }

    #[test]
    fn settings_choose_the_image_and_resources_and_no_owner_without_a_proxy() {
        let resources = ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Mi".into()),
            )])),
            ..ResourceRequirements::default()
        };
        let settings = PodSettings {
            namespace: None,
            image: Some("registry.local/squid:6".into()),
            resources: Some(resources.clone()),
            access: AccessRules::default(),
        };
        let mut r = req();
        r.proxy_name.clear();
        r.installation = None;
        let pod = build_pod(&r, &settings);
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.local/squid:6"));
        assert_eq!(c.resources.as_ref(), Some(&resources));
        assert!(pod.metadata.owner_references.is_none());
        assert!(!pod.metadata.labels.as_ref().unwrap().contains_key(LABEL_INSTALLATION));
    }

    #[test]
    fn credentials_mount_only_the_htpasswd_key_read_only() {
        let mut r = req();
        r.credentials = Some(egress_provider::ProxyCredentials::new(
            egress_provider::Credentials::new("u1", "SENTINEL-password").unwrap(),
            "proxy-abcdefghijklmnop-credentials",
        ));
        let pod = build_pod(&r, &PodSettings::default());
        let spec = pod.spec.as_ref().unwrap();
        let volume = spec
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == CREDENTIALS_VOLUME)
            .unwrap();
        let secret = volume.secret.as_ref().unwrap();
        assert_eq!(
            secret.secret_name.as_deref(),
            Some("proxy-abcdefghijklmnop-credentials")
        );
        let items = secret.items.as_ref().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("htpasswd", "htpasswd")
        );
        let c = &spec.containers[0];
        let mount = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == CREDENTIALS_VOLUME)
            .unwrap();
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (CREDENTIALS_DIR, Some(true))
        );
        let conf = c.env.as_ref().unwrap()[0].value.as_deref().unwrap();
        assert!(conf.contains("http_access deny !egress_user"), "{conf}");
        // Neither the password nor its hash is anywhere in the Pod.
        let shown = serde_json::to_string(&pod).unwrap();
        assert!(!shown.contains("SENTINEL"));
        assert!(!shown.contains("$6$"));
    }
}
