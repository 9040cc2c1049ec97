//! The SOCKS5 front (RFC 1928, with RFC 1929's username and password): `CONNECT` only, through a
//! proxy leased for the connection; BIND and UDP ASSOCIATE are answered "command not
//! supported". A client must authenticate with a username and a password (one offering only
//! the no-authentication method is refused): the username is the routing ([`crate::username`];
//! SOCKS5 carries 1 to 255 bytes, so `any` asks for any proxy), the password a discovery token,
//! checked with the discovery API before the client is told it may go on. A domain name goes
//! to the backend as it came, so the backend resolves it (`socks5h://`).
//!
//! Written by hand: socks5-proto is GPL-3.0, which this Apache-2.0 project cannot take, and
//! fast-socks5 logs the password's bytes at debug level through `log`, which the operator's
//! logging carries. The handshake is a few fields, each bounded by its length byte, and the
//! whole of it by the gateway's head timeout.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::Gateway;
use crate::auth::ClientAuth;
use crate::chain::ChainError;
use crate::leases::LeaseError;
use crate::metrics::Front;
use crate::tunnels::{Failure, Request};
use crate::username::{self, Routing};

const VERSION: u8 = 5;
const PASSWORD_VERSION: u8 = 1;
const METHOD_PASSWORD: u8 = 2;
const NO_ACCEPTABLE_METHOD: u8 = 0xFF;
const CMD_CONNECT: u8 = 1;

/// The reply codes of RFC 1928 §6 the front sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Succeeded = 0,
    GeneralFailure = 1,
    NotAllowed = 2,
    CommandNotSupported = 7,
    AddressTypeNotSupported = 8,
}

/// What a client asked for, once its handshake is through.
#[derive(Debug)]
pub struct Asked {
    pub client: ClientAuth,
    pub routing: Routing,
    /// `host:port` (an IPv6 address in brackets).
    pub authority: String,
    pub host: String,
}

/// Why a handshake ended without a request; the client has been told what SOCKS5 lets it be
/// told, or the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("not SOCKS5 (version {0})")]
    Version(u8),
    #[error("the client offered no username and password method")]
    NoPasswordMethod,
    #[error("the username and password were refused: {0}")]
    Refused(String),
    #[error("the client asked for command {0}; only CONNECT is served")]
    Command(u8),
    #[error("the client named an address of type {0}")]
    AddressType(u8),
    #[error("the connection broke or closed during the handshake")]
    Io,
}

/// Serves SOCKS5 clients on `listener` until the task is dropped: at most the gateway's
/// connections at once (the others are closed as they come).
pub async fn serve(listener: TcpListener, gateway: Arc<Gateway>) {
    crate::accept(listener, gateway, |gateway, tcp, permit| async move {
        gateway.socks(tcp).await;
        drop(permit);
    })
    .await;
}

impl Gateway {
    async fn socks(&self, mut tcp: TcpStream) {
        let since = Instant::now();
        let asked = tokio::time::timeout(self.settings.head_timeout, self.handshake(&mut tcp)).await;
        let asked = match asked {
            Ok(Ok(asked)) => asked,
            Ok(Err(HandshakeError::Refused(_))) => return self.metrics.refused("credentials"),
            Ok(Err(_)) | Err(_) => return self.metrics.refused("handshake"),
        };
        let req = Request {
            client: asked.client,
            routing: asked.routing,
            front: Front::Socks,
            authority: asked.authority,
            host: asked.host,
            since,
        };
        match self.establish(&req).await {
            Ok(opened) => {
                if reply(&mut tcp, Reply::Succeeded).await.is_ok() {
                    self.carry(&req, opened, tcp).await;
                } else {
                    self.not_carried(&req, opened, "broken").await;
                }
            }
            Err(failure) => {
                let _ = reply(&mut tcp, reply_for(&failure)).await;
            }
        }
    }

    /// The handshake up to the client's request, its credentials checked with the API.
    async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(&self, s: &mut S) -> Result<Asked, HandshakeError> {
        choose_password_method(s).await?;
        let (user, password) = read_credentials(s).await?;
        let checked = match ClientAuth::new(user, password) {
            None => Err("an empty password".to_owned()),
            Some(client) => match username::parse(&client.username, self.settings.max_ttl) {
                Err(e) => Err(e.to_string()),
                // The API could not say: the credentials are not refused for that; the
                // request then gets the general failure the lease's failure gives.
                Ok(routing) => match self.leases.client_of(client.token()).await {
                    Err(e @ (LeaseError::Unauthorized(_) | LeaseError::NoProxy(_))) => Err(e.to_string()),
                    Err(LeaseError::Api(_)) | Ok(_) => Ok((client, routing)),
                },
            },
        };
        let status = if checked.is_ok() { 0 } else { 1 };
        s.write_all(&[PASSWORD_VERSION, status])
            .await
            .map_err(|_| HandshakeError::Io)?;
        let (client, routing) = checked.map_err(HandshakeError::Refused)?;
        let (host, port) = read_request(s).await?;
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(Asked {
            client,
            routing,
            authority,
            host,
        })
    }
}

