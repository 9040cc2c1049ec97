use super::*;
use egress_api::ProxySpec;

fn proxy() -> Proxy {
    let mut p = Proxy::new("eu-1", ProxySpec::default());
    p.metadata.namespace = Some("crawl".into());
    p.metadata.uid = Some("uid-1".into());
    p
}

fn stored(credentials: &ProxyCredentials, bound: Option<&str>) -> Secret {
    let mut s = build_secret(&proxy(), credentials, Some("7".into()));
    if let Some(id) = bound {
        s.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_CREDENTIALS_INSTANCE.to_owned(),
            id.to_owned(),
        )]));
    }
    s
}

#[test]
fn the_secret_is_labelled_owned_and_holds_the_three_keys() {
    let c = ProxyCredentials::new(Credentials::generate(), secret_name("uid-1"));
    let s = build_secret(&proxy(), &c, None);
    assert_eq!(s.metadata.name.as_deref(), Some(secret_name("uid-1").as_str()));
    assert!(secret_name("uid-1").starts_with("proxy-") && secret_name("uid-1").ends_with("-credentials"));
    assert_eq!(s.metadata.namespace.as_deref(), Some("crawl"));
    assert_eq!(s.labels()[LABEL_PROXY_CREDENTIALS], "generated");
    let owner = &s.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Proxy", "eu-1", "uid-1")
    );
    assert_eq!(owner.api_version, "crawl.example.com/v1alpha1");
    let keys: Vec<&String> = s.data.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["htpasswd", "password", "username"]);
    assert_eq!(text(&s, PASSWORD_KEY).as_deref(), Some(c.credentials.password()));
    assert!(s.annotations().is_empty(), "no instance bound yet");
}

#[test]
fn a_missing_or_gone_secret_gets_new_credentials_and_others_are_kept() {
    let c = ProxyCredentials::new(Credentials::generate(), secret_name("uid-1"));
    let x = ProviderId::new("local/proxy-x");
    assert_eq!(plan(None, "uid-1", None), Plan::Mint { replace: None });
    assert_eq!(plan(Some(&stored(&c, None)), "uid-1", None), Plan::Reuse(c.clone()));
    assert_eq!(plan(Some(&stored(&c, None)), "uid-1", Some(&x)), Plan::Reuse(c.clone()));
    // Used by an instance this pass saw gone: the replacement rotates.
    assert_eq!(
        plan(Some(&stored(&c, Some("local/proxy-x"))), "uid-1", Some(&x)),
        Plan::Mint {
            replace: Some("7".into())
        }
    );
    // Used by an instance nobody has seen gone (a status write lost after the bind): kept,
    // for the reconciler to ask the provider about.
    let bound = Plan::Bound {
        instance: x.clone(),
        credentials: Some(c.clone()),
    };
    assert_eq!(plan(Some(&stored(&c, Some("local/proxy-x"))), "uid-1", None), bound);
    assert_eq!(
        plan(
            Some(&stored(&c, Some("local/proxy-x"))),
            "uid-1",
            Some(&ProviderId::new("local/proxy-y"))
        ),
        bound
    );
    // A damaged Secret is written anew when no instance may still have it; bound to one
    // that may, that instance is asked about first (without credentials to keep).
    let damage = |instance| {
        let mut damaged = stored(&c, instance);
        damaged
            .data
            .as_mut()
            .unwrap()
            .insert(PASSWORD_KEY.into(), ByteString(b"changed".to_vec()));
        damaged
    };
    let mint = Plan::Mint {
        replace: Some("7".into()),
    };
    assert_eq!(plan(Some(&damage(None)), "uid-1", None), mint);
    assert_eq!(plan(Some(&damage(Some("local/proxy-x"))), "uid-1", Some(&x)), mint);
    assert_eq!(
        plan(Some(&damage(Some("local/proxy-x"))), "uid-1", None),
        Plan::Bound {
            instance: x.clone(),
            credentials: None
        }
    );
    // Someone else's Secret of that name is left alone, and the message shows no content.
    let Plan::Refuse(why) = plan(Some(&stored(&c, None)), "another-uid", None) else {
        panic!("not refused")
    };
    assert!(why.contains("not owned by this Proxy"), "{why}");
    assert!(!why.contains(c.credentials.password()));
}

