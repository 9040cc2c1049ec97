//! Network parts the probe tests talk to: TLS and plain HTTP targets that answer the status a
//! request's path ends with and record what they saw, and a scripted proxy for the faults a
//! real one cannot be made to do on demand. Also the greeting target `cargo xtask dev` runs its
//! whole system against, so the dev run and the tests share one PKI and one target.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::Pki;

/// Request heads a target received: (request line, header names lowercased).
pub type Seen = Arc<Mutex<Vec<(String, Vec<String>)>>>;

/// What a target answers a request with.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// The status the request's path ends with (`/204`, `/generate_204`, `/500`), 404 otherwise.
    StatusInPath,
    /// `204` to the health probe's `GET /generate_204`, `200` with this text (and a line end)
    /// to anything else: a page a person or a smoke check can read through a proxy.
    Greeting(&'static str),
}

/// The longest request head a greeting target reads before it answers anyway.
const GREETING_HEAD_LIMIT: usize = 16 * 1024;
/// How long a greeting target gives one connection.
const GREETING_CONNECTION_BUDGET: Duration = Duration::from_secs(30);

impl Reply {
    /// The most bytes of a request head read before answering.
    fn head_limit(self) -> usize {
        match self {
            Self::StatusInPath => usize::MAX,
            Self::Greeting(_) => GREETING_HEAD_LIMIT,
        }
    }

    /// The whole response to a request whose first line is `request_line`.
    fn response(self, request_line: &str) -> String {
        match self {
            Self::StatusInPath => {
                let code = status_in_path(request_line);
                format!("HTTP/1.1 {code} Test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            }
            Self::Greeting(_) if request_line.starts_with("GET /generate_204 ") => {
                "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_owned()
            }
            Self::Greeting(greeting) => {
                let body = format!("{greeting}\n");
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            }
        }
    }
}

/// The status a request line's path ends with (`/204`, `/generate_204`), 404 when it ends with
/// no status.
fn status_in_path(request_line: &str) -> u16 {
    let path = request_line.split(' ').nth(1).unwrap_or_default();
    let digits: String = path
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok().filter(|c| (100..600).contains(c)).unwrap_or(404)
}

/// A request's head: its first line and its header names lowercased; `None` when the
/// connection closed before a line. Stops reading once `limit` bytes are read.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut BufReader<S>, limit: usize) -> Option<(String, Vec<String>)> {
    let mut line = String::new();
    let mut read = stream.read_line(&mut line).await.unwrap_or(0);
    if read == 0 {
        return None;
    }
    let request_line = line.trim_end().to_string();
    let mut names = Vec::new();
    while read < limit {
        let mut h = String::new();
        let n = stream.read_line(&mut h).await.unwrap_or(0);
        if n == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        read += n;
        if let Some((name, _)) = h.split_once(':') {
            names.push(name.trim().to_ascii_lowercase());
        }
    }
    Some((request_line, names))
}

/// Reads one request, records its head in `seen` and answers it as `reply` says.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(stream: S, seen: Seen, reply: Reply) {
    let mut stream = BufReader::new(stream);
    let Some((request_line, names)) = read_head(&mut stream, reply.head_limit()).await else {
        return;
    };
    let response = reply.response(&request_line);
    seen.lock().unwrap().push((request_line, names));
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
}

/// Serves TLS on `listener` from a task of its own: each connection answered as `reply` says,
/// within `budget` when one is given.
fn serve_tls(listener: TcpListener, pki: &Pki, seen: Seen, reply: Reply, budget: Option<Duration>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let answered = async {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        answer(tls, seen, reply).await;
                    }
                };
                match budget {
                    // NB: bounded, so a client that never finishes its request holds no task.
                    Some(budget) => {
                        let _ = tokio::time::timeout(budget, answered).await;
                    }
                    None => answered.await,
                }
            });
        }
    });
}

/// A TLS target on 127.0.0.1; returns its address and what it saw.
pub async fn tls_target(pki: &Pki) -> (SocketAddr, Seen) {
    tls_target_at(pki, "127.0.0.1").await
}

/// A TLS target on address `ip` (any port); returns its address and what it saw.
pub async fn tls_target_at(pki: &Pki, ip: &str) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    serve_tls(listener, pki, seen.clone(), Reply::StatusInPath, None);
    (addr, seen)
}

/// A TLS target on 127.0.0.1 for a whole system run by hand (`cargo xtask dev`): `204` to the
/// health probe's `GET /generate_204`, `200` with `greeting` to anything else. It reads at most
/// 16 KiB of a request's head and gives a connection 30 s.
///
/// # Errors
///
/// No port could be bound on 127.0.0.1.
pub async fn tls_greeting_target(pki: &Pki, greeting: &'static str) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let reply = Reply::Greeting(greeting);
    serve_tls(listener, pki, Seen::default(), reply, Some(GREETING_CONNECTION_BUDGET));
    Ok(addr)
}

/// A TLS target on 127.0.0.1 that can be stopped (its port then refuses connections) and started
/// again on the same port: a probe target that goes down and comes back.
pub struct StoppableTlsTarget {
    addr: SocketAddr,
    server: Arc<rustls::ServerConfig>,
    seen: Seen,
    serving: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for StoppableTlsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoppableTlsTarget")
            .field("addr", &self.addr)
            .field("serving", &self.serving.is_some())
            .finish_non_exhaustive()
    }
}

impl StoppableTlsTarget {
    /// A target that serves from the start.
    pub async fn start(pki: &Pki) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let mut target = Self {
            addr: listener.local_addr().unwrap(),
            server: pki.server.clone(),
            seen: Arc::default(),
            serving: None,
        };
        target.serve(listener);
        target
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and closes the port; returns once it is closed.
    pub async fn stop(&mut self) {
        if let Some(task) = self.serving.take() {
            task.abort();
            // The listener is dropped with the aborted task: awaited, the port is closed.
            let _ = task.await;
        }
    }

