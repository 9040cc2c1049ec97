//! Checks on the host part of an image URL, shared by placement (a URL a Proxy gives) and the
//! download (where a redirect leads).

use std::net::IpAddr;

/// Whether URL host `host` is one of `list` (case-insensitive; IPv6 with or without brackets).
pub fn host_listed(list: &[String], host: &str) -> bool {
    let bare = |h: &str| h.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    let host = bare(host);
    list.iter().any(|l| bare(l) == host)
}

/// Whether `host` (a URL's host part) is a link-local address literal (169.254.0.0/16,
/// fe80::/10): where cloud metadata services answer.
pub fn is_link_local_host(host: &str) -> bool {
    match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.is_link_local(),
        Ok(IpAddr::V6(v6)) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        Err(_) => false,
    }
}
