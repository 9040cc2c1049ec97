//! The client side of the bench, as a crawler speaks it: a `CONNECT` through a proxy with Basic
//! credentials, then TLS and one request through the tunnel. Every connect, write and read has
//! its own time limit, so a stuck proxy costs a sample, never the run.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A connection to a proxy, at most.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Each write, each read, the TLS handshake, at most.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// A proxy's answer head, at most.
const MAX_HEAD: usize = 16 * 1024;

/// `Basic base64(user:password)`.
pub(crate) fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        data_encoding::BASE64.encode(format!("{user}:{password}").as_bytes())
    )
}

/// `work` within `limit`, its error and a timeout both as text naming `what`.
async fn within<T, E: std::fmt::Display>(
    what: &str,
    limit: Duration,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, work).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no progress within {limit:?}")),
    }
}

/// A tunnel to `destination` through the proxy at `proxy`, which is sent `authorization` as its
/// `Proxy-Authorization`: the connection once the proxy answered 200, and any bytes that came
/// after its answer head (a streaming destination may already have sent some).
pub(crate) async fn open_tunnel(
    proxy: SocketAddr,
    authorization: &str,
    destination: SocketAddr,
) -> Result<(TcpStream, Vec<u8>), String> {
    let mut tcp = within("connect", CONNECT_TIMEOUT, TcpStream::connect(proxy)).await?;
    // As a crawler's HTTP client does: small writes (the CONNECT, the TLS flights) go out at once.
    let _ = tcp.set_nodelay(true);
    let request = format!(
        "CONNECT {destination} HTTP/1.1\r\nHost: {destination}\r\nProxy-Authorization: {authorization}\r\n\r\n"
    );
    within("send CONNECT", IO_TIMEOUT, tcp.write_all(request.as_bytes())).await?;
    let (head, rest) = read_head(&mut tcp).await?;
    let status_line = head.lines().next().unwrap_or_default();
    if status_line.split(' ').nth(1) != Some("200") {
        return Err(format!("the proxy answered {status_line:?}"));
    }
    Ok((tcp, rest))
}

/// An answer head (up to its blank line) and the bytes read past it.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(String, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > MAX_HEAD {
            return Err("the proxy's answer head is too long".into());
        }
        let n = within("read the proxy's answer", IO_TIMEOUT, stream.read(&mut chunk)).await?;
        if n == 0 {
            return Err("the proxy closed before answering".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A new tunnel through `proxy` to the HTTPS `target`, TLS through it, `GET /200`, the whole
/// answer read (the target closes after it), then closed: one sample of the request bench.
pub(crate) async fn https_request(
    proxy: SocketAddr,
    authorization: &str,
    target: SocketAddr,
    tls: &TlsConnector,
) -> Result<(), String> {
    let (tcp, rest) = open_tunnel(proxy, authorization, target).await?;
    if !rest.is_empty() {
        return Err("bytes from the target before TLS began".into());
    }
    let name = rustls::pki_types::ServerName::IpAddress(target.ip().into());
    let mut tls = within("TLS handshake", IO_TIMEOUT, tls.connect(name, tcp)).await?;
    let get = format!("GET /200 HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    within("send GET", IO_TIMEOUT, tls.write_all(get.as_bytes())).await?;
    let mut answer = Vec::with_capacity(256);
    within("read the answer", IO_TIMEOUT, tls.read_to_end(&mut answer)).await?;
    if !answer.starts_with(b"HTTP/1.1 200 ") {
        let line = String::from_utf8_lossy(&answer);
        return Err(format!(
            "the target answered {:?}",
            line.lines().next().unwrap_or_default()
        ));
    }
    Ok(())
}
