//! Checks on the host part of an image URL, shared by placement (a URL a Proxy gives) and the
//! download (where a redirect leads).

/// Whether URL host `host` is one of `list` (case-insensitive; IPv6 with or without brackets).
pub fn host_listed(list: &[String], host: &str) -> bool {
    let bare = |h: &str| h.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    let host = bare(host);
    list.iter().any(|l| bare(l) == host)
}

/// Whether `host` (a URL's host part) is where cloud metadata services answer: a link-local
/// address (169.254.0.0/16, fe80::/10) or a metadata name or address, judged by the one list of
/// internal destinations (`egress-netguard`), so its other spellings (`2852039166`,
/// `0xa9fea9fe`, `[::ffff:169.254.169.254]`, `metadata.google.internal`) count too.
pub fn is_metadata_host(host: &str) -> bool {
    use egress_netguard::{Guard, Internal};
    matches!(
        Guard::default().host(host),
        Some(Internal::LinkLocal | Internal::Metadata)
    )
}