#[test]
fn a_secret_serves_only_the_instance_it_names() {
    let c = ProxyCredentials::new(Credentials::generate(), secret_name("uid-1"));
    let x = ProviderId::new("local/proxy-x");
    assert_eq!(serving(&stored(&c, Some("local/proxy-x")), "uid-1", &x), Serving::Yes);
    assert_eq!(
        serving(&stored(&c, None), "uid-1", &x),
        Serving::Unbound,
        "its bind did not land"
    );
    assert_eq!(
        serving(&stored(&c, Some("local/proxy-y")), "uid-1", &x),
        Serving::No,
        "another instance"
    );
    assert_eq!(
        serving(&stored(&c, Some("local/proxy-x")), "uid-2", &x),
        Serving::No,
        "another Proxy's"
    );
    let mut keyless = stored(&c, Some("local/proxy-x"));
    keyless.data.as_mut().unwrap().remove(PASSWORD_KEY);
    assert_eq!(serving(&keyless, "uid-1", &x), Serving::No, "no password");
    // Unbound and damaged: not credentials anyone made this instance with.
    keyless.metadata.annotations = None;
    assert_eq!(serving(&keyless, "uid-1", &x), Serving::No);
}

/// A user's Secret, labelled, with `proxies` as its annotation (`None`: without one).
fn vendor(proxies: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("vendor".into()),
            namespace: Some("crawl".into()),
            labels: Some(BTreeMap::from([(
                LABEL_PROXY_CREDENTIALS.to_owned(),
                "true".to_owned(),
            )])),
            annotations: proxies.map(|v| BTreeMap::from([(ANNOTATION_CREDENTIALS_PROXIES.to_owned(), v.to_owned())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (USERNAME_KEY.to_owned(), ByteString(b"vendor-user".to_vec())),
            (PASSWORD_KEY.to_owned(), ByteString(b"SENTINEL-vendor-pw".to_vec())),
        ])),
        ..Secret::default()
    }
}

fn refusal(proxies: Option<&str>, proxy: &str) -> Refusal {
    may_serve(&vendor(proxies), proxy).expect_err("not refused")
}

#[test]
fn a_user_secret_serves_the_proxies_it_names_and_no_other() {
    assert_eq!(may_serve(&vendor(Some("eu-1")), "eu-1"), Ok(()));
    assert_eq!(
        may_serve(&vendor(Some("a,eu-1,b")), "eu-1"),
        Ok(()),
        "one login, several Proxies"
    );
    assert_eq!(
        may_serve(&vendor(Some(" a ,\teu-1 , b")), "eu-1"),
        Ok(()),
        "spaces around names"
    );
    assert_eq!(may_serve(&vendor(Some("a.b")), "a.b"), Ok(()), "a name with dots");
    assert_eq!(
        refusal(Some("a,b"), "eu-1"),
        Refusal::NotNamed {
            secret: "vendor".into(),
            proxy: "eu-1".into()
        }
    );
    // Names are whole: neither a prefix nor a longer name counts.
    for value in ["eu", "eu-10", "eu-1x", "eu-1.x"] {
        assert!(
            matches!(refusal(Some(value), "eu-1"), Refusal::NotNamed { .. }),
            "{value}"
        );
    }
    for missing in [None, Some(""), Some("  ")] {
        assert!(
            matches!(refusal(missing, "eu-1"), Refusal::NoneNamed { .. }),
            "{missing:?}"
        );
    }
}