    /// Serves again on the same port.
    pub async fn resume(&mut self) {
        if self.serving.is_none() {
            let listener = TcpListener::bind(self.addr)
                .await
                .expect("the target's port is free again");
            self.serve(listener);
        }
    }

    fn serve(&mut self, listener: TcpListener) {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server.clone());
        let seen = self.seen.clone();
        self.serving = Some(tokio::spawn(async move {
            let mut answering = tokio::task::JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (acceptor, seen) = (acceptor.clone(), seen.clone());
                answering.spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        answer(tls, seen, Reply::StatusInPath).await;
                    }
                });
                while answering.try_join_next().is_some() {}
            }
        }));
    }
}

/// A plain HTTP target on 127.0.0.1.
pub async fn http_target() -> (SocketAddr, Seen) {
    http_target_at("127.0.0.1").await
}

/// A plain HTTP target on address `ip` (any port).
pub async fn http_target_at(ip: &str) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let kept = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            tokio::spawn(answer(tcp, kept.clone(), Reply::StatusInPath));
        }
    });
    (addr, seen)
}

/// What the scripted proxy does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Accepts and never answers.
    Silent,
    /// Answers 407 Proxy Authentication Required.
    AuthRequired,
    /// Accepts the tunnel, then closes it before any TLS.
    CloseMidTunnel,
    /// Answers the CONNECT only after a long pause.
    Slow,
    /// Streams a megabyte without a line end.
    Endless,
    /// Answers bytes that are not HTTP.
    Garbage,
}

/// A scripted proxy on 127.0.0.1.
pub async fn fault_proxy(fault: Fault) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let mut conn = BufReader::new(tcp);
            let mut line = String::new();
            let _ = conn.read_line(&mut line).await;
            loop {
                let mut h = String::new();
                if conn.read_line(&mut h).await.unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            match fault {
                Fault::Silent => held.push(conn),
                Fault::AuthRequired => {
                    let _ = conn
                        .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"x\"\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    held.push(conn);
                }
                Fault::CloseMidTunnel => {
                    let _ = conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
                    drop(conn);
                }
                Fault::Endless => {
                    let _ = conn.write_all(&vec![b'x'; 1 << 20]).await;
                    held.push(conn);
                }
                Fault::Garbage => {
                    let _ = conn.write_all(b"\x16\x03\x01\x00\xff\r\n\r\n").await;
                    held.push(conn);
                }
                Fault::Slow => {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        let _ = conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
                    });
                }
            }
        }
    });
    addr
}

/// A free port on 127.0.0.1; panics when [`try_free_port`] finds none.
pub fn free_port() -> u16 {
    try_free_port().unwrap()
}

/// The lowest port [`try_free_port`] picks from.
const LOWEST_PICKED_PORT: u16 = 20_000;

/// A port on 127.0.0.1 that nothing listens on as this returns, for a process started next to
/// bind.
///
/// It is picked at random below the kernel's ephemeral range: a port from `bind(..:0)`, once
/// released, is soon handed again to another socket's `bind(..:0)` or outgoing connection (the
/// process about to use it makes such connections itself), which then holds it when the intended
/// user binds. Below that range only a bind of that very port can take it in between. Where the
/// range leaves no room below it, the kernel's pick is the answer.
pub fn try_free_port() -> std::io::Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_low.saturating_sub(LOWEST_PICKED_PORT);
    if span >= 1_000 {
        let random = std::hash::RandomState::new();
        for attempt in 0..64_u32 {
            let pick = std::hash::BuildHasher::hash_one(&random, (std::process::id(), attempt));
            let port = LOWEST_PICKED_PORT + u16::try_from(pick % u64::from(span)).unwrap_or(0);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// An address on 127.0.0.1 that refuses every connection for as long as this value lives.
///
/// Its socket is bound and never listens: a connection gets a reset (refused), and no other
/// socket can take the port meanwhile. (A port freed by a dropped listener can be handed out
/// again at once, to an outgoing connection of the very test that expects a refusal.) Keep the
/// value until the last connection attempt.
#[derive(Debug)]
pub struct DeadAddress {
    addr: SocketAddr,
    _held: tokio::net::TcpSocket,
}

impl DeadAddress {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl std::fmt::Display for DeadAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.addr.fmt(f)
    }
}

/// Connects to nothing: see [`DeadAddress`].
pub async fn dead_address() -> DeadAddress {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    DeadAddress {
        addr: socket.local_addr().unwrap(),
        _held: socket,
    }
}

/// A connection to `addr`.
pub async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_target_answers_the_status_its_path_ends_with() {
        assert_eq!(status_in_path("GET /generate_204 HTTP/1.1"), 204);
        assert_eq!(status_in_path("GET /500 HTTP/1.1"), 500);
        assert_eq!(status_in_path("GET / HTTP/1.1"), 404);
        assert_eq!(status_in_path("GET /999 HTTP/1.1"), 404, "not a status");
        assert_eq!(status_in_path("garbage"), 404);
    }

    #[test]
    fn a_greeting_target_answers_the_probe_with_204_and_anything_else_with_its_greeting() {
        let reply = Reply::Greeting("hello");
        assert!(
            reply
                .response("GET /generate_204 HTTP/1.1")
                .starts_with("HTTP/1.1 204 ")
        );
        let page = reply.response("GET / HTTP/1.1");
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(page.contains("Content-Length: 6\r\n") && page.ends_with("\r\n\r\nhello\n"));
        assert!(
            reply
                .response("HEAD /generate_204 HTTP/1.1")
                .starts_with("HTTP/1.1 200 ")
        );
    }
}
