//! Small MaxMind DB files for tests (feature `testing`), written with mmdb-writer, which takes
//! reserved ranges such as 127.0.0.0/8 (the local fleet's exits) as any other.

use serde::Serialize;

#[derive(Serialize)]
struct CountryRecord<'a> {
    country: IsoCode<'a>,
}

#[derive(Serialize)]
struct IsoCode<'a> {
    iso_code: &'a str,
}

#[derive(Serialize)]
struct AsnRecord<'a> {
    autonomous_system_number: u32,
    autonomous_system_organization: &'a str,
}

/// A country database of type `kind` (`Test-Country`): each network (`127.0.0.2/32`) with its
/// ISO code.
///
/// # Panics
/// A network that does not parse, or a writer error.
pub fn country_database(kind: &str, networks: &[(&str, &str)]) -> Vec<u8> {
    let mut writer = mmdb_writer::Writer::new(kind);
    for (net, code) in networks {
        let net: mmdb_writer::ipnet::IpNet = net.parse().expect("a network");
        let record = CountryRecord {
            country: IsoCode { iso_code: code },
        };
        writer.insert(net, &record).expect("a record");
    }
    writer.to_bytes().expect("a database")
}

/// An ASN database (type `Test-ASN`): each network with its number and organisation.
///
/// # Panics
/// As [`country_database`].
pub fn asn_database(networks: &[(&str, u32, &str)]) -> Vec<u8> {
    let mut writer = mmdb_writer::Writer::new("Test-ASN");
    for (net, number, organization) in networks {
        let net: mmdb_writer::ipnet::IpNet = net.parse().expect("a network");
        let record = AsnRecord {
            autonomous_system_number: *number,
            autonomous_system_organization: organization,
        };
        writer.insert(net, &record).expect("a record");
    }
    writer.to_bytes().expect("a database")
}
