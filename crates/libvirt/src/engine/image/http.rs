//! The image over HTTP: the client that fetches it (redirects kept safe) and what the mirror's
//! answers mean for the create (a length to rely on, or a failure of the right class).

use std::sync::Arc;
use std::time::Duration;

use egress_provider::redact;
use reqwest::StatusCode;

use crate::engine::failure::OpFailure;
use crate::engine::url_guard::{GuardedResolver, Lookup, Refused, UrlHosts};

/// The precheck's HEAD (or GET) budget, and the download's until its headers arrive.
pub const PROBE_BUDGET: Duration = Duration::from_secs(30);

/// The HTTP client of the image downloads whose URLs `hosts` judges: no overall timeout (each
/// request carries its own), identity encoding (a decompressed body would hide
/// `Content-Length`), names resolved by `lookup` and every address checked before the client
/// connects ([`GuardedResolver`]), no proxy from the environment for a Proxy's URLs (it would
/// resolve names itself), and redirects that stay on http(s), never downgrade from https, and lead only where
/// `hosts` lets the first URL go.
///
/// # Errors
/// The client cannot be built (no TLS roots, say).
pub fn http_client(hosts: UrlHosts, lookup: Arc<dyn Lookup>) -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a default crypto provider; ring is the workspace's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The catalogue's downloads go through `HTTP(S)_PROXY` as they always have (a cluster that
    // reaches the internet through a proxy); a Proxy's URL never does: a proxy would resolve
    // its name instead of the guarded resolver.
    let builder = match hosts {
        UrlHosts::Catalogue => reqwest::Client::builder(),
        _ => reqwest::Client::builder().no_proxy(),
    };
    let hosts = Arc::new(hosts);
    let resolver = GuardedResolver {
        hosts: hosts.clone(),
        lookup,
    };
    builder
        .dns_resolver(resolver)
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            let refused = redirect_refusal(attempt.previous().last(), attempt.url(), &hosts);
            match refused {
                Some(why) => attempt.error(Refused(why)),
                None if attempt.previous().len() >= 10 => attempt.error("more than 10 redirects"),
                None => attempt.follow(),
            }
        }))
        .build()
}

/// Why a redirect from `from` to `to` is refused, if it is.
fn redirect_refusal(from: Option<&reqwest::Url>, to: &reqwest::Url, hosts: &UrlHosts) -> Option<String> {
    if from.is_some_and(|f| f.scheme() == "https") && to.scheme() == "http" {
        return Some("redirect from https to http refused".to_owned());
    }
    hosts.refusal(to).map(|why| format!("redirect refused: {why}"))
}

/// The verdict on an image response (§6.4): its length, or why it cannot be used.
///
/// # Errors
/// 429 and 5xx Transient; other 4xx Permanent; anything else that is not 2xx Transient; a 2xx
/// without a usable `Content-Length` Permanent.
pub fn check_response(url: &str, status: StatusCode, length: Option<u64>) -> Result<u64, OpFailure> {
    let shown = status_text(status);
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return Err(OpFailure::transient(format!("image {url}: HTTP {shown}")));
    }
    if status.is_client_error() {
        return Err(OpFailure::permanent(format!("image {url}: HTTP {shown}")));
    }
    if !status.is_success() {
        return Err(OpFailure::transient(format!("image {url}: unexpected HTTP {shown}")));
    }
    match length {
        None => Err(OpFailure::permanent(format!(
            "image {url}: response has no Content-Length; the volume capacity must be known before upload"
        ))),
        Some(0) => Err(OpFailure::permanent(format!(
            "image {url}: response is empty (Content-Length 0)"
        ))),
        Some(n) => Ok(n),
    }
}