/// The greeting: SOCKS5 with the username and password method among those offered.
async fn choose_password_method<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<(), HandshakeError> {
    let [version, count] = read_array(s).await?;
    if version != VERSION {
        return Err(HandshakeError::Version(version));
    }
    let methods = read_vec(s, count).await?;
    if !methods.contains(&METHOD_PASSWORD) {
        let _ = s.write_all(&[VERSION, NO_ACCEPTABLE_METHOD]).await;
        return Err(HandshakeError::NoPasswordMethod);
    }
    s.write_all(&[VERSION, METHOD_PASSWORD])
        .await
        .map_err(|_| HandshakeError::Io)
}

/// RFC 1929's username and password, each 1 to 255 bytes of UTF-8.
async fn read_credentials<S: AsyncRead + Unpin>(s: &mut S) -> Result<(String, String), HandshakeError> {
    let [version, user_len] = read_array(s).await?;
    if version != PASSWORD_VERSION {
        return Err(HandshakeError::Version(version));
    }
    let user = read_vec(s, user_len).await?;
    let [password_len] = read_array(s).await?;
    let password = read_vec(s, password_len).await?;
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|_| HandshakeError::Refused("not UTF-8".into()));
    Ok((text(user)?, text(password)?))
}

/// The request: `CONNECT` to an IPv4 or IPv6 address or a domain name, and its port. Any other
/// command or address type is answered as RFC 1928 says, and ends the handshake.
async fn read_request<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<(String, u16), HandshakeError> {
    let [version, command, _reserved, address_type] = read_array(s).await?;
    if version != VERSION {
        return Err(HandshakeError::Version(version));
    }
    if command != CMD_CONNECT {
        let _ = reply(s, Reply::CommandNotSupported).await;
        return Err(HandshakeError::Command(command));
    }
    let host = match address_type {
        1 => Ipv4Addr::from(read_array::<_, 4>(s).await?).to_string(),
        3 => {
            let [len] = read_array(s).await?;
            let name = read_vec(s, len).await?;
            match String::from_utf8(name) {
                Ok(name) if !name.is_empty() => name,
                _ => {
                    let _ = reply(s, Reply::GeneralFailure).await;
                    return Err(HandshakeError::AddressType(address_type));
                }
            }
        }
        4 => Ipv6Addr::from(read_array::<_, 16>(s).await?).to_string(),
        other => {
            let _ = reply(s, Reply::AddressTypeNotSupported).await;
            return Err(HandshakeError::AddressType(other));
        }
    };
    let port = u16::from_be_bytes(read_array(s).await?);
    Ok((host, port))
}