#[test]
fn a_list_of_64_names_is_taken_and_one_of_65_makes_the_secret_serve_none() {
    let names = |n: usize| (1..=n).map(|i| format!("p-{i}")).collect::<Vec<_>>().join(",");
    assert_eq!(named_proxies(&names(64)).map(|v| v.len()), Ok(64));
    assert_eq!(may_serve(&vendor(Some(&names(64))), "p-64"), Ok(()));
    let why = refusal(Some(&names(65)), "p-1").to_string();
    assert!(why.contains("lists 65 names, more than 64"), "{why}");
    assert!(why.contains("serves no Proxy"), "{why}");
    // A huge value is refused the same way, without reading all of it.
    let why = named_proxies(&",".repeat(100_000)).unwrap_err();
    assert!(why.contains("more than 64"), "{why}");
}

#[test]
fn a_name_that_is_no_object_name_makes_the_secret_serve_none() {
    for value in ["eu-1,Bad_Name", "eu-1,EU-1", "eu-1,,b", "eu-1,", "-eu,eu-1", "eu-1,a b"] {
        let Refusal::Malformed { why, .. } = refusal(Some(value), "eu-1") else {
            panic!("{value:?} taken")
        };
        assert!(
            why.contains("not a valid Kubernetes object name") || why.contains("empty name"),
            "{value:?}: {why}"
        );
    }
    // A long bad name is cut short in the message.
    let why = refusal(Some(&"X".repeat(1000)), "eu-1").to_string();
    assert!(why.len() < 500, "{why}");
}

#[test]
fn refusal_messages_name_the_secret_and_the_annotation_and_nothing_of_its_data() {
    let mut generated = vendor(Some("eu-1"));
    generated
        .labels_mut()
        .insert(LABEL_PROXY_CREDENTIALS.into(), PROXY_CREDENTIALS_GENERATED.into());
    let refusals = [
        refusal(None, "eu-1"),
        refusal(Some("a"), "eu-1"),
        refusal(Some("a,B"), "eu-1"),
        may_serve(&generated, "eu-1").expect_err("a generated Secret served a user's Proxy"),
    ];
    for r in refusals {
        let message = r.to_string();
        assert!(message.contains("Secret \"vendor\""), "{message}");
        assert!(
            matches!(r, Refusal::Generated { .. }) || message.contains(ANNOTATION_CREDENTIALS_PROXIES),
            "{message}"
        );
        assert!(
            !message.contains("SENTINEL") && !message.contains("vendor-user"),
            "{message}"
        );
    }
}

#[test]
fn the_cache_gives_a_user_secret_only_to_the_proxies_it_names() {
    let external = |name: &str| {
        let mut p = proxy();
        p.metadata.name = Some(name.into());
        p.spec.credentials = Some(egress_api::Credentials {
            type_: CredentialsType::Secret,
            secret_ref: Some(egress_api::CredentialsSecretRef { name: "vendor".into() }),
        });
        p
    };
    let cache = |secret: Secret| {
        let (store, mut writer) = reflector::store::<Secret>();
        writer.apply_watcher_event(&watcher::Event::Apply(secret));
        CredentialCache::from_store(store)
    };
    let named = cache(vendor(Some("eu-1, eu-2")));
    let found = Lookup::Found(Credentials::new("vendor-user", "SENTINEL-vendor-pw").unwrap());
    assert_eq!(named.lookup(&external("eu-1")), found);
    assert_eq!(named.lookup(&external("eu-2")), found);
    assert!(matches!(
        named.lookup(&external("eu-3")),
        Lookup::Refused(Refusal::NotNamed { .. })
    ));
    assert_eq!(named.for_proxy(&external("eu-3")), None);
    let unannotated = cache(vendor(None));
    assert!(matches!(
        unannotated.lookup(&external("eu-1")),
        Lookup::Refused(Refusal::NoneNamed { .. })
    ));
    assert_eq!(unannotated.for_proxy(&external("eu-1")), None);
}

