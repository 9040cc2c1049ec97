//! One probe: proves a proxy can reach the outside world by fetching a target URL through it.
//!
//! ```text
//! https://target:  TCP to proxy ─► CONNECT host:port (2xx) ─► TLS in the tunnel ─► GET path ─► status
//! http://target:   TCP to proxy ─► GET http://host:port/path (absolute form) ─────────────────► status
//! ```
//!
//! The whole probe runs under one deadline. Nothing but the request line, `Host`, a fixed
//! `User-Agent`, `Accept`, `Connection: close` and, to a proxy that demands them, its
//! credentials (`Proxy-Authorization`, on the CONNECT or the absolute-form GET only, never inside
//! a tunnel) is sent: in particular no tracing header ever travels through a proxy to an
//! external site. Only the response head is read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The `User-Agent` of probe requests.
pub const USER_AGENT: &str = "egress-proxy-health/1";

/// A response head longer than this is not an HTTP/1 answer a probe expects.
const MAX_HEAD: usize = 16 * 1024;

/// Why a probe failed. Its `Display` is a short reason, fit for a span status or a log line; it
/// never carries a response body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("the target URL is not usable: {0}")]
    BadUrl(String),
    #[error("the proxy is unreachable: {0}")]
    Unreachable(String),
    /// A 407, or a 401 to a CONNECT (what tinyproxy answers wrong credentials).
    #[error("the proxy refused the probe's credentials or asked for some (407)")]
    ProxyAuthRequired,
    #[error("the proxy refused the tunnel with {0}")]
    TunnelRefused(u16),
    #[error("TLS with the target failed: {0}")]
    Tls(String),
    #[error("the target answered {got}, expected {expected}")]
    WrongStatus { got: u16, expected: u16 },
    #[error("the connection failed mid-probe: {0}")]
    Io(String),
    #[error("a malformed HTTP answer: {0}")]
    Malformed(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The proxy's address is an internal one, and the probe was told to refuse those (External
    /// proxies): nothing was dialled.
    #[error("the proxy's address {0}; internal destinations are not dialled")]
    Internal(String),
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub result: Result<(), ProbeError>,
    /// The duration of the whole probe.
    pub latency: Duration,
}

impl ProbeOutcome {
    pub fn ok(&self) -> bool {
        self.result.is_ok()
    }
}

/// The TLS client settings of probes: the system's roots by default, or a given root store.
#[derive(Clone)]
pub struct ProbeTls(Arc<rustls::ClientConfig>);

impl std::fmt::Debug for ProbeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeTls").finish_non_exhaustive()
    }
}

impl ProbeTls {
    /// Trusts the system's CA roots (`/etc/ssl/certs` on Debian).
    ///
    /// # Errors
    ///
    /// No root could be loaded.
    pub fn system() -> Result<Self, String> {
        let loaded = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let (added, _ignored) = roots.add_parsable_certificates(loaded.certs);
        if added == 0 {
            return Err(format!(
                "no CA root could be loaded from the system ({} errors)",
                loaded.errors.len()
            ));
        }
        Ok(Self::with_roots(roots))
    }

    /// Trusts the system's roots and the certificates of PEM text `pem` (a private target's CA,
    /// as read from a file).
    ///
    /// # Errors
    ///
    /// `pem` is not PEM, holds no certificate, or no root can be loaded at all.
    pub fn system_and_pem(pem: &[u8]) -> Result<Self, String> {
        use rustls::pki_types::pem::PemObject as _;
        // The file first: an unusable one is refused without reading the system's store.
        let extra = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("not PEM: {e}"))?;
        if extra.is_empty() {
            return Err("no certificate in it".to_owned());
        }
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(extra);
        if added == 0 {
            return Err("no usable CA certificate in it".to_owned());
        }
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        Ok(Self::with_roots(roots))
    }

    /// Trusts exactly `roots` (tests, air-gapped clusters).
    pub fn with_roots(roots: rustls::RootCertStore) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth())
            .unwrap_or_else(|_| unreachable!("ring supports the default protocol versions"));
        let mut config = config;
        // NB: no session resumption. A ticket issued through one proxy and shown through another
        // would tell the target that all the egress addresses are one client.
        config.resumption = rustls::client::Resumption::disabled();
        Self(Arc::new(config))
    }
}