/// A reply with no bound address (0.0.0.0:0): the gateway's own address is no use to a client.
async fn reply<S: AsyncWrite + Unpin>(s: &mut S, code: Reply) -> std::io::Result<()> {
    s.write_all(&[VERSION, code as u8, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

fn reply_for(failure: &Failure) -> Reply {
    match failure {
        Failure::Chain(Some(ChainError::Refused(hyper::StatusCode::FORBIDDEN))) => Reply::NotAllowed,
        Failure::TooMany => Reply::NotAllowed,
        Failure::Lease(_) | Failure::Chain(_) => Reply::GeneralFailure,
    }
}

async fn read_array<S: AsyncRead + Unpin, const N: usize>(s: &mut S) -> Result<[u8; N], HandshakeError> {
    let mut b = [0u8; N];
    s.read_exact(&mut b).await.map_err(|_| HandshakeError::Io)?;
    Ok(b)
}

async fn read_vec<S: AsyncRead + Unpin>(s: &mut S, len: u8) -> Result<Vec<u8>, HandshakeError> {
    let mut b = vec![0u8; usize::from(len)];
    s.read_exact(&mut b).await.map_err(|_| HandshakeError::Io)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `step` against a client that sends `sent`; returns its result and what it wrote.
    async fn against<T>(
        sent: &[u8],
        step: impl AsyncFnOnce(&mut tokio::io::DuplexStream) -> Result<T, HandshakeError>,
    ) -> (Result<T, HandshakeError>, Vec<u8>) {
        let (mut ours, mut theirs) = tokio::io::duplex(1024);
        theirs.write_all(sent).await.unwrap();
        // All the client sends: a step that wants more reads the end, not a wait.
        theirs.shutdown().await.unwrap();
        let got = step(&mut ours).await;
        drop(ours);
        let mut written = Vec::new();
        theirs.read_to_end(&mut written).await.unwrap();
        (got, written)
    }

    #[tokio::test]
    async fn the_password_method_is_chosen_and_no_authentication_refused() {
        let (got, wrote) = against(&[5, 2, 0, 2], choose_password_method).await;
        assert_eq!((got, wrote), (Ok(()), vec![5, 2]));
        let (got, wrote) = against(&[5, 1, 0], choose_password_method).await;
        assert_eq!((got, wrote), (Err(HandshakeError::NoPasswordMethod), vec![5, 0xFF]));
        let (got, wrote) = against(&[4, 1, 0], choose_password_method).await;
        assert_eq!(
            (got, wrote),
            (Err(HandshakeError::Version(4)), vec![]),
            "SOCKS4: closed"
        );
        let (got, _) = against(&[5, 3, 2], choose_password_method).await;
        assert_eq!(got, Err(HandshakeError::Io), "fewer methods than announced");
    }

    #[tokio::test]
    async fn credentials_are_read_by_their_lengths() {
        let mut sent = vec![1, 3];
        sent.extend(b"any");
        sent.push(3);
        sent.extend(b"tok");
        let (got, _) = against(&sent, read_credentials).await;
        assert_eq!(got, Ok(("any".to_owned(), "tok".to_owned())));
        let (got, _) = against(&[1, 2, 0xFF, 0xFE, 1, b'x'], read_credentials).await;
        assert!(matches!(got, Err(HandshakeError::Refused(_))), "{got:?}");
        let (got, _) = against(&[2, 1, b'a', 1, b'b'], read_credentials).await;
        assert_eq!(got, Err(HandshakeError::Version(2)));
    }

    #[tokio::test]
    async fn a_connect_names_an_address_or_a_domain_and_anything_else_is_answered() {
        let (got, _) = against(&[5, 1, 0, 1, 127, 0, 0, 1, 0, 80], read_request).await;
        assert_eq!(got, Ok(("127.0.0.1".to_owned(), 80)));
        let mut domain = vec![5, 1, 0, 3, 12];
        domain.extend(b"example.test");
        domain.extend(443u16.to_be_bytes());
        let (got, _) = against(&domain, read_request).await;
        assert_eq!(got, Ok(("example.test".to_owned(), 443)));
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend(Ipv6Addr::LOCALHOST.octets());
        v6.extend(8080u16.to_be_bytes());
        let (got, _) = against(&v6, read_request).await;
        assert_eq!(got, Ok(("::1".to_owned(), 8080)));
        let no_bound_address = |code: u8| vec![5, code, 0, 1, 0, 0, 0, 0, 0, 0];
        for command in [2, 3] {
            let (got, wrote) = against(&[5, command, 0, 1, 127, 0, 0, 1, 0, 80], read_request).await;
            assert_eq!(got, Err(HandshakeError::Command(command)));
            assert_eq!(wrote, no_bound_address(7), "BIND and UDP ASSOCIATE: not supported");
        }
        let (got, wrote) = against(&[5, 1, 0, 9, 1, 2], read_request).await;
        assert_eq!((got, wrote), (Err(HandshakeError::AddressType(9)), no_bound_address(8)));
        let (got, wrote) = against(&[5, 1, 0, 3, 0, 0, 80], read_request).await;
        assert_eq!(
            (got, wrote),
            (Err(HandshakeError::AddressType(3)), no_bound_address(1)),
            "an empty name"
        );
    }

    #[test]
    fn a_refused_destination_is_not_allowed_and_any_other_failure_general() {
        let forbidden = Failure::Chain(Some(ChainError::Refused(hyper::StatusCode::FORBIDDEN)));
        assert_eq!(reply_for(&forbidden), Reply::NotAllowed);
        assert_eq!(reply_for(&Failure::Chain(None)), Reply::GeneralFailure);
        let none = Failure::Lease(crate::leases::LeaseError::NoProxy("no match".into()));
        assert_eq!(reply_for(&none), Reply::GeneralFailure);
    }
}
