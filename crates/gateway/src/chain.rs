//! Chaining: a tunnel to a destination through a leased backend proxy. The gateway's `CONNECT`
//! to the backend carries the backend's own credentials (from the lease, never the client's),
//! and the tunnel is handed back only once the backend answered 2xx, so no byte of the client's
//! reaches a backend before then. The backend decides where its tunnels may go (Squid's ACLs,
//! tinyproxy's `ConnectPort`): the gateway dials nothing else.
//!
//! hyper's HTTP/1 client sends the `CONNECT` and reads the answer (its head bounded by
//! [`Limits::max_head`]), and hands the connection over as the tunnel, with any bytes the
//! backend sent after its answer.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A leased backend proxy: where it listens and the credentials it asks for.
#[derive(Clone)]
pub struct Backend {
    pub addr: SocketAddr,
    /// Its user and password; `None`: it asks for none.
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is the backend's secret: never printed.
        f.debug_struct("Backend")
            .field("addr", &self.addr)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

/// What a tunnel's setup may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From the dial to the backend's answer.
    pub budget: Duration,
    /// The backend's answer head, at most (hyper's floor is 8 KiB).
    pub max_head: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            budget: Duration::from_secs(10),
            max_head: 16 * 1024,
        }
    }
}

/// Why no tunnel was made. The backend's own words are never kept: its answer may echo what it
/// was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("the backend proxy could not be reached: {0}")]
    Dial(String),
    #[error("the backend proxy did not answer the CONNECT within {0:?}")]
    Timeout(Duration),
    #[error("the backend proxy refused the tunnel with {0}")]
    Refused(StatusCode),
    #[error("the backend proxy answered something that is not HTTP/1.1 within the limits")]
    Protocol,
}

impl ChainError {
    /// Whether another backend may do better: everything but a backend's refusal of the
    /// destination itself (403 and the like say the destination is not allowed anywhere).
    pub fn worth_another(&self) -> bool {
        match self {
            Self::Dial(_) | Self::Timeout(_) | Self::Protocol => true,
            Self::Refused(status) => !matches!(*status, StatusCode::FORBIDDEN | StatusCode::BAD_REQUEST),
        }
    }
}

/// A tunnel: the connection to the backend once it answered 2xx.
pub type Tunnel = TokioIo<hyper::upgrade::Upgraded>;

/// A tunnel to `authority` (`host:port`) through `backend`, within `limits`.
///
/// # Errors
/// [`ChainError`] says what went wrong; nothing was sent but the `CONNECT`.
pub async fn tunnel(backend: &Backend, authority: &str, limits: Limits) -> Result<Tunnel, ChainError> {
    within(limits.budget, open(backend, authority, limits.max_head)).await
}

/// A plain-HTTP request sent on to `backend` as it is (absolute form, the caller's headers), and
/// the head of its answer, within `limits`.
///
/// # Errors
/// [`ChainError`] for a backend that could not be reached or did not answer HTTP in time.
pub async fn forward<B>(backend: &Backend, req: Request<B>, limits: Limits) -> Result<Response<Incoming>, ChainError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    within(limits.budget, async {
        let (mut sender, connection) = dial(backend, limits.max_head).await?;
        tokio::spawn(connection);
        sender.send_request(req).await.map_err(|_| ChainError::Protocol)
    })
    .await
}

async fn within<T>(budget: Duration, work: impl Future<Output = Result<T, ChainError>>) -> Result<T, ChainError> {
    tokio::time::timeout(budget, work)
        .await
        .unwrap_or(Err(ChainError::Timeout(budget)))
}

/// An HTTP/1 connection to `backend`: the sender of its requests, and the connection, which
/// the caller drives.
async fn dial<B>(
    backend: &Backend,
    max_head: usize,
) -> Result<(SendRequest<B>, Connection<TokioIo<TcpStream>, B>), ChainError>
where
    B: hyper::body::Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = TcpStream::connect(backend.addr)
        .await
        .map_err(|e| ChainError::Dial(e.kind().to_string()))?;
    let _ = tcp.set_nodelay(true);
    hyper::client::conn::http1::Builder::new()
        .max_buf_size(max_head.max(8192))
        .handshake(TokioIo::new(tcp))
        .await
        .map_err(|_| ChainError::Protocol)
}

async fn open(backend: &Backend, authority: &str, max_head: usize) -> Result<Tunnel, ChainError> {
    let (mut sender, connection) = dial::<Empty<Bytes>>(backend, max_head).await?;
    // The connection runs until the upgrade takes it over (or the answer fails); it ends with
    // the tunnel's setup.
    let driving = tokio::spawn(connection.with_upgrades());
    let answer = sender
        .send_request(connect_request(backend, authority)?)
        .await
        .map_err(|_| ChainError::Protocol);
    let answer = match answer {
        Ok(a) if a.status().is_success() => a,
        Ok(a) => {
            driving.abort();
            return Err(ChainError::Refused(a.status()));
        }
        Err(e) => {
            driving.abort();
            return Err(e);
        }
    };
    let upgraded = hyper::upgrade::on(answer).await.map_err(|_| ChainError::Protocol)?;
    Ok(TokioIo::new(upgraded))
}

/// `CONNECT authority` with the backend's credentials.
fn connect_request(backend: &Backend, authority: &str) -> Result<Request<Empty<Bytes>>, ChainError> {
    let mut request = Request::builder()
        .method(Method::CONNECT)
        .uri(authority)
        .header(hyper::header::HOST, authority);
    if let Some((user, password)) = &backend.credentials {
        request = request.header(hyper::header::PROXY_AUTHORIZATION, basic(user, password));
    }
    // An authority hyper cannot read as one is not a destination: refused before any dial
    // would be better, and the fronts check it first; here it is the backend's refusal.
    request
        .body(Empty::new())
        .map_err(|_| ChainError::Refused(StatusCode::BAD_REQUEST))
}

/// `Basic <base64(user:password)>`.
pub(crate) fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        data_encoding::BASE64.encode(format!("{user}:{password}").as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_base64_of_user_colon_password() {
        // RFC 7617's example.
        assert_eq!(basic("Aladdin", "open sesame"), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
    }

    #[test]
    fn a_backends_password_is_never_printed() {
        let b = Backend {
            addr: "127.0.0.1:1".parse().unwrap(),
            credentials: Some(("user".into(), "s3cret-sentinel".into())),
        };
        assert!(!format!("{b:?}").contains("s3cret-sentinel"));
    }

    #[test]
    fn only_a_refusal_of_the_destination_is_not_worth_another_backend() {
        assert!(ChainError::Timeout(Duration::from_secs(1)).worth_another());
        assert!(ChainError::Refused(StatusCode::PROXY_AUTHENTICATION_REQUIRED).worth_another());
        assert!(ChainError::Refused(StatusCode::BAD_GATEWAY).worth_another());
        assert!(!ChainError::Refused(StatusCode::FORBIDDEN).worth_another());
    }
}
