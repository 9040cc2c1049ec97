//! Real and scripted network parts for the probe tests: a TLS target signed by a test CA, a plain
//! HTTP target, real tinyproxy processes, and an in-process proxy for faults a real one cannot be
//! made to do on demand.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_health::ProbeTls;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Request heads a target received: (request line, header names lowercased).
pub type Seen = Arc<Mutex<Vec<(String, Vec<String>)>>>;

/// A test CA and a target certificate for `localhost` and 127.0.0.1.
pub struct Pki {
    pub ca_der: rustls::pki_types::CertificateDer<'static>,
    /// The CA certificate as a PEM file's text.
    pub ca_pem: String,
    pub server: Arc<rustls::ServerConfig>,
}

pub fn pki() -> Pki {
    pki_for(&["localhost", "127.0.0.1"])
}

/// A test CA and a target certificate for `names` (DNS names or IP addresses).
pub fn pki_for(names: &[&str]) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "egress test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf_params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_string()).collect::<Vec<_>>()).unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let b64 = data_encoding::BASE64.encode(ca.der());
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    Pki {
        ca_der: ca.der().clone(),
        ca_pem: format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            lines.join("\n")
        ),
        server: Arc::new(server),
    }
}

impl Pki {
    /// Probe TLS settings that trust this CA only.
    pub fn trust(&self) -> ProbeTls {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        ProbeTls::with_roots(roots)
    }
}

/// Answers every request with the status its path ends with (`/204`, `/generate_204`, `/500`), 404
/// otherwise.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(stream: S, seen: Seen) {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
        return;
    }
    let request_line = line.trim_end().to_string();
    let mut names = Vec::new();
    loop {
        let mut h = String::new();
        if stream.read_line(&mut h).await.unwrap_or(0) == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((name, _)) = h.split_once(':') {
            names.push(name.trim().to_ascii_lowercase());
        }
    }
    let path = request_line.split(' ').nth(1).unwrap_or_default().to_string();
    // The status is the number the path ends with (`/204`, `/generate_204`).
    let digits: String = path
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let code: u16 = digits.parse().ok().filter(|c| (100..600).contains(c)).unwrap_or(404);
    seen.lock().unwrap().push((request_line, names));
    let _ = stream
        .write_all(format!("HTTP/1.1 {code} Test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes())
        .await;
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
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
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
    let kept = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, seen) = (acceptor.clone(), kept.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    answer(tls, seen).await;
                }
            });
        }
    });
    (addr, seen)
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
            tokio::spawn(answer(tcp, kept.clone()));
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

/// A free port on 127.0.0.1 (bound and released; another process may take it in between, which
/// start() then reports).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real tinyproxy process on a loopback port; stopped on drop.
pub struct Tinyproxy {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    connect_ports: Vec<u16>,
    basic_auth: Option<(String, String)>,
}

/// Whether tinyproxy is installed; tests that need it skip with a reason otherwise, and fail
/// under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1), which installs it.
pub fn tinyproxy_available() -> bool {
    let found = Command::new("tinyproxy").arg("-v").output().is_ok();
    if !found {
        assert!(
            std::env::var("EGRESS_REAL_BACKENDS_REQUIRED").is_err(),
            "tinyproxy is required (cargo xtask test installs it)"
        );
        eprintln!("SKIP: tinyproxy is not installed");
    }
    found
}

impl Tinyproxy {
    /// Starts tinyproxy allowing CONNECT only to `connect_ports` (every port when empty).
    pub fn start(connect_ports: &[u16]) -> Self {
        Self::start_with(connect_ports, None)
    }

    /// Starts tinyproxy that takes only this user and password (`BasicAuth`).
    pub fn start_with(connect_ports: &[u16], basic_auth: Option<(&str, &str)>) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("egress-tinyproxy-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = Self {
            child: None,
            port,
            dir,
            connect_ports: connect_ports.to_vec(),
            basic_auth: basic_auth.map(|(u, p)| (u.to_owned(), p.to_owned())),
        };
        t.resume();
        t
    }

    /// Starts (again) on the same port.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let mut conf = format!(
            "Port {}\nListen 127.0.0.1\nTimeout 30\nMaxClients 50\nAllow 127.0.0.1\nLogLevel Warning\nDisableViaHeader Yes\n",
            self.port
        );
        if nix_is_root() {
            conf.push_str("User nobody\nGroup nogroup\n");
        }
        for p in &self.connect_ports {
            conf.push_str(&format!("ConnectPort {p}\n"));
        }
        if let Some((user, password)) = &self.basic_auth {
            conf.push_str(&format!("BasicAuth {user} {password}\n"));
        }
        let path = self.dir.join("tinyproxy.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting tinyproxy");
        self.child = Some(child);
        // Ready when it accepts connections.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("tinyproxy exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "tinyproxy did not listen on {} within 20 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it; its port then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Connects to nothing: a port with no listener.
pub async fn dead_address() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

pub async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}
