//! The providerID: `<namespace>/<name>` of the Pod.

/// The id of Pod `name` in `namespace`.
pub fn format(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// `(namespace, name)` of an id: exactly one `/`, neither part empty. (The Go provider accepted
/// `ns/`; every id it issued has both parts, so this is compatible.)
///
/// # Errors
/// `malformed providerID "<id>": want <namespace>/<name>` (Permanent for the provider).
pub fn parse(id: &str) -> Result<(&str, &str), String> {
    match id.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok((ns, name)),
        _ => Err(format!("malformed providerID {id:?}: want <namespace>/<name>")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_anything_else_is_malformed() {
        assert_eq!(format("crawl", "proxy-abc"), "crawl/proxy-abc");
        assert_eq!(parse("crawl/proxy-abc"), Ok(("crawl", "proxy-abc")));
        for bad in ["", "proxy-abc", "crawl/", "/proxy-abc", "a/b/c", "/"] {
            assert_eq!(
                parse(bad),
                Err(format!("malformed providerID {bad:?}: want <namespace>/<name>")),
                "{bad:?}"
            );
        }
    }
}
