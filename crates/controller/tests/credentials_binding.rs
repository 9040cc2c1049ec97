//! A user's credentials Secret serves only the Proxies it names (`crawl.example.com/proxies`):
//! an External Proxy that names another team's Secret gets nothing from it. Neither the health
//! probe nor the discovery directory, the two readers of the credential cache, ever holds the
//! credentials of such a Proxy, and neither offers it; once the Secret names it, both do, with
//! nothing restarted.

use std::collections::BTreeMap;

use egress_api::{
    ANNOTATION_CREDENTIALS_PROXIES, Condition, ConditionStatus, Credentials, CredentialsSecretRef, CredentialsType,
    Endpoint, LABEL_PROXY_CREDENTIALS, Mode, Proxy, ProxySpec, ProxyStatus,
};
use egress_controller::discovery::LiveDirectory;
use egress_controller::proxy::credentials::{CredentialCache, Lookup};
use egress_discovery::ProxyDirectory;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::reflector;
use kube::runtime::watcher::Event;

const PASSWORD: &str = "SENTINEL-team-b-vendor-password";

/// Team B's vendor login, labelled as today, naming `proxies` (`None`: no annotation).
fn vendor_secret(proxies: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("team-b-vendor".into()),
            namespace: Some("crawl".into()),
            labels: Some(BTreeMap::from([(
                LABEL_PROXY_CREDENTIALS.to_owned(),
                "true".to_owned(),
            )])),
            annotations: proxies.map(|v| BTreeMap::from([(ANNOTATION_CREDENTIALS_PROXIES.to_owned(), v.to_owned())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("username".to_owned(), ByteString(b"team-b".to_vec())),
            ("password".to_owned(), ByteString(PASSWORD.as_bytes().to_vec())),
        ])),
        ..Secret::default()
    }
}

/// An External Proxy at a host of its author's, naming that Secret, with a passing verdict on
/// record (so only the refusal can keep it from being offered).
fn external(name: &str) -> Proxy {
    let mut p = Proxy::new(
        name,
        ProxySpec {
            mode: Mode::External,
            endpoint: Some(Endpoint {
                host: "attacker.example".into(),
                port: Some(8080),
            }),
            credentials: Some(Credentials {
                type_: CredentialsType::Secret,
                secret_ref: Some(CredentialsSecretRef {
                    name: "team-b-vendor".into(),
                }),
            }),
            ..Default::default()
        },
    );
    p.metadata.namespace = Some("crawl".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.status = Some(ProxyStatus {
        conditions: vec![Condition {
            type_: "Healthy".into(),
            status: ConditionStatus::True,
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            reason: "ProbeSucceeded".into(),
            message: String::new(),
        }],
        ..Default::default()
    });
    p
}

#[test]
fn neither_the_probe_nor_the_directory_gets_the_credentials_of_a_proxy_its_secret_does_not_name() {
    let (proxy_store, mut proxies) = reflector::store::<Proxy>();
    let (secret_store, mut secrets) = reflector::store::<Secret>();
    let credentials = CredentialCache::from_store(secret_store);
    let directory = LiveDirectory::over(
        proxy_store.clone(),
        credentials.clone(),
        egress_discovery::IndexedKeys::default(),
        egress_controller::exit_policy::ExitPolicy::Observe,
    );
    let apply_proxy = |proxies: &mut reflector::store::Writer<Proxy>, p: Proxy| {
        let event = Event::Apply(p);
        proxies.apply_watcher_event(&event);
        directory.on_proxy_event(&event);
    };
    let apply_secret = |secrets: &mut reflector::store::Writer<Secret>, s: Secret| {
        let event = Event::Apply(s);
        secrets.apply_watcher_event(&event);
        directory.on_secret_event(&event);
    };
    apply_secret(&mut secrets, vendor_secret(Some("team-b-1")));
    apply_proxy(&mut proxies, external("team-b-1"));
    apply_proxy(&mut proxies, external("intruder"));

    // What the health engine probes (as `CachedProxies` builds it) and what the directory
    // offers, for every Proxy in the store.
    let probed = || {
        proxy_store
            .state()
            .iter()
            .filter_map(|p| egress_controller::proxy::health::view(p, "https://target.test/204", credentials.lookup(p)))
            .map(|v| (v.key.name.clone(), v))
            .collect::<BTreeMap<_, _>>()
    };
    let sentinel = |what: &str, text: String| assert!(!text.contains(PASSWORD), "the password in {what}: {text}");

    // The Proxy the Secret names is served as before.
    let seen = probed();
    let owner = &seen["team-b-1"];
    assert_eq!(owner.host, "attacker.example");
    assert_eq!(
        owner.settings.credentials.as_ref().map(|c| c.password()),
        Some(PASSWORD)
    );
    let fleet = directory.proxies().unwrap();
    let listed = fleet.get("crawl/team-b-1").unwrap();
    assert!(listed.offered && listed.healthy);
    assert_eq!(listed.credentials.as_ref().map(|c| c.password()), Some(PASSWORD));

    // The one it does not name: not probed at all (no host), no credentials, not offered.
    let intruder = &seen["intruder"];
    assert_eq!(
        (intruder.host.as_str(), &intruder.settings.credentials),
        ("", &None),
        "the probe would dial it with the login"
    );
    sentinel("the probe", format!("{intruder:?}"));
    let listed = fleet.get("crawl/intruder").unwrap();
    assert_eq!(
        (listed.offered, listed.healthy, &listed.credentials),
        (false, false, &None)
    );
    sentinel("the directory", format!("{listed:?}"));
    assert!(matches!(credentials.lookup(&external("intruder")), Lookup::Refused(_)));

    // The Secret's owner adds it (an annotation-only change): both readers follow at once.
    apply_secret(&mut secrets, vendor_secret(Some("team-b-1, intruder")));
    let intruder = &probed()["intruder"];
    assert_eq!(intruder.host, "attacker.example");
    assert_eq!(
        intruder.settings.credentials.as_ref().map(|c| c.password()),
        Some(PASSWORD)
    );
    let fleet = directory.proxies().unwrap();
    let listed = fleet.get("crawl/intruder").unwrap();
    assert!(listed.offered && listed.healthy);
    assert_eq!(listed.credentials.as_ref().map(|c| c.password()), Some(PASSWORD));

    // And takes it away again; without the annotation at all, the Secret serves no one.
    apply_secret(&mut secrets, vendor_secret(None));
    let seen = probed();
    let fleet = directory.proxies().unwrap();
    for name in ["team-b-1", "intruder"] {
        assert_eq!(
            (seen[name].host.as_str(), &seen[name].settings.credentials),
            ("", &None),
            "{name}"
        );
        let listed = fleet.get(&format!("crawl/{name}")).unwrap();
        assert_eq!((listed.offered, &listed.credentials), (false, &None), "{name}");
    }
}
