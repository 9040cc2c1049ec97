//! One libvirt connection over one SSH session, and the bounded way to run calls on it.

use std::sync::Arc;
use std::time::Duration;

use egress_provider::OpCtx;

use crate::bridge::Bridge;
use crate::error::CallError;
use crate::link::Link;

/// The budget of an ordinary RPC.
pub const RPC_BUDGET: Duration = Duration::from_secs(30);
/// The budget of `virDomainCreate` (firmware start-up under software emulation is slow).
pub const DOMAIN_CREATE_BUDGET: Duration = Duration::from_secs(90);
/// The budget of an upload of at most [`SMALL_UPLOAD_BYTES`] (a seed, a marker).
pub const SMALL_UPLOAD_BUDGET: Duration = Duration::from_secs(60);
/// The largest upload that gets [`SMALL_UPLOAD_BUDGET`].
pub const SMALL_UPLOAD_BYTES: u64 = 16 << 20;
/// The budget of a download (a marker read); a large upload's grows with its size
/// ([`egress_libvirt::transfer_budget`]).
pub const TRANSFER_BUDGET: Duration = Duration::from_secs(20 * 60);
/// The budget of the courtesy disconnect when a connection is closed.
pub const CLOSE_BUDGET: Duration = Duration::from_secs(5);

/// A connection to one host's libvirtd. Dropping it closes it (off the async threads).
#[derive(Debug)]
pub struct Connection {
    host: String,
    conn: Option<Arc<virt::connect::Connect>>,
    link: Link,
    _bridge: Bridge,
}

impl Connection {
    pub(crate) fn new(host: String, conn: virt::connect::Connect, link: Link, bridge: Bridge) -> Self {
        Self {
            host,
            conn: Some(Arc::new(conn)),
            link,
            _bridge: bridge,
        }
    }

    /// The host's configured name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The connection's liveness.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Whether the connection is dead (it must be replaced).
    pub fn is_dead(&self) -> bool {
        self.link.is_dead()
    }

    /// Runs `f` on a blocking thread with this connection, bounded by `budget` and by `cx`.
    ///
    /// A call that outlives either tears the connection down (the C call then returns, and its
    /// late result is dropped); so does an error that came from the connection rather than from
    /// the daemon. Every other call in flight on the connection then fails once, and the next
    /// user dials again.
    ///
    /// # Errors
    /// [`CallError`]: the connection was dead, the caller had given up, the call was abandoned
    /// or outlived its budget, or libvirt answered with an error.
    pub async fn call<T, F>(&self, cx: &OpCtx, rpc: &str, budget: Duration, f: F) -> Result<T, CallError>
    where
        T: Send + 'static,
        F: FnOnce(&virt::connect::Connect) -> Result<T, virt::error::Error> + Send + 'static,
    {
        let (host, rpc_name) = (self.host.clone(), rpc.to_owned());
        if let Some(reason) = self.link.reason() {
            return Err(CallError::Closed {
                rpc: rpc_name,
                host,
                reason,
            });
        }
        if let Some(why) = cx.interrupted() {
            return Err(CallError::NotStarted {
                rpc: rpc_name,
                host,
                why: why.to_string(),
            });
        }
        let Some(conn) = self.conn.clone() else {
            return Err(CallError::Closed {
                rpc: rpc_name,
                host,
                reason: "closed".to_owned(),
            });
        };
        let span = tracing::Span::current();
        let task = tokio::task::spawn_blocking(move || span.in_scope(|| f(&conn)));
        tokio::select! {
            joined = task => match joined {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(error)) => {
                    let transport = is_transport_error(&error);
                    // The connection died under the call (a host taken for dead by the bridge,
                    // another call's budget): the reason is set before the socket is shut down,
                    // so it is there whenever the C call fails for that, and it says more than
                    // the C call's own error (a broken pipe).
                    if transport && let Some(reason) = self.link.reason() {
                        return Err(CallError::ClosedWhileWaiting { rpc: rpc_name, host, reason });
                    }
                    if transport {
                        self.link.mark_dead(format!("call {rpc_name} failed: {}", error.message()));
                    }
                    Err(CallError::Libvirt { rpc: rpc_name, host, error, transport })
                }
                Err(join) => {
                    self.link.mark_dead(format!("call {rpc_name} panicked"));
                    Err(CallError::Closed { rpc: rpc_name, host, reason: format!("the call panicked: {join}") })
                }
            },
            why = cx.done() => {
                self.link.mark_dead(format!("call {rpc_name} abandoned: {why}"));
                Err(CallError::Abandoned { rpc: rpc_name, host, why: why.to_string() })
            }
            () = tokio::time::sleep(budget) => {
                self.link.mark_dead(format!("call {rpc_name} exceeded its {budget:?} budget"));
                Err(CallError::OverBudget { rpc: rpc_name, host, budget })
            }
            () = self.link.dead() => Err(CallError::ClosedWhileWaiting {
                rpc: rpc_name,
                host,
                reason: self.link.reason().unwrap_or_default(),
            }),
        }
    }

    /// Closes the connection: libvirt's disconnect within [`CLOSE_BUDGET`] when the link still
    /// lives, then the link is marked dead. Never blocks past the budget.
    pub async fn close(mut self) {
        if let Some(conn) = self.conn.take() {
            let closing = tokio::task::spawn_blocking(move || drop(conn));
            if !self.link.is_dead() {
                tokio::select! {
                    _ = closing => {}
                    () = tokio::time::sleep(CLOSE_BUDGET) => {}
                    () = self.link.dead() => {}
                }
            }
        }
        self.link.mark_dead("closed");
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // NB: dropping a virt Connect sends libvirt's close and can block on a stalled link:
        // never on an async thread, and with the transport already going down.
        self.link.mark_dead("dropped");
        if let Some(conn) = self.conn.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(move || drop(conn))),
                Err(_) => drop(conn),
            }
        }
    }
}