/// The `Content-Length` a response declares. Read from the header: for a HEAD response the
/// body's own length is 0 whatever the header says.
pub(super) fn declared_length(response: &reqwest::Response) -> Option<u64> {
    response
        .headers()
        .get(reqwest::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `404 Not Found`: the code and its reason phrase.
fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// A transport failure of an image request. A redirect the policy refused is Permanent: the
/// mirror sends the operator where it will not go, and asking again changes nothing.
pub(super) fn fetch_error(url: &str, e: &reqwest::Error) -> OpFailure {
    let message = format!("fetching image {url}: {}", http_error_text(e));
    if e.is_redirect() || refused(e) {
        OpFailure::permanent(message)
    } else {
        OpFailure::transient(message)
    }
}

/// Whether the URL guard refused the download (at a redirect, or where a name resolved to).
fn refused(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<Refused>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// reqwest's error with its causes (connection refused, a certificate...), the URL left out:
/// messages show it once, without credentials.
pub(super) fn http_error_text(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(u) = e.url() {
        text = text.replace(u.as_str(), "<url>");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    redact(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_judged_as_the_table_says() {
        use egress_provider::ErrorClass as C;
        use egress_provider::Op;
        let u = "https://mirror/x.qcow2";
        assert_eq!(check_response(u, StatusCode::OK, Some(10)).unwrap(), 10);
        for (status, length, class, text) in [
            (
                404,
                Some(1),
                C::Permanent,
                "image https://mirror/x.qcow2: HTTP 404 Not Found",
            ),
            (
                403,
                Some(1),
                C::Permanent,
                "image https://mirror/x.qcow2: HTTP 403 Forbidden",
            ),
            (410, None, C::Permanent, "image https://mirror/x.qcow2: HTTP 410 Gone"),
            (
                429,
                None,
                C::Transient,
                "image https://mirror/x.qcow2: HTTP 429 Too Many Requests",
            ),
            (
                503,
                None,
                C::Transient,
                "image https://mirror/x.qcow2: HTTP 503 Service Unavailable",
            ),
            (
                302,
                None,
                C::Transient,
                "image https://mirror/x.qcow2: unexpected HTTP 302 Found",
            ),
            (
                200,
                None,
                C::Permanent,
                "image https://mirror/x.qcow2: response has no Content-Length; the volume capacity must be known before upload",
            ),
            (
                200,
                Some(0),
                C::Permanent,
                "image https://mirror/x.qcow2: response is empty (Content-Length 0)",
            ),
        ] {
            let e = check_response(u, StatusCode::from_u16(status).unwrap(), length).unwrap_err();
            assert_eq!((e.class(Op::Create), e.to_string().as_str()), (class, text), "{status}");
        }
    }

    #[test]
    fn redirects_stay_safe() {
        let u = |s: &str| reqwest::Url::parse(s).unwrap();
        let public = UrlHosts::for_proxies(None, egress_netguard::Guard::default());
        assert_eq!(
            redirect_refusal(Some(&u("http://a.example/x")), &u("https://b.example/y"), &public),
            None
        );
        assert!(redirect_refusal(Some(&u("https://a.example/x")), &u("http://b.example/y"), &public).is_some());
        assert!(redirect_refusal(None, &u("http://169.254.169.254/latest/meta-data"), &public).is_some());
        assert!(redirect_refusal(None, &u("http://10.0.0.5/x"), &public).is_some());
        assert!(redirect_refusal(None, &u("ftp://a.example/x"), &public).is_some());
        // The catalogue's redirects keep off metadata services only.
        assert_eq!(
            redirect_refusal(None, &u("http://10.0.0.5/x"), &UrlHosts::Catalogue),
            None
        );
        assert!(redirect_refusal(None, &u("http://[fe80::1]/x"), &UrlHosts::Catalogue).is_some());
        // With imageUrlHosts, a redirect stays on a listed host (review M12).
        let listed = UrlHosts::Listed(vec!["Mirror.Example".to_owned()]);
        assert_eq!(redirect_refusal(None, &u("https://mirror.example/y"), &listed), None);
        assert_eq!(
            redirect_refusal(None, &u("http://169.254.169.254/latest/meta-data"), &listed).as_deref(),
            Some("redirect refused: host 169.254.169.254 is not in imageUrlHosts")
        );
    }
}
