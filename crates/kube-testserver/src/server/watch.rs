//! The watch stream: the events a watch starts with (a replay from a resourceVersion, or the
//! objects as they are now), then every change it sees as it is committed, bookmarks when asked
//! for, until the client goes, its timeout ends or the server ends its watches.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::negotiate::metadata_only;
use super::params::list_options;
use super::respond::Body;
use super::route::Query;
use super::shared::Shared;
use crate::selectors::labels_of;
use crate::status::ApiError;
use crate::store::{Change, ChangeKind, ListOptions, State, Target, watches};

/// The shortest bookmark period (a zero period would make no sense and cannot be timed).
const MIN_BOOKMARK_INTERVAL: Duration = Duration::from_millis(10);
/// How long a watch lasts when the client does not say.
const DEFAULT_WATCH_SECONDS: u64 = 1800;

/// What one change looks like to a watch with these selectors, if it sees it at all: the event
/// type and the object to send. An object that leaves the selection is sent as DELETED in its
/// last selected state, stamped with the change's resourceVersion, as the watch cache does.
fn seen_as(change: &Change, opts: &ListOptions) -> Option<(&'static str, Value)> {
    let selected = |o: &Value| opts.labels.matches(&labels_of(o)) && opts.fields.matches(o);
    let now = selected(&change.object);
    let before = change.previous.as_ref().is_some_and(selected);
    let current = || change.object.clone();
    let last_selected = || {
        let mut o = change.previous.clone().unwrap_or_else(|| change.object.clone());
        o["metadata"]["resourceVersion"] = json!(change.rv.to_string());
        o
    };
    match change.kind {
        ChangeKind::Added => now.then(|| ("ADDED", current())),
        ChangeKind::Deleted => (now || before).then(|| ("DELETED", current())),
        ChangeKind::Modified => match (before, now) {
            (true, true) => Some(("MODIFIED", current())),
            (false, true) => Some(("ADDED", current())),
            (true, false) => Some(("DELETED", last_selected())),
            (false, false) => None,
        },
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("JSON values serialise");
    line.push(b'\n');
    Bytes::from(line)
}

fn bookmark(t: &Target, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": t.rt.kind, "apiVersion": t.rt.api_version(), "metadata": metadata}),
    )
}

/// The watch parameters the real server refuses in combination: `sendInitialEvents` (whatever
/// its value) needs `resourceVersionMatch=NotOlderThan`, and `resourceVersionMatch` on a watch
/// needs `sendInitialEvents`.
fn check_watch_params(query: &Query) -> Result<(), ApiError> {
    let forbidden = |detail: &str| {
        let cause = crate::status::FieldCause::forbidden("resourceVersionMatch", detail);
        ApiError::invalid("ListOptions", "meta.k8s.io", "", vec![cause])
    };
    match (query.get("sendInitialEvents"), query.get("resourceVersionMatch")) {
        (Some(_), Some("NotOlderThan")) | (None, None | Some("")) => Ok(()),
        (Some(_), _) => Err(forbidden(
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        )),
        (None, Some(_)) => Err(forbidden(
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        )),
    }
}

fn with_type(t: &Target, object: &Value) -> Value {
    t.rt.show(object)
}

/// What a watch asked for, from its query.
struct WatchParams<'a> {
    opts: ListOptions,
    bookmarks: bool,
    send_initial: Option<bool>,
    timeout: u64,
    /// The resourceVersion to replay from (none, or "0": from now).
    from: Option<&'a str>,
}

impl<'a> WatchParams<'a> {
    fn parse(query: &'a Query, t: &Target) -> Result<Self, ApiError> {
        let mut opts = list_options(query, &t.rt)?;
        opts.limit = None;
        opts.continue_token = None;
        check_watch_params(query)?;
        let timeout = match query.get("timeoutSeconds") {
            None | Some("" | "0") => DEFAULT_WATCH_SECONDS,
            Some(s) => s
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {s}")))?,
        };
        Ok(Self {
            opts,
            bookmarks: query.flag("allowWatchBookmarks"),
            send_initial: query.get("sendInitialEvents").map(|v| matches!(v, "true" | "1")),
            timeout,
            from: query.get("resourceVersion").filter(|s| !s.is_empty() && *s != "0"),
        })
    }
}

/// The events a watch starts with, read under the state lock: its lines, whether they end
/// the watch (its resourceVersion is too old), and the resourceVersion they bring it to.
struct Start {
    lines: Vec<Bytes>,
    finished: bool,
    rv: u64,
}