#[test]
fn refusals_that_will_not_change_are_unusable_and_the_rest_retried() {
    let api = |code: u16| kube::Error::Api(kube::core::Status::failure("refused", "Reason").with_code(code).boxed());
    for code in [400, 403, 422] {
        assert!(
            matches!(problem("writing", "s", &api(code)), SecretProblem::Unusable(m) if m.contains("writing Secret \"s\"")),
            "{code}"
        );
    }
    for code in [401, 404, 409, 429, 500, 503] {
        assert!(
            matches!(problem("writing", "s", &api(code)), SecretProblem::Unavailable(_)),
            "{code}"
        );
    }
}

#[test]
fn the_cache_finds_generated_and_user_credentials_and_nothing_else() {
    let (store, mut writer) = reflector::store::<Secret>();
    let c = ProxyCredentials::new(Credentials::generate(), secret_name("uid-1"));
    writer.apply_watcher_event(&watcher::Event::Apply(stored(&c, Some("id"))));
    let mut user = Secret {
        metadata: ObjectMeta {
            name: Some("mine".into()),
            namespace: Some("crawl".into()),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_CREDENTIALS_PROXIES.to_owned(),
                "eu-1".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (USERNAME_KEY.to_owned(), ByteString(b"bob".to_vec())),
            (PASSWORD_KEY.to_owned(), ByteString(b"hunter2".to_vec())),
        ])),
        ..Secret::default()
    };
    writer.apply_watcher_event(&watcher::Event::Apply(user.clone()));
    let cache = CredentialCache::from_store(store);
    let with = |type_, secret_ref: Option<&str>| {
        let mut p = proxy();
        p.status = Some(egress_api::ProxyStatus {
            provider_id: "id".into(),
            ..Default::default()
        });
        p.spec.credentials = Some(egress_api::Credentials {
            type_,
            secret_ref: secret_ref.map(|n| egress_api::CredentialsSecretRef { name: n.into() }),
        });
        p
    };
    assert_eq!(cache.lookup(&proxy()), Lookup::NotNeeded);
    assert_eq!(cache.lookup(&with(CredentialsType::None, None)), Lookup::NotNeeded);
    assert_eq!(
        cache.lookup(&with(CredentialsType::Generated, None)),
        Lookup::Found(c.credentials.clone())
    );
    // Not the instance the Secret names (one still to be made, or one gone): nothing.
    let mut moved = with(CredentialsType::Generated, None);
    moved.status.as_mut().unwrap().provider_id = "another".into();
    assert_eq!(cache.lookup(&moved), Lookup::Missing);
    moved.status = None;
    assert_eq!(cache.lookup(&moved), Lookup::Missing);
    assert_eq!(
        cache.for_proxy(&with(CredentialsType::Secret, Some("mine"))),
        Some(Credentials::new("bob", "hunter2").unwrap())
    );
    assert_eq!(
        cache.lookup(&with(CredentialsType::Secret, Some("absent"))),
        Lookup::Missing
    );
    // An External Proxy naming a generated Secret gets nothing from it.
    assert_eq!(
        cache.for_proxy(&with(CredentialsType::Secret, Some(&secret_name("uid-1")))),
        None
    );
    // A generated Secret of another Proxy (another UID) is not taken.
    let mut other = with(CredentialsType::Generated, None);
    other.metadata.uid = Some("uid-2".into());
    assert_eq!(cache.lookup(&other), Lookup::Missing);
    // A user's Secret without a password gives nothing rather than half.
    user.data.as_mut().unwrap().remove(PASSWORD_KEY);
    let (store, mut writer) = reflector::store::<Secret>();
    writer.apply_watcher_event(&watcher::Event::Apply(user));
    let cache = CredentialCache::from_store(store);
    assert_eq!(cache.for_proxy(&with(CredentialsType::Secret, Some("mine"))), None);
}