/// Whether a libvirt error came from the connection (the RPC layer, an I/O error, a closed
/// client) rather than from the daemon's answer.
fn is_transport_error(e: &virt::error::Error) -> bool {
    use virt::error::{ErrorDomain, ErrorNumber};
    e.domain().is(ErrorDomain::Rpc)
        || e.code().is_any(vec![
            ErrorNumber::SystemError,
            ErrorNumber::InvalidConn,
            ErrorNumber::NoConnect,
            ErrorNumber::Rpc,
        ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection to libvirt's built-in test driver: no daemon, no SSH.
    fn offline() -> Connection {
        let conn = virt::connect::Connect::open(Some("test:///default")).expect("libvirt's test driver");
        Connection::new("hv".into(), conn, Link::new(), Bridge::idle())
    }

    /// Spec H1: a call whose C side is stuck (behind a frozen write, say) returns as soon as
    /// its link is marked dead, with the reason, while the C side is still stuck.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_parked_on_the_link_returns_once_it_is_marked_dead() {
        let conn = offline();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (returned_tx, returned_rx) = std::sync::mpsc::channel::<()>();
        let cx = OpCtx::background();
        let call = conn.call(&cx, "StorageVolUpload", TRANSFER_BUDGET, move |_| {
            let _ = started_tx.send(());
            let _ = release_rx.recv();
            let _ = returned_tx.send(());
            Ok(())
        });
        let mut call = std::pin::pin!(call);
        tokio::select! {
            biased;
            _ = &mut call => panic!("the call returned before its C side started"),
            started = started_rx => started.unwrap(),
        }
        conn.link().mark_dead("the host accepted no byte for 30 s");
        // One poll must see the dead link: the C side is parked until the release below.
        let result = tokio::select! {
            biased;
            r = &mut call => r,
            () = std::future::ready(()) => panic!("the call waits for its C side on a dead link"),
        };
        let err = result.expect_err("a call on a dead link fails");
        assert!(matches!(err, CallError::ClosedWhileWaiting { .. }), "{err}");
        assert!(err.to_string().contains("the host accepted no byte for 30 s"), "{err}");
        assert!(returned_rx.try_recv().is_err(), "the C side is still parked");
        release_tx.send(()).unwrap();
        returned_rx.recv().unwrap();
    }
}
