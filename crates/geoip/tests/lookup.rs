//! The databases as MaxMind's format has them, written by a real writer (mmdb-writer, through
//! `egress_geoip::testing`; reserved ranges included: the local fleet's exits are 127.0.0.0/8
//! addresses), read back by lookups,
//! refused when they are not what the flag says, and followed as files change.

use std::net::IpAddr;
use std::path::Path;

use egress_files::Followed as _;
use egress_geoip::{DatabaseFile, Geo, GeoIp, Kind};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn country_db(kind: &str, networks: &[(&str, &str)]) -> Vec<u8> {
    egress_geoip::testing::country_database(kind, networks)
}

fn asn_db(networks: &[(&str, u32, &str)]) -> Vec<u8> {
    egress_geoip::testing::asn_database(networks)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn an_address_gets_its_country_asn_and_organisation_and_others_nothing() {
    let dir = egress_testkit::ScratchDir::new("geoip-lookup");
    let country = country_db(
        "Test-Country",
        &[("127.0.0.2/32", "DE"), ("127.0.0.3/32", "FR"), ("2001:db8::/32", "NL")],
    );
    let asn = asn_db(&[("127.0.0.0/8", 64500, "Loopback Networks")]);
    let geoip = GeoIp::default();
    assert!(!geoip.has_country());
    assert_eq!(
        geoip.lookup(ip("127.0.0.2")),
        Geo::default(),
        "no database, nothing known"
    );
    geoip
        .load(Kind::Country, &write(dir.path(), "country.mmdb", &country))
        .unwrap();
    geoip.load(Kind::Asn, &write(dir.path(), "asn.mmdb", &asn)).unwrap();
    assert!(geoip.has_country());
    assert_eq!(
        geoip.lookup(ip("127.0.0.2")),
        Geo {
            country: Some("DE".into()),
            asn: Some(64500),
            organization: Some("Loopback Networks".into()),
        }
    );
    assert_eq!(geoip.lookup(ip("127.0.0.3")).country.as_deref(), Some("FR"));
    assert_eq!(geoip.lookup(ip("2001:db8::7")).country.as_deref(), Some("NL"));
    let elsewhere = geoip.lookup(ip("127.0.0.9"));
    assert_eq!((elsewhere.country, elsewhere.asn), (None, Some(64500)));
    assert_eq!(geoip.lookup(ip("198.51.100.1")), Geo::default());
}

#[test]
fn a_file_that_is_not_the_database_named_is_refused() {
    let dir = egress_testkit::ScratchDir::new("geoip-refused");
    let geoip = GeoIp::default();
    let country = write(
        dir.path(),
        "country.mmdb",
        &country_db("Test-Country", &[("127.0.0.2/32", "DE")]),
    );
    let e = geoip.load(Kind::Asn, &country).unwrap_err();
    assert!(
        e.to_string().contains("not a ASN database") || e.to_string().contains("not an ASN database"),
        "{e}"
    );
    let junk = write(dir.path(), "junk.mmdb", b"not a database at all");
    let e = geoip.load(Kind::Country, &junk).unwrap_err();
    assert!(e.to_string().contains("not a MaxMind DB"), "{e}");
    let e = geoip.load(Kind::Country, &dir.path().join("missing.mmdb")).unwrap_err();
    assert!(e.to_string().contains("missing.mmdb"), "{e}");
    let huge = dir.path().join("huge.mmdb");
    let file = std::fs::File::create(&huge).unwrap();
    file.set_len(egress_geoip::MAX_DATABASE_BYTES + 1).unwrap();
    let e = geoip.load(Kind::Country, &huge).unwrap_err();
    assert!(!geoip.has_country(), "nothing refused is put in force: {e}");
}

#[test]
fn a_followed_file_is_read_again_when_it_changes_and_a_broken_one_leaves_the_last() {
    let dir = egress_testkit::ScratchDir::new("geoip-follow");
    let path = write(
        dir.path(),
        "country.mmdb",
        &country_db("Test-Country", &[("127.0.0.2/32", "DE")]),
    );
    let geoip = GeoIp::default();
    let mut followed = DatabaseFile::new(geoip.clone(), Kind::Country, path.clone());
    assert_eq!(followed.check().unwrap(), Some(path.clone()));
    assert_eq!(followed.check().unwrap(), None, "unchanged: not read again");
    // Replaced as a kubelet replaces a volume's file: a new file renamed over the old one.
    let next = write(
        dir.path(),
        "next.mmdb",
        &country_db("Test-Country", &[("127.0.0.2/32", "AT")]),
    );
    std::fs::rename(&next, &path).unwrap();
    assert_eq!(followed.check().unwrap(), Some(path.clone()));
    assert_eq!(geoip.lookup(ip("127.0.0.2")).country.as_deref(), Some("AT"));
    let broken = write(dir.path(), "broken.mmdb", b"truncated");
    std::fs::rename(&broken, &path).unwrap();
    assert!(followed.check().is_err());
    assert_eq!(
        geoip.lookup(ip("127.0.0.2")).country.as_deref(),
        Some("AT"),
        "the last good one stays"
    );
}
