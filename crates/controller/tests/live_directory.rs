//! The live discovery directory against one built from nothing: after any sequence of Proxy and
//! credentials Secret changes (applied, deleted, re-listed), the directory the watches keep up
//! to date holds exactly what a full rebuild of the two stores gives, in both orders.

use std::collections::BTreeMap;
use std::sync::Arc;

use egress_api::{
    ANNOTATION_CREDENTIALS_INSTANCE, ANNOTATION_CREDENTIALS_PROXIES, Condition, ConditionStatus, Credentials,
    CredentialsSecretRef, CredentialsType, Endpoint, LABEL_POOL, LABEL_POOL_ROLE, LABEL_PROXY_CREDENTIALS, Mode,
    PROXY_CREDENTIALS_GENERATED, Proxy, ProxySpec, ProxyStatus,
};
use egress_controller::discovery::{LiveDirectory, built};
use egress_controller::proxy::credentials::{CredentialCache, secret_name};
use egress_discovery::{Fleet, ProxyDirectory};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::Event;
use proptest::prelude::*;

const NAMESPACES: [&str; 2] = ["crawl", "other"];

/// A Proxy, as few fields as the directory reads, each with a small range so that sequences
/// collide on names, Secrets and orders.
#[derive(Debug, Clone)]
struct ProxyShape {
    ns: usize,
    name: u8,
    latency: i64,
    /// `None`: no verdict yet.
    healthy: Option<bool>,
    /// 0 none, 1 generated, 2 and 3 a user Secret (`vendor-0`, `vendor-1`), 4 a Secret type
    /// naming none.
    credentials: u8,
    instance: u8,
    deleting: bool,
    external: bool,
    geo: u8,
    /// 0 no pool, 1 active, 2 standby, 3 draining.
    role: u8,
    max_leases: i32,
}

/// A credentials Secret: a Proxy's generated one, or a user's.
#[derive(Debug, Clone)]
enum SecretShape {
    Generated {
        ns: usize,
        proxy: u8,
        /// `None`: not bound to an instance yet.
        instance: Option<u8>,
        complete: bool,
    },
    User {
        ns: usize,
        k: u8,
        /// Labelled as an operator-generated one (never handed to a user's Proxy).
        generated_label: bool,
        password: u8,
        /// The Proxies it names (`crawl.example.com/proxies`): 0 no annotation, 1 every name
        /// the shapes use, 2 two of them, 3 a list the operator refuses.
        names: u8,
    },
}

#[derive(Debug, Clone)]
enum Op {
    ApplyProxy(ProxyShape),
    DeleteProxy(usize, u8),
    ApplySecret(SecretShape),
    DeleteSecret(SecretShape),
    RelistProxies(Vec<ProxyShape>),
    RelistSecrets(Vec<SecretShape>),
}

fn uid(ns: usize, name: u8) -> String {
    format!("uid-{ns}-{name}")
}

fn proxy(s: &ProxyShape) -> Proxy {
    let credentials = match s.credentials {
        0 => None,
        1 => Some(Credentials {
            type_: CredentialsType::Generated,
            secret_ref: None,
        }),
        2 | 3 => Some(Credentials {
            type_: CredentialsType::Secret,
            secret_ref: Some(CredentialsSecretRef {
                name: format!("vendor-{}", s.credentials - 2),
            }),
        }),
        _ => Some(Credentials {
            type_: CredentialsType::Secret,
            secret_ref: None,
        }),
    };
    let mut p = Proxy::new(
        &format!("p{}", s.name),
        ProxySpec {
            mode: if s.external { Mode::External } else { Mode::Managed },
            endpoint: s.external.then(|| Endpoint {
                host: format!("vendor{}.example", s.name),
                port: None,
            }),
            attributes: BTreeMap::from([("geo".to_owned(), format!("g{}", s.geo))]),
            max_leases: Some(s.max_leases),
            credentials,
            ..Default::default()
        },
    );
    p.metadata.namespace = Some(NAMESPACES[s.ns].into());
    p.metadata.uid = Some(uid(s.ns, s.name));
    if s.deleting {
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    }
    if s.role > 0 {
        let pool = "pool-a".to_owned();
        let role = ["active", "standby", "draining"][usize::from(s.role - 1)];
        p.metadata.labels = Some(BTreeMap::from([
            (LABEL_POOL.to_owned(), pool.clone()),
            (LABEL_POOL_ROLE.to_owned(), role.to_owned()),
        ]));
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: egress_api::API_VERSION.into(),
            kind: "ProxyPool".into(),
            name: pool,
            uid: "pool-uid".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
    }
    p.status = Some(ProxyStatus {
        ip: format!("10.0.0.{}", s.name),
        provider_id: format!("instance-{}", s.instance),
        latency_millis: Some(s.latency),
        conditions: s
            .healthy
            .map(|healthy| Condition {
                type_: "Healthy".into(),
                status: if healthy {
                    ConditionStatus::True
                } else {
                    ConditionStatus::False
                },
                observed_generation: None,
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                reason: "Probe".into(),
                message: String::new(),
            })
            .into_iter()
            .collect(),
        ..Default::default()
    });
    p
}

