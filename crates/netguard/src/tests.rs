use super::*;

fn guard() -> Guard {
    Guard::new(&["10.96.0.0/12".into(), "203.0.113.0/24".into()], &[]).unwrap()
}

#[test]
fn ranges_parse_strictly_and_read_canonically() {
    for (input, want) in [
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("192.168.1.7", "192.168.1.7/32"),
        ("FD00::/8", "fd00::/8"),
        ("::1", "::1/128"),
    ] {
        assert_eq!(
            Range::parse(input).map(|r| r.to_string()).as_deref(),
            Ok(want),
            "{input}"
        );
    }
    for bad in [
        "10.0.0.1/8",
        "10.0.0.0/33",
        "fd00::/129",
        "example.com",
        "10.0.0.0/8/1",
        "",
    ] {
        assert!(Range::parse(bad).is_err(), "{bad}");
    }
    let ten = Range::parse("10.0.0.0/8").unwrap();
    assert!(ten.contains("10.255.0.1".parse().unwrap()));
    assert!(!ten.contains("11.0.0.0".parse().unwrap()));
    assert!(!ten.contains("::ffff:10.0.0.1".parse().unwrap()), "families apart");
    assert!(Range::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
}

#[test]
fn every_internal_address_is_refused_and_public_ones_pass() {
    let g = guard();
    for (address, why) in [
        ("127.0.0.1", Internal::Localhost),
        ("0.0.0.0", Internal::Localhost),
        ("::1", Internal::Localhost),
        ("::", Internal::Localhost),
        ("169.254.169.254", Internal::LinkLocal),
        ("fe80::1", Internal::LinkLocal),
        ("64:ff9b::a9fe:a9fe", Internal::Translated),
        ("2002:a9fe:a9fe::1", Internal::Translated),
        ("100.100.100.200", Internal::Metadata),
        ("fd00:ec2::254", Internal::Metadata),
        ("10.1.2.3", Internal::Private),
        ("172.31.255.255", Internal::Private),
        ("192.168.0.1", Internal::Private),
        ("100.64.0.1", Internal::Private),
        ("fd12::1", Internal::Private),
        ("203.0.113.9", Internal::Cluster),
        // IPv4-mapped: judged as the IPv4 address it reaches.
        ("::ffff:169.254.169.254", Internal::LinkLocal),
        ("::ffff:127.0.0.1", Internal::Localhost),
    ] {
        assert_eq!(g.address(address.parse().unwrap()), Some(why), "{address}");
    }
    for public in ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8", "172.32.0.1"] {
        assert_eq!(g.address(public.parse().unwrap()), None, "{public}");
    }
}

#[test]
fn hosts_are_judged_as_the_resolver_reads_them() {
    let g = guard();
    for (host, why) in [
        ("2852039166", Internal::LinkLocal),
        ("0xa9fea9fe", Internal::LinkLocal),
        ("0xA9FEA9FE", Internal::LinkLocal),
        ("169.254.43518", Internal::LinkLocal),
        ("169.16689662", Internal::LinkLocal),
        ("0251.0376.0251.0376", Internal::LinkLocal),
        ("169.254.169.254.", Internal::LinkLocal),
        ("[::ffff:169.254.169.254]", Internal::LinkLocal),
        ("[::1]", Internal::Localhost),
        ("127.1", Internal::Localhost),
        ("0", Internal::Localhost),
        ("localhost", Internal::Localhost),
        ("LocalHost.", Internal::Localhost),
        ("app.localhost", Internal::Localhost),
        ("metadata.google.internal", Internal::Metadata),
        ("METADATA.GOOGLE.INTERNAL.", Internal::Metadata),
        ("x.metadata.goog", Internal::Metadata),
        ("metadata", Internal::Metadata),
        ("redis", Internal::ClusterName),
        ("redis.crawlers.svc", Internal::ClusterName),
        ("kubernetes.default.svc.cluster.local", Internal::ClusterName),
        ("10.96.0.1", Internal::Private),
    ] {
        assert_eq!(g.host(host), Some(why), "{host}");
    }
    for public in [
        "example.com",
        "proxy.vendor.example",
        "93.184.216.34",
        "[2606:2800:220:1::1]",
        "1.2.3.4.5",
    ] {
        assert_eq!(g.host(public), None, "{public}");
    }
}

#[test]
fn the_allowlist_lets_named_hosts_and_ranges_through_and_nothing_else() {
    let g = Guard::new(
        &[],
        &[
            "127.0.0.1".into(),
            "proxy.internal.example".into(),
            "10.8.0.0/16".into(),
        ],
    )
    .unwrap();
    assert_eq!(g.host("127.0.0.1"), None);
    assert_eq!(g.host("2130706433"), None, "the same address in another form");
    assert_eq!(g.host("Proxy.Internal.Example."), None);
    assert_eq!(g.address("10.8.3.4".parse().unwrap()), None);
    assert_eq!(g.host("127.0.0.2"), Some(Internal::Localhost));
    assert_eq!(g.address("10.9.0.1".parse().unwrap()), Some(Internal::Private));
    assert_eq!(
        g.host("localhost"),
        Some(Internal::Localhost),
        "a name is not its address"
    );
    assert!(Guard::new(&["10.0.0.1/8".into()], &[]).is_err(), "a bad cluster range");
}
