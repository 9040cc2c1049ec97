//! The HTTP front's requests: `CONNECT` tunnels and plain-HTTP forwarding, each through a
//! proxy leased for it ([`crate::tunnels`]), each run in a task the drain tracks, so that a
//! client that leaves mid-request never strands a lease.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use egress_discovery::client::ReportResult;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, PROXY_AUTHORIZATION};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

use crate::auth::ClientAuth;
use crate::caps::Slot;
use crate::chain::{self, ChainError};
use crate::http_front::{Body, empty, refused, strip_hop_by_hop, text};
use crate::leases::Held;
use crate::metrics::Front;
use crate::tunnels::{Carried, Failure, Request as Asked};
use crate::username::Routing;
use crate::{Gateway, Permit};

impl Gateway {
    /// A `CONNECT`: answered 200 once a backend opened the tunnel, which then carries the
    /// client's bytes both ways. The work runs in a task of its own, tracked for the drain, so a
    /// client that leaves while its tunnel is being opened cannot strand the lease taken for
    /// it: the task gives it back.
    pub(crate) async fn connect(
        self: Arc<Self>,
        req: Request<Incoming>,
        client: ClientAuth,
        routing: Routing,
        permit: Permit,
    ) -> Response<Body> {
        let Some(authority) = req.uri().authority().filter(|a| a.port_u16().is_some()).cloned() else {
            return text(StatusCode::BAD_REQUEST, "CONNECT needs host:port");
        };
        let asked = Asked {
            client,
            routing,
            front: Front::Connect,
            authority: authority.as_str().to_owned(),
            host: authority.host().to_owned(),
            since: Instant::now(),
        };
        let (answer, answered) = oneshot::channel();
        let gateway = self.clone();
        self.tasks.spawn(async move {
            let opened = match gateway.establish(&asked).await {
                Ok(o) => o,
                Err(failure) => {
                    let _ = answer.send(refused(&failure));
                    return;
                }
            };
            if answer.send(Response::new(empty())).is_err() {
                return gateway.not_carried(&asked, opened, "abandoned").await;
            }
            match hyper::upgrade::on(req).await {
                Ok(upgraded) => gateway.carry(&asked, opened, TokioIo::new(upgraded)).await,
                Err(_) => gateway.not_carried(&asked, opened, "broken").await,
            }
            drop(permit);
        });
        answered
            .await
            .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "the tunnel's task ended"))
    }

    /// A plain-HTTP request, sent on to a leased backend in absolute form with the backend's
    /// credentials; an answer with a ban status is reported for the host. As for a `CONNECT`,
    /// in a task of its own: a client that leaves drops the answer, whose body gives the lease
    /// back.
    pub(crate) async fn forward(
        self: Arc<Self>,
        req: Request<Incoming>,
        client: ClientAuth,
        routing: Routing,
        permit: Permit,
    ) -> Response<Body> {
        let uri = req.uri().clone();
        let Some(host) = uri
            .host()
            .filter(|_| uri.scheme_str() == Some("http"))
            .map(str::to_owned)
        else {
            return text(
                StatusCode::BAD_REQUEST,
                "send an absolute-form http:// request, or CONNECT for anything else",
            );
        };
        let asked = Asked {
            client,
            routing,
            front: Front::Http,
            authority: format!("{host}:{}", uri.port_u16().unwrap_or(80)),
            host,
            since: Instant::now(),
        };
        let (answer, answered) = oneshot::channel();
        let gateway = self.clone();
        self.tasks.spawn(async move {
            let _ = answer.send(gateway.forward_leased(req, asked, permit).await);
        });
        answered
            .await
            .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "the request's task ended"))
    }

    /// [`Self::forward`]'s work: the client admitted, a lease for the host, the request sent on.
    async fn forward_leased(self: Arc<Self>, req: Request<Incoming>, asked: Asked, permit: Permit) -> Response<Body> {
        let mut known_as = None;
        let admitted = self.admit(&asked, &mut known_as).await;
        let name = known_as.unwrap_or_default();
        let (held, slot) = match admitted {
            Ok((_, slot)) => match self
                .leases
                .acquire(asked.client.token(), &asked.routing, &asked.host)
                .await
            {
                Ok(held) => (held, slot),
                Err(e) => return self.failed(&asked, &name, &Failure::Lease(e)),
            },
            Err(failure) => return self.failed(&asked, &name, &failure),
        };
        self.send_on(req, asked, (name, held, slot, permit)).await
    }

    /// The metrics and log line of a request that got no backend, and its answer.
    fn failed(&self, asked: &Asked, name: &str, failure: &Failure) -> Response<Body> {
        self.account_failure(asked, name, failure);
        refused(failure)
    }

    /// Sends the request to the leased backend and answers with the backend's answer, whose
    /// body gives the lease back and accounts for the request once it is done with.
    async fn send_on(
        self: Arc<Self>,
        req: Request<Incoming>,
        asked: Asked,
        (name, held, slot, permit): (String, Held, Slot, Permit),
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if let Some((user, password)) = &held.backend.credentials
            && let Ok(value) = HeaderValue::from_str(&chain::basic(user, password))
        {
            parts.headers.insert(PROXY_AUTHORIZATION, value);
        }
        let sent = Arc::new(AtomicU64::new(0));
        let counted = sent.clone();
        let body = Released::new(body, move |n| counted.store(n, Ordering::Relaxed));
        let req = Request::from_parts(parts, body);
        let answer = match chain::forward(&held.backend, req, self.settings.chain).await {
            // The backend did not take the gateway's credentials for it: its failure, not the
            // client's (whose own 407s come from the gateway).
            Ok(a) if a.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED => Err(ChainError::Refused(a.status())),
            other => other,
        };
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                self.report_and_give_back(&asked.client, &held, &asked.host).await;
                return self.failed(&asked, &name, &Failure::Chain(Some(e)));
            }
        };
        let banned = self.settings.ban_statuses.contains(&answer.status().as_u16());
        if banned {
            self.leases
                .report(asked.client.token(), &held, ReportResult::Banned, &asked.host)
                .await;
        }
        let (mut parts, body) = answer.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let active = self.metrics.active();
        let gateway = self.clone();
        let done = move |down: u64| {
            drop(active);
            let task = gateway.clone();
            gateway.tasks.spawn(async move {
                task.give_back(&asked.client, &held).await;
                let carried = Carried {
                    up: sent.load(Ordering::Relaxed),
                    down,
                    outcome: if banned { "banned" } else { "answered" },
                };
                task.account(&asked, &name, &held.proxy_id, carried);
                drop((slot, permit));
            });
        };
        Response::from_parts(parts, Released::new(body, done).boxed())
    }
}

/// A body that counts the bytes it yields and calls `on_end` with them once it is done with
/// (read to its end, or dropped): a plain-HTTP request's lease goes back then, and its bytes
/// are counted.
struct Released<F: FnOnce(u64)> {
    body: Incoming,
    bytes: u64,
    on_end: Option<F>,
}

impl<F: FnOnce(u64)> Released<F> {
    fn new(body: Incoming, on_end: F) -> Self {
        Self {
            body,
            bytes: 0,
            on_end: Some(on_end),
        }
    }
}

impl<F: FnOnce(u64)> Drop for Released<F> {
    fn drop(&mut self) {
        if let Some(f) = self.on_end.take() {
            f(self.bytes);
        }
    }
}

impl<F: FnOnce(u64) + Unpin> hyper::body::Body for Released<F> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.bytes += data.len() as u64;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