fn secret(s: &SecretShape) -> Secret {
    let data = |user: &str, password: String, complete: bool| {
        let mut data = BTreeMap::from([("username".to_owned(), ByteString(user.as_bytes().to_vec()))]);
        if complete {
            data.insert("password".to_owned(), ByteString(password.into_bytes()));
        }
        Some(data)
    };
    match s {
        SecretShape::Generated {
            ns,
            proxy,
            instance,
            complete,
        } => Secret {
            metadata: ObjectMeta {
                name: Some(secret_name(&uid(*ns, *proxy))),
                namespace: Some(NAMESPACES[*ns].into()),
                labels: Some(BTreeMap::from([(
                    LABEL_PROXY_CREDENTIALS.to_owned(),
                    PROXY_CREDENTIALS_GENERATED.to_owned(),
                )])),
                annotations: instance
                    .map(|i| BTreeMap::from([(ANNOTATION_CREDENTIALS_INSTANCE.to_owned(), format!("instance-{i}"))])),
                owner_references: Some(vec![OwnerReference {
                    api_version: egress_api::API_VERSION.into(),
                    kind: "Proxy".into(),
                    name: format!("p{proxy}"),
                    uid: uid(*ns, *proxy),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            data: data("generated", format!("pw-{proxy}"), *complete),
            ..Default::default()
        },
        SecretShape::User {
            ns,
            k,
            generated_label,
            password,
            names,
        } => Secret {
            metadata: ObjectMeta {
                name: Some(format!("vendor-{k}")),
                namespace: Some(NAMESPACES[*ns].into()),
                labels: Some(BTreeMap::from([(
                    LABEL_PROXY_CREDENTIALS.to_owned(),
                    if *generated_label {
                        PROXY_CREDENTIALS_GENERATED
                    } else {
                        "user"
                    }
                    .to_owned(),
                )])),
                annotations: match names {
                    0 => None,
                    1 => Some("p0,p1,p2,p3,p4"),
                    2 => Some(" p1 , p3 "),
                    _ => Some("p1,Not_A_Name"),
                }
                .map(|v| BTreeMap::from([(ANNOTATION_CREDENTIALS_PROXIES.to_owned(), v.to_owned())])),
                ..Default::default()
            },
            data: data("vendor", format!("secret-{password}"), true),
            ..Default::default()
        },
    }
}

fn proxy_shape() -> impl Strategy<Value = ProxyShape> {
    (
        (0..2usize, 0..5u8, 0..3i64, prop::option::of(any::<bool>())),
        (0..5u8, 0..2u8, prop::bool::weighted(0.15), any::<bool>()),
        (0..2u8, 0..4u8, 0..3i32),
    )
        .prop_map(
            |((ns, name, latency, healthy), (credentials, instance, deleting, external), (geo, role, max_leases))| {
                ProxyShape {
                    ns,
                    name,
                    latency,
                    healthy,
                    credentials,
                    instance,
                    deleting,
                    external,
                    geo,
                    role,
                    max_leases,
                }
            },
        )
}

fn secret_shape() -> impl Strategy<Value = SecretShape> {
    prop_oneof![
        (0..2usize, 0..5u8, prop::option::of(0..2u8), any::<bool>()).prop_map(|(ns, proxy, instance, complete)| {
            SecretShape::Generated {
                ns,
                proxy,
                instance,
                complete,
            }
        }),
        (0..2usize, 0..2u8, prop::bool::weighted(0.2), 0..3u8, 0..4u8).prop_map(
            |(ns, k, generated_label, password, names)| SecretShape::User {
                ns,
                k,
                generated_label,
                password,
                names,
            }
        ),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proxy_shape().prop_map(Op::ApplyProxy),
        2 => (0..2usize, 0..5u8).prop_map(|(ns, name)| Op::DeleteProxy(ns, name)),
        4 => secret_shape().prop_map(Op::ApplySecret),
        1 => secret_shape().prop_map(Op::DeleteSecret),
        1 => prop::collection::vec(proxy_shape(), 0..6).prop_map(Op::RelistProxies),
        1 => prop::collection::vec(secret_shape(), 0..4).prop_map(Op::RelistSecrets),
    ]
}

/// The two stores, fed as the reflectors feed them, and the directory told of each event as
/// the caches' observers tell it.
struct World {
    proxies: Writer<Proxy>,
    secrets: Writer<Secret>,
    credentials: CredentialCache,
    proxy_store: reflector::Store<Proxy>,
    directory: Arc<LiveDirectory>,
}

impl World {
    fn new() -> Self {
        let (proxy_store, proxies) = reflector::store();
        let (secret_store, secrets) = reflector::store();
        let credentials = CredentialCache::from_store(secret_store);
        let directory = LiveDirectory::over(
            proxy_store.clone(),
            credentials.clone(),
            egress_discovery::IndexedKeys::default(),
            egress_controller::exit_policy::ExitPolicy::Observe,
        );
        Self {
            proxies,
            secrets,
            credentials,
            proxy_store,
            directory,
        }
    }

    fn proxy_event(&mut self, event: Event<Proxy>) {
        self.proxies.apply_watcher_event(&event);
        self.directory.on_proxy_event(&event);
    }

    fn secret_event(&mut self, event: Event<Secret>) {
        self.secrets.apply_watcher_event(&event);
        self.directory.on_secret_event(&event);
    }

    fn run(&mut self, op: &Op) {
        match op {
            Op::ApplyProxy(s) => self.proxy_event(Event::Apply(proxy(s))),
            Op::DeleteProxy(ns, name) => {
                let gone = self
                    .proxy_store
                    .state()
                    .into_iter()
                    .find(|p| p.metadata.uid.as_deref() == Some(uid(*ns, *name).as_str()));
                if let Some(gone) = gone {
                    self.proxy_event(Event::Delete(gone.as_ref().clone()));
                }
            }
            Op::ApplySecret(s) => self.secret_event(Event::Apply(secret(s))),
            Op::DeleteSecret(s) => self.secret_event(Event::Delete(secret(s))),
            Op::RelistProxies(all) => {
                self.proxy_event(Event::Init);
                for s in all {
                    self.proxy_event(Event::InitApply(proxy(s)));
                }
                self.proxy_event(Event::InitDone);
            }
            Op::RelistSecrets(all) => {
                self.secret_event(Event::Init);
                for s in all {
                    self.secret_event(Event::InitApply(secret(s)));
                }
                self.secret_event(Event::InitDone);
            }
        }
    }

    fn rebuilt(&self) -> Fleet {
        built(
            &self.proxy_store,
            &self.credentials,
            &egress_discovery::IndexedKeys::default(),
            egress_controller::exit_policy::ExitPolicy::Observe,
        )
    }
}

fn ids<'a>(it: impl Iterator<Item = &'a egress_discovery::ProxyInfo>) -> Vec<(i64, String)> {
    it.map(|p| (p.latency_millis, p.id.clone())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_live_directory_always_equals_one_built_from_nothing(ops in prop::collection::vec(op(), 1..40)) {
        let mut world = World::new();
        for (step, op) in ops.iter().enumerate() {
            world.run(op);
            let live = world.directory.proxies().expect("a snapshot");
            let rebuilt = world.rebuilt();
            prop_assert_eq!(
                ids(live.in_lease_order()),
                ids(rebuilt.in_lease_order()),
                "lease order after step {} ({:?})", step, op
            );
            prop_assert!(*live == rebuilt, "contents after step {} ({:?})", step, op);
        }
    }
}

#[test]
fn a_snapshot_taken_stays_as_it_was_and_an_unchanged_write_publishes_nothing() {
    let mut world = World::new();
    let shape = ProxyShape {
        ns: 0,
        name: 1,
        latency: 5,
        healthy: Some(true),
        credentials: 0,
        instance: 0,
        deleting: false,
        external: false,
        geo: 0,
        role: 0,
        max_leases: 1,
    };
    world.run(&Op::ApplyProxy(shape.clone()));
    let before = world.directory.proxies().unwrap();
    // A status write that changes nothing the API shows (a condition's time).
    let mut same = proxy(&shape);
    same.status.as_mut().unwrap().conditions[0].last_transition_time =
        Time(k8s_openapi::jiff::Timestamp::from_second(60).unwrap());
    world.proxy_event(Event::Apply(same));
    assert!(Arc::ptr_eq(&before, &world.directory.proxies().unwrap()));
    world.run(&Op::ApplyProxy(ProxyShape {
        healthy: Some(false),
        ..shape
    }));
    assert!(before.get("crawl/p1").unwrap().healthy, "the old snapshot is untouched");
    assert!(!world.directory.proxies().unwrap().get("crawl/p1").unwrap().healthy);
}
