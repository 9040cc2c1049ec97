//! The providerID: `hosts/<host>/domains/<name>`. The host is in the id on purpose: a
//! `placement.zone` edit during a replacement must not send get or delete to another hypervisor.

/// The id of domain `name` on host `host`.
pub fn format(host: &str, name: &str) -> String {
    format!("hosts/{host}/domains/{name}")
}

/// `(host, name)` of an id: exactly four segments, `hosts` and `domains` literal, neither part
/// empty.
///
/// # Errors
/// `malformed providerID "<id>": want hosts/<host>/domains/<name>` (Permanent for the provider).
pub fn parse(id: &str) -> Result<(&str, &str), String> {
    match id.split('/').collect::<Vec<_>>().as_slice() {
        ["hosts", host, "domains", name] if !host.is_empty() && !name.is_empty() => Ok((host, name)),
        _ => Err(format!("malformed providerID {id:?}: want hosts/<host>/domains/<name>")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_anything_else_is_malformed() {
        assert_eq!(format("beelink", "proxy-abc"), "hosts/beelink/domains/proxy-abc");
        assert_eq!(parse("hosts/beelink/domains/proxy-abc"), Ok(("beelink", "proxy-abc")));
        for bad in [
            "",
            "proxy-x",
            "beelink/proxy-x",
            "hosts/beelink/proxy-x",
            "hosts//domains/x",
            "hosts/beelink/domains/",
            "hosts/beelink/domains/x/y",
            "nodes/beelink/domains/x",
        ] {
            assert_eq!(
                parse(bad),
                Err(format!(
                    "malformed providerID {bad:?}: want hosts/<host>/domains/<name>"
                )),
                "{bad:?}"
            );
        }
    }
}
