//! An echo target: answers a `GET` with the address it sees the request come from, as an IP echo
//! service does, over plain HTTP or TLS; or, on demand, with what a broken or hostile echo
//! sends (nothing, a list, an answer too long, something that is not an address). The exit
//! check's tests and `cargo xtask dev` run it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::Pki;

/// What the echo answers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Echo {
    /// The peer's address, as plain text.
    #[default]
    Address,
    /// The peer's address as JSON `{"origin": ...}`.
    Json,
    /// The peer's address and another, as a list (what httpbin answers behind a forwarding
    /// proxy).
    List,
    /// This text, whatever the peer.
    Text(String),
    /// Reads the request and never answers.
    Hang,
}

/// A running echo target.
#[derive(Debug, Clone)]
pub struct EchoTarget {
    pub addr: SocketAddr,
    mode: Arc<Mutex<Echo>>,
    /// The peers it answered, in order.
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    tls: bool,
}

/// The longest request head read.
const HEAD_LIMIT: usize = 16 * 1024;
/// How long one connection is given (a hanging echo holds it this long).
const CONNECTION_BUDGET: Duration = Duration::from_secs(120);

impl EchoTarget {
    /// A plain-HTTP echo on `ip`.
    pub async fn http(ip: &str) -> Self {
        Self::start(ip, None).await
    }

    /// An https echo on `ip`, its certificate from `pki` (which must name `ip`).
    pub async fn https(pki: &Pki, ip: &str) -> Self {
        Self::start(ip, Some(tokio_rustls::TlsAcceptor::from(pki.server.clone()))).await
    }

    async fn start(ip: &str, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let target = Self {
            addr: listener.local_addr().unwrap(),
            mode: Arc::default(),
            peers: Arc::default(),
            tls: tls.is_some(),
        };
        let kept = target.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, peer)) = listener.accept().await else {
                    return;
                };
                let (echo, tls) = (kept.clone(), tls.clone());
                tokio::spawn(async move {
                    let work = async {
                        match tls {
                            Some(acceptor) => {
                                if let Ok(stream) = acceptor.accept(tcp).await {
                                    echo.answer(stream, peer).await;
                                }
                            }
                            None => echo.answer(tcp, peer).await,
                        }
                    };
                    let _ = tokio::time::timeout(CONNECTION_BUDGET, work).await;
                });
            }
        });
        target
    }

    /// The URL to give the operator.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}/ip", self.addr)
    }

    /// Answers from now on as `mode` says.
    pub fn answer_as(&self, mode: Echo) {
        *self.mode.lock().unwrap() = mode;
    }

    /// The peers answered so far.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().unwrap().clone()
    }

    async fn answer<S: AsyncRead + AsyncWrite + Unpin>(&self, stream: S, peer: SocketAddr) {
        let mut conn = BufReader::new(stream);
        let mut read = 0;
        loop {
            let mut line = String::new();
            match conn.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
            if line == "\r\n" || line == "\n" || read > HEAD_LIMIT {
                break;
            }
        }
        self.peers.lock().unwrap().push(peer);
        let mode = self.mode.lock().unwrap().clone();
        let body = match mode {
            Echo::Address => peer.ip().to_string(),
            Echo::Json => format!("{{\"origin\": \"{}\"}}", peer.ip()),
            Echo::List => format!("{}, 198.51.100.1", peer.ip()),
            Echo::Text(text) => text,
            Echo::Hang => return std::future::pending().await,
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.get_mut().write_all(response.as_bytes()).await;
        let _ = conn.get_mut().shutdown().await;
    }
}