/// Where and what to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeRequest {
    /// The proxy, `host:port`.
    pub proxy: String,
    /// The target, `https://...` or `http://...`.
    pub url: String,
    /// The status the target must answer.
    pub expected_status: u16,
    /// The budget of the whole probe.
    pub timeout: Duration,
    /// Sent to the proxy as `Proxy-Authorization: Basic ...` when given.
    pub credentials: Option<egress_credentials::Credentials>,
    /// When given (External proxies), the proxy's host is resolved first, and the probe is
    /// refused, with no connection made, when any address it resolves to is internal.
    pub destinations: Option<std::sync::Arc<egress_netguard::Guard>>,
}

/// The host of target `url` as the probe reads it (brackets of an IPv6 literal removed).
///
/// # Errors
/// What the probe would refuse: another scheme, no host, credentials in the URL.
pub fn target_host(url: &str) -> Result<String, ProbeError> {
    target(url).map(|t| t.host)
}

/// Whether a probe can use `url` as its target (for flags and validation at start).
///
/// # Errors
///
/// What the probe would refuse: another scheme, no host, credentials in the URL.
pub fn check_url(url: &str) -> Result<(), ProbeError> {
    target(url).map(drop)
}

/// The parts of a target URL a probe needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) tls: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// `host` or `host:port` as the `Host` header carries it.
    pub(crate) host_header: String,
    pub(crate) path: String,
}

pub(crate) fn target(url: &str) -> Result<Target, ProbeError> {
    let uri: http::Uri = url.parse().map_err(|e| ProbeError::BadUrl(format!("{e}")))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(ProbeError::BadUrl("the scheme must be http or https".into())),
    };
    let authority = uri.authority().ok_or_else(|| ProbeError::BadUrl("no host".into()))?;
    if authority.as_str().contains('@') {
        return Err(ProbeError::BadUrl("credentials in the URL are not supported".into()));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if host.is_empty() {
        return Err(ProbeError::BadUrl("no host".into()));
    }
    let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
    Ok(Target {
        tls,
        host,
        port,
        host_header: authority.as_str().to_string(),
        path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
    })
}

/// Reads one response head and returns its status code. Reads only up to the blank line, so
/// what follows (a tunnel's first bytes) stays in the reader.
async fn read_status<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> Result<u16, ProbeError> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        // Never more than the cap, even from a line that does not end.
        let room = (MAX_HEAD + 1 - head.len()) as u64;
        let n = (&mut *reader)
            .take(room)
            .read_until(b'\n', &mut head)
            .await
            .map_err(|e| ProbeError::Io(e.to_string()))?;
        if head.len() > MAX_HEAD {
            return Err(ProbeError::Malformed(format!(
                "the response head exceeds {MAX_HEAD} bytes"
            )));
        }
        if n == 0 {
            return Err(ProbeError::Malformed(
                "the connection closed before the response head ended".into(),
            ));
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            break;
        }
    }
    parse_status_line(&head)
}

/// The status code of an HTTP/1 response head (`HTTP/1.1 204 No Content`).
fn parse_status_line(head: &[u8]) -> Result<u16, ProbeError> {
    let first = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let text = std::str::from_utf8(first)
        .map_err(|_| ProbeError::Malformed("the status line is not text".into()))?
        .trim_end();
    let mut parts = text.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") || code.len() != 3 {
        return Err(ProbeError::Malformed(format!(
            "not an HTTP/1 status line: {:?}",
            clip(text)
        )));
    }
    code.parse()
        .ok()
        .filter(|c| (100..600).contains(c))
        .ok_or_else(|| ProbeError::Malformed(format!("not a status code: {:?}", clip(code))))
}

