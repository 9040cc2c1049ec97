use super::*;

fn names(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|n| (*n).to_owned()).collect())
}

/// A proxy `id` (`<namespace>/<name>`), a member of `pool` when given, whose `pool` attribute
/// says `attribute`.
fn proxy(id: &str, pool: Option<&str>, attribute: Option<&str>) -> ProxyInfo {
    ProxyInfo {
        id: id.into(),
        ip: "10.0.0.1".into(),
        port: 3128,
        attributes: attribute
            .map(|a| ("pool".to_owned(), a.to_owned()))
            .into_iter()
            .collect(),
        phase: "Ready".into(),
        healthy: true,
        latency_millis: 1,
        max_leases: 1,
        credentials: None,
        offered: true,
        pool_role: pool.map(|_| "active"),
        pool: pool.map(str::to_owned),
        exit: None,
    }
}

#[test]
fn a_proxy_is_in_scope_by_its_namespace_and_its_pool_membership() {
    let eu = proxy("crawlers/eu-1", Some("eu"), Some("eu"));
    let us = proxy("crawlers/us-1", Some("us"), Some("us"));
    let alone = proxy("crawlers/alone", None, None);
    let elsewhere = proxy("team-b/eu-1", Some("eu"), Some("eu"));
    // Carries the attribute without being a member: what any Proxy author can write.
    let spoof = proxy("crawlers/spoof", None, Some("eu"));
    let cases = [
        // namespaces, pools, then: eu, us, alone, elsewhere, spoof
        (names(&["crawlers"]), None, [true, true, true, false, true]),
        (None, names(&["eu"]), [true, false, false, true, false]),
        (names(&["crawlers"]), names(&["eu"]), [true, false, false, false, false]),
        (
            names(&["team-b", "crawlers"]),
            names(&["us", "eu"]),
            [true, true, false, true, false],
        ),
    ];
    for (namespaces, pools, expected) in cases {
        let scope = ClientScope::new(namespaces.clone(), pools.clone()).unwrap();
        let got = [&eu, &us, &alone, &elsewhere, &spoof].map(|p| scope.allows(p));
        assert_eq!(got, expected, "{namespaces:?} {pools:?}");
    }
}

#[test]
fn a_pool_is_in_scope_by_its_namespace_and_name() {
    let scope = ClientScope::new(names(&["crawlers"]), names(&["eu"])).unwrap();
    assert!(scope.allows_pool("crawlers/eu"));
    assert!(!scope.allows_pool("crawlers/us"));
    assert!(!scope.allows_pool("team-b/eu"));
    assert!(!scope.allows_pool("eu"), "a key without a namespace is in none");
    let pools_only = ClientScope::new(None, names(&["eu"])).unwrap();
    assert!(pools_only.allows_pool("team-b/eu"));
    assert!(!pools_only.allows_pool("team-b/us"));
    let namespaces_only = ClientScope::new(names(&["crawlers"]), None).unwrap();
    assert!(namespaces_only.allows_pool("crawlers/anything"));
    assert!(!namespaces_only.allows_pool("team-b/eu"));
}

#[test]
fn bad_lists_are_refused_with_what_is_wrong() {
    let refused =
        |namespaces: Option<Vec<String>>, pools: Option<Vec<String>>| ClientScope::new(namespaces, pools).unwrap_err();
    assert!(refused(None, None).contains("neither namespaces nor pools"));
    assert!(refused(names(&[]), None).contains("scope.namespaces is empty"));
    assert!(refused(None, names(&[])).contains("scope.pools is empty"));
    assert!(refused(names(&["Crawlers"]), None).contains(r#""Crawlers" is not a namespace name"#));
    assert!(refused(names(&["a.b"]), None).contains("not a namespace name"));
    assert!(refused(None, names(&["eu_pool"])).contains(r#""eu_pool" is not a pool name"#));
    assert!(refused(None, names(&["eu.", "x"])).contains("not a pool name"));
    assert!(refused(names(&["a", "b", "a"]), None).contains(r#"scope.namespaces lists "a" twice"#));
    let many: Vec<String> = (0..=MAX_NAMESPACES).map(|i| format!("n{i}")).collect();
    assert!(refused(Some(many), None).contains("at most 32"));
    let many: Vec<String> = (0..=MAX_POOLS).map(|i| format!("p{i}")).collect();
    assert!(refused(None, Some(many)).contains("at most 64"));
    assert!(refused(None, names(&[&"x".repeat(64)])).contains("not a pool name"));
    // What is accepted: the longest names, dotted pool names, the most entries.
    let long_pool = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join(".");
    assert_eq!(long_pool.len(), 253);
    ClientScope::new(names(&[&"x".repeat(63)]), Some(vec![long_pool, "eu.crawl".into()])).unwrap();
    let most: Vec<String> = (0..MAX_NAMESPACES).map(|i| format!("n{i}")).collect();
    ClientScope::new(Some(most), None).unwrap();
}

#[test]
fn the_table_in_force_answers_for_scoped_clients_only() {
    let scopes = Scopes::default();
    assert!(scopes.of("team-a").is_none(), "nothing in force: nobody is scoped");
    let scope = Arc::new(ClientScope::new(names(&["crawlers"]), None).unwrap());
    scopes.set(BTreeMap::from([("team-a".to_owned(), scope.clone())]));
    assert_eq!(scopes.of("team-a"), Some(scope));
    assert!(scopes.of("team-b").is_none());
    assert!(scopes.of("default").is_none());
    scopes.clone().set(ScopeTable::new());
    assert!(scopes.of("team-a").is_none(), "a clone shares what is in force");
}