/// The watch's first events from `state`, each rendered by `render`.
fn start(
    state: &State,
    t: &Target,
    params: &WatchParams<'_>,
    render: &dyn Fn(&Value) -> Value,
) -> Result<Start, ApiError> {
    let rv = state.resource_version();
    let mut lines = Vec::new();
    let mut finished = false;
    match (params.from, params.send_initial) {
        (Some(from), None | Some(false)) => {
            let since = from
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {from}")))?;
            match state.changes_since(t, since) {
                Ok(changes) => lines.extend(
                    changes
                        .iter()
                        .filter_map(|c| seen_as(c, &params.opts).map(|(kind, o)| event_line(kind, &render(&o)))),
                ),
                Err(gone) => {
                    lines.push(event_line("ERROR", &gone.to_status()));
                    finished = true;
                }
            }
        }
        // Explicitly no initial events: from now on.
        (None, Some(false)) => {}
        _ => {
            lines.extend(
                state
                    .snapshot(t, &params.opts)
                    .iter()
                    .map(|o| event_line("ADDED", &render(o))),
            );
            if params.send_initial == Some(true) && params.bookmarks {
                lines.push(bookmark(t, rv, true));
            }
        }
    }
    Ok(Start { lines, finished, rv })
}

/// What the task that feeds one watch needs.
struct Feed<R> {
    t: Target,
    opts: ListOptions,
    render: R,
    bookmarks: bool,
    timeout: Duration,
    interval: Duration,
    shutdown: CancellationToken,
    /// Cancelled when the server ends every watch.
    dropped: CancellationToken,
}

impl<R: Fn(&Value) -> Value> Feed<R> {
    /// Sends `start`'s lines, then each change the watch sees, bookmarks when asked for, until
    /// the client goes, the timeout ends or the server ends its watches.
    async fn run(self, start: Start, mut live: broadcast::Receiver<Arc<Change>>, tx: mpsc::Sender<Bytes>) {
        for line in start.lines {
            if tx.send(line).await.is_err() {
                return;
            }
        }
        if start.finished {
            return;
        }
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        let mut last_rv = start.rv;
        loop {
            let line = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.dropped.cancelled() => return,
                _ = tx.closed() => return,
                _ = &mut deadline => {
                    if self.bookmarks {
                        let _ = tx.send(bookmark(&self.t, last_rv, false)).await;
                    }
                    return;
                }
                _ = ticker.tick(), if self.bookmarks => bookmark(&self.t, last_rv, false),
                received = live.recv() => match received {
                    Ok(change) if change.rv > start.rv => {
                        // Bookmarks carry the newest resourceVersion seen, whatever its kind:
                        // resuming from it must not replay or expire on other kinds' churn.
                        last_rv = change.rv;
                        match self.line_for(&change) {
                            Some(line) => line,
                            None => continue,
                        }
                    }
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // This watcher fell too far behind: it must re-list, as after a compaction.
                        let gone = ApiError::gone(format!("too old resource version: {last_rv}"));
                        let _ = tx.send(event_line("ERROR", &gone.to_status())).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            if tx.send(line).await.is_err() {
                return;
            }
        }
    }

    /// The event line `change` makes on this watch, if it sees it.
    fn line_for(&self, change: &Change) -> Option<Bytes> {
        if !watches(&self.t, change) {
            return None;
        }
        seen_as(change, &self.opts).map(|(kind, o)| event_line(kind, &(self.render)(&o)))
    }
}

/// A watch on `t`: its first events, then its stream, as a chunked JSON response.
pub(super) fn watch(
    shared: &Arc<Shared>,
    t: Target,
    query: &Query,
    metadata: bool,
) -> Result<Response<Body>, ApiError> {
    let params = WatchParams::parse(query, &t)?;
    let render = {
        let t = t.clone();
        move |object: &Value| {
            let typed = with_type(&t, object);
            if metadata { metadata_only(&typed) } else { typed }
        }
    };
    // Taken before the state lock, so an `end_watches` racing with this start ends it too.
    let dropped = shared.watches.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (start, live) = {
        let state = shared.state();
        // Subscribed under the lock that also reads the history or the snapshot: no change can
        // fall between the replay and the live stream.
        let live = state.subscribe();
        (start(&state, &t, &params, &render)?, live)
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let feed = Feed {
        t,
        opts: params.opts,
        render,
        bookmarks: params.bookmarks,
        timeout: Duration::from_secs(params.timeout),
        interval: shared.bookmark_interval.max(MIN_BOOKMARK_INTERVAL),
        shutdown: shared.shutdown.clone(),
        dropped,
    };
    tokio::spawn(feed.run(start, live, tx));
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        "application/json".parse().expect("a valid content type"),
    );
    r.headers_mut()
        .insert(header::TRANSFER_ENCODING, "chunked".parse().expect("a valid header"));
    Ok(r)
}