fn clip(text: &str) -> String {
    text.chars().take(64).collect()
}

/// `Proxy-Authorization: ...\r\n`, or nothing.
fn proxy_authorization(credentials: Option<&egress_credentials::Credentials>) -> String {
    credentials.map_or_else(String::new, |c| {
        format!("Proxy-Authorization: {}\r\n", c.basic_authorization())
    })
}

async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    request_target: &str,
    host: &str,
    proxy_auth: &str,
) -> Result<u16, ProbeError> {
    let mut stream = BufReader::new(stream);
    let request = format!(
        "GET {request_target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nAccept: */*\r\n{proxy_auth}Connection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| ProbeError::Io(e.to_string()))?;
    stream.flush().await.map_err(|e| ProbeError::Io(e.to_string()))?;
    read_status(&mut stream).await
}

/// Connects to the proxy at `proxy` (`host:port`). With `guard`, the addresses the host resolves
/// to are checked first: one internal address refuses them all (a name may answer with several,
/// and which one a connection takes is not ours to choose).
pub(crate) async fn connect_proxy(
    proxy: &str,
    guard: Option<&egress_netguard::Guard>,
) -> Result<TcpStream, ProbeError> {
    let unreachable = |e: std::io::Error| ProbeError::Unreachable(e.to_string());
    let Some(guard) = guard else {
        return TcpStream::connect(proxy).await.map_err(unreachable);
    };
    let addresses: Vec<std::net::SocketAddr> = tokio::net::lookup_host(proxy).await.map_err(unreachable)?.collect();
    if let Some((address, why)) = addresses
        .iter()
        .find_map(|a| guard.address(a.ip()).map(|why| (a.ip(), why)))
    {
        return Err(ProbeError::Internal(format!("{address} is {}", why.describe())));
    }
    TcpStream::connect(&addresses[..]).await.map_err(unreachable)
}

/// A `CONNECT` to the target's host and port through the proxy connection `tcp`, answered
/// 2xx: the tunnel (its reader holds whatever the proxy sent after its answer's head).
pub(crate) async fn tunnel(
    tcp: TcpStream,
    target: &Target,
    credentials: Option<&egress_credentials::Credentials>,
) -> Result<BufReader<TcpStream>, ProbeError> {
    let mut conn = BufReader::new(tcp);
    let authority = if target.host.contains(':') {
        format!("[{}]:{}", target.host, target.port)
    } else {
        format!("{}:{}", target.host, target.port)
    };
    let auth = proxy_authorization(credentials);
    let connect =
        format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: {USER_AGENT}\r\n{auth}\r\n");
    conn.write_all(connect.as_bytes())
        .await
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    conn.flush().await.map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    match read_status(&mut conn).await? {
        200..=299 => Ok(conn),
        401 | 407 => Err(ProbeError::ProxyAuthRequired),
        code => Err(ProbeError::TunnelRefused(code)),
    }
}

/// TLS with the target over `io`, its certificate verified with `tls`.
pub(crate) async fn tls_with<S: AsyncRead + AsyncWrite + Unpin>(
    io: S,
    target: &Target,
    tls: &ProbeTls,
) -> Result<tokio_rustls::client::TlsStream<S>, ProbeError> {
    let name =
        rustls::pki_types::ServerName::try_from(target.host.clone()).map_err(|e| ProbeError::BadUrl(e.to_string()))?;
    tokio_rustls::TlsConnector::from(tls.0.clone())
        .connect(name, io)
        .await
        .map_err(|e| ProbeError::Tls(e.to_string()))
}

async fn probe_inner(req: &ProbeRequest, tls: &ProbeTls) -> Result<(), ProbeError> {
    let target = target(&req.url)?;
    let tcp = connect_proxy(&req.proxy, req.destinations.as_deref()).await?;
    let _ = tcp.set_nodelay(true);
    let status = if target.tls {
        let conn = tunnel(tcp, &target, req.credentials.as_ref()).await?;
        let stream = tls_with(conn, &target, tls).await?;
        get(stream, &target.path, &target.host_header, "").await?
    } else {
        let absolute = format!("http://{}{}", target.host_header, target.path);
        let auth = proxy_authorization(req.credentials.as_ref());
        match get(tcp, &absolute, &target.host_header, &auth).await? {
            407 => return Err(ProbeError::ProxyAuthRequired),
            code => code,
        }
    };
    if status == req.expected_status {
        Ok(())
    } else {
        Err(ProbeError::WrongStatus {
            got: status,
            expected: req.expected_status,
        })
    }
}

/// Probes once. Never takes longer than `req.timeout` (plus scheduling noise).
pub async fn probe(req: &ProbeRequest, tls: &ProbeTls) -> ProbeOutcome {
    let started = Instant::now();
    let result = match tokio::time::timeout(req.timeout, probe_inner(req, tls)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Timeout(req.timeout)),
    };
    ProbeOutcome {
        result,
        latency: started.elapsed(),
    }
}

