//! The exit check: the address a target sees when a request comes through a proxy.
//!
//! An echo URL answers its caller's address. Fetched through a proxy, as a probe goes (the same
//! connection, tunnel, credentials and budget), it gives the proxy's exit; fetched straight from
//! here, the operator's own.
//!
//! ```text
//!  through a proxy: TCP ─► CONNECT (https) or absolute-form GET (http) ─► GET echo ─► 2xx, ≤ 1 KiB ─► one IP
//!  directly:        TCP ─► TLS (https) ─────────────────────────────────► GET echo ─► 2xx, ≤ 1 KiB ─► one IP
//! ```
//!
//! The answer must be one IP literal, as plain text or as the JSON field `ip` or `origin`. A
//! list (`a, b`, as httpbin answers behind a forwarding proxy), a longer answer, or anything
//! else is refused: an exit is known only when it is unambiguous.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::probe::{self, ProbeError, ProbeRequest, ProbeTls, Target};

/// The longest echo answer read.
pub const MAX_ECHO_BODY: usize = 1024;

/// Why an exit is unknown. Its `Display` is a short reason for a condition's message; it never
/// carries the echo's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EchoError {
    /// The request itself failed, as a probe would.
    #[error("{0}")]
    Fetch(#[from] ProbeError),
    #[error("the echo answered {0}")]
    Status(u16),
    #[error("the echo's answer is longer than {MAX_ECHO_BODY} bytes")]
    TooLong,
    #[error("the echo answered a list of addresses (a forwarding proxy adds its own)")]
    List,
    #[error("the echo's answer is not one IP address")]
    NotAnAddress,
}

/// The one address an echo answer names.
///
/// # Errors
/// An answer over [`MAX_ECHO_BODY`] bytes, a list, or anything but one IP literal as text or as
/// JSON `ip` or `origin`.
pub fn parse_echo(body: &[u8]) -> Result<IpAddr, EchoError> {
    if body.len() > MAX_ECHO_BODY {
        return Err(EchoError::TooLong);
    }
    let text = std::str::from_utf8(body).map_err(|_| EchoError::NotAnAddress)?.trim();
    if !text.starts_with('{') {
        return literal(text);
    }
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|_| EchoError::NotAnAddress)?;
    let field = object
        .get("ip")
        .or_else(|| object.get("origin"))
        .and_then(serde_json::Value::as_str)
        .ok_or(EchoError::NotAnAddress)?;
    literal(field.trim())
}

fn literal(text: &str) -> Result<IpAddr, EchoError> {
    if text.contains(',') {
        return Err(EchoError::List);
    }
    text.parse().map_err(|_| EchoError::NotAnAddress)
}

/// The exit of the proxy `req.proxy`: `req.url` (the echo) fetched through it, under
/// `req.timeout` as a probe is. `req.expected_status` is not read: any 2xx answer counts.
///
/// # Errors
/// What the fetch met, or what [`parse_echo`] refuses.
pub async fn exit_through(req: &ProbeRequest, tls: &ProbeTls) -> Result<IpAddr, EchoError> {
    let body = within(req.timeout, body_through(req, tls)).await?;
    parse_echo(&body)
}

/// This process's own exit: the echo at `url` fetched straight from here, under `timeout`.
///
/// # Errors
/// As [`exit_through`].
pub async fn own_exit(url: &str, timeout: Duration, tls: &ProbeTls) -> Result<IpAddr, EchoError> {
    let body = within(timeout, body_directly(url, tls)).await?;
    parse_echo(&body)
}

async fn within<T>(
    budget: Duration,
    work: impl std::future::Future<Output = Result<T, EchoError>>,
) -> Result<T, EchoError> {
    tokio::time::timeout(budget, work)
        .await
        .unwrap_or(Err(EchoError::Fetch(ProbeError::Timeout(budget))))
}