/// Fetches `url` straight from here, with no proxy, as a probe would fetch it through one:
/// whether the target itself answers `expected_status` (so a person can tell a target that is
/// down from proxies that are). Bounded by `timeout` as a probe is.
pub async fn fetch_directly(url: &str, expected_status: u16, timeout: Duration, tls: &ProbeTls) -> ProbeOutcome {
    let started = Instant::now();
    let result = match tokio::time::timeout(timeout, fetch_inner(url, expected_status, tls)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Timeout(timeout)),
    };
    ProbeOutcome {
        result,
        latency: started.elapsed(),
    }
}

async fn fetch_inner(url: &str, expected_status: u16, tls: &ProbeTls) -> Result<(), ProbeError> {
    let target = target(url)?;
    let tcp = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let status = if target.tls {
        let stream = tls_with(tcp, &target, tls).await?;
        get(stream, &target.path, &target.host_header, "").await?
    } else {
        get(tcp, &target.path, &target.host_header, "").await?
    };
    if status == expected_status {
        Ok(())
    } else {
        Err(ProbeError::WrongStatus {
            got: status,
            expected: expected_status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_urls() {
        let t = target("https://www.gstatic.com/generate_204").unwrap();
        assert_eq!(
            t,
            Target {
                tls: true,
                host: "www.gstatic.com".into(),
                port: 443,
                host_header: "www.gstatic.com".into(),
                path: "/generate_204".into()
            }
        );
        let t = target("http://[::1]:8080/x?y=1").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.path.as_str()), ("::1", 8080, "/x?y=1"));
        assert_eq!(target("http://h").unwrap().path, "/");
        for bad in ["ftp://h/", "/relative", "https://user:pw@h/", "not a url"] {
            assert!(matches!(target(bad), Err(ProbeError::BadUrl(_))), "{bad}");
        }
    }

    #[test]
    fn status_lines() {
        assert_eq!(parse_status_line(b"HTTP/1.1 204 No Content\r\n\r\n"), Ok(204));
        assert_eq!(
            parse_status_line(b"HTTP/1.0 200 Connection established\r\n\r\n"),
            Ok(200)
        );
        assert_eq!(parse_status_line(b"HTTP/1.1 407\r\n\r\n"), Ok(407));
        for bad in [
            &b"SSH-2.0-OpenSSH\r\n"[..],
            b"HTTP/1.1 2000 x\r\n",
            b"HTTP/1.1 abc x\r\n",
            b"\xff\xfe\r\n",
            b"HTTP/2 200\r\n",
        ] {
            assert!(
                matches!(parse_status_line(bad), Err(ProbeError::Malformed(_))),
                "{bad:?}"
            );
        }
    }
}