async fn body_through(req: &ProbeRequest, tls: &ProbeTls) -> Result<Bytes, EchoError> {
    let target = probe::target(&req.url)?;
    let tcp = probe::connect_proxy(&req.proxy, req.destinations.as_deref()).await?;
    let _ = tcp.set_nodelay(true);
    if target.tls {
        let tunnel = probe::tunnel(tcp, &target, req.credentials.as_ref()).await?;
        let stream = probe::tls_with(tunnel, &target, tls).await?;
        get_body(stream, &target, &target.path, None).await
    } else {
        let absolute = format!("http://{}{}", target.host_header, target.path);
        get_body(tcp, &target, &absolute, req.credentials.as_ref()).await
    }
}

async fn body_directly(url: &str, tls: &ProbeTls) -> Result<Bytes, EchoError> {
    let target = probe::target(url)?;
    let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| ProbeError::Unreachable(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    if target.tls {
        let stream = probe::tls_with(tcp, &target, tls).await?;
        get_body(stream, &target, &target.path, None).await
    } else {
        get_body(tcp, &target, &target.path, None).await
    }
}

/// One GET of `request_target` over `io` (HTTP/1.1, the probe's headers), its 2xx answer's body
/// read up to [`MAX_ECHO_BODY`] bytes.
async fn get_body<S>(
    io: S,
    target: &Target,
    request_target: &str,
    credentials: Option<&egress_credentials::Credentials>,
) -> Result<Bytes, EchoError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io_error = |e: hyper::Error| EchoError::Fetch(ProbeError::Io(e.to_string()));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(io_error)?;
    let mut request = hyper::Request::get(request_target)
        .header(http::header::HOST, &target.host_header)
        .header(http::header::USER_AGENT, probe::USER_AGENT)
        .header(http::header::ACCEPT, "*/*")
        .header(http::header::CONNECTION, "close");
    if let Some(c) = credentials {
        request = request.header(http::header::PROXY_AUTHORIZATION, c.basic_authorization());
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| ProbeError::BadUrl(e.to_string()))?;
    let exchange = async {
        let answer = sender.send_request(request).await.map_err(io_error)?;
        let status = answer.status().as_u16();
        if credentials.is_some() && status == 407 {
            return Err(EchoError::Fetch(ProbeError::ProxyAuthRequired));
        }
        if !answer.status().is_success() {
            return Err(EchoError::Status(status));
        }
        match Limited::new(answer.into_body(), MAX_ECHO_BODY).collect().await {
            Ok(body) => Ok(body.to_bytes()),
            Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(EchoError::TooLong),
            Err(e) => Err(EchoError::Fetch(ProbeError::Io(e.to_string()))),
        }
    };
    // The connection is driven here, beside the exchange, so nothing outlives the budget.
    let mut exchange = std::pin::pin!(exchange);
    tokio::select! {
        done = &mut exchange => done,
        ended = conn => {
            ended.map_err(io_error)?;
            exchange.await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_answer_names_one_address_or_none() {
        let v4: IpAddr = "203.0.113.7".parse().unwrap();
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        assert_eq!(parse_echo(b"203.0.113.7\n"), Ok(v4));
        assert_eq!(parse_echo(b"  2001:db8::7  "), Ok(v6));
        assert_eq!(parse_echo(br#"{"ip": "203.0.113.7"}"#), Ok(v4));
        assert_eq!(parse_echo(br#"{"origin": "203.0.113.7", "x": 1}"#), Ok(v4));
        assert_eq!(
            parse_echo(br#"{"origin": "203.0.113.7, 198.51.100.1"}"#),
            Err(EchoError::List)
        );
        assert_eq!(parse_echo(b"203.0.113.7, 198.51.100.1"), Err(EchoError::List));
        for not in [
            &b""[..],
            b"hello",
            b"203.0.113.7 198.51.100.1",
            b"203.0.113.7:80",
            b"<html>203.0.113.7</html>",
            br#"{"ip": 7}"#,
            br#"{"address": "203.0.113.7"}"#,
            br#"["203.0.113.7"]"#,
            b"\xff\xfe",
            b"{not json",
        ] {
            assert_eq!(parse_echo(not), Err(EchoError::NotAnAddress), "{not:?}");
        }
        let long = format!("{}203.0.113.7", " ".repeat(MAX_ECHO_BODY));
        assert_eq!(parse_echo(long.as_bytes()), Err(EchoError::TooLong));
    }
}
