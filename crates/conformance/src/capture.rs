//! An in-memory record of every tracing event and span a case produces, at
//! every level and target, so cases can assert on parentage, levels and the
//! absence of secrets.
//!
//! NB: one process-wide subscriber routes to the capture of the current
//! thread. Per-test scoped subscribers would race on tracing's per-callsite
//! interest cache when tests run in parallel (a callsite first seen by a
//! thread without a subscriber can be switched off for everyone), which
//! silently drops spans and events: fatal for a suite that proves absence.
//! Each case runs on its own current-thread runtime, so thread routing sees
//! everything the provider does on that runtime; work a provider moves to
//! other threads must carry the caller's span and dispatcher.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, Once};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One captured event.
#[derive(Clone, Debug)]
pub struct CapturedEvent {
    /// Its level.
    pub level: Level,
    /// Its target (module path or explicit target).
    pub target: String,
    /// `name=value` of every field, the message included.
    pub fields: Vec<(String, String)>,
    /// Names of the spans it was inside, outermost first.
    pub scope: Vec<String>,
    /// Numbers of those spans (see [`CapturedSpan::id`]).
    pub scope_ids: Vec<u64>,
}

impl CapturedEvent {
    /// The `message` field, or "".
    pub fn message(&self) -> &str {
        self.field("message").unwrap_or("")
    }

    /// A field's recorded value.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Everything the event carries, as one string (for secret scans).
    pub fn text(&self) -> String {
        let mut s = self.target.clone();
        for (n, v) in &self.fields {
            let _ = write!(s, " {n}={v}");
        }
        s
    }
}

/// One captured span.
#[derive(Clone, Debug)]
pub struct CapturedSpan {
    /// Its number (unique within the process, unlike tracing span ids).
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its parent's id, if it had one.
    pub parent: Option<u64>,
    /// Fields recorded at creation and later.
    pub fields: Vec<(String, String)>,
}

impl CapturedSpan {
    /// A field's last recorded value.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default, Debug)]
struct Store {
    events: Vec<CapturedEvent>,
    spans: Vec<CapturedSpan>,
}

/// The shared record; cheap to clone.
#[derive(Clone, Default, Debug)]
pub struct Capture {
    store: Arc<Mutex<Store>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// Records this thread's telemetry into `capture` (an existing one, e.g.
/// from a helper thread of a case) until the guard is dropped.
pub fn route_to(capture: Capture) -> CaptureGuard {
    let previous = CURRENT.with(|c| c.borrow_mut().replace(capture));
    CaptureGuard { previous }
}

/// Stops capturing on this thread when dropped.
#[derive(Debug)]
pub struct CaptureGuard {
    previous: Option<Capture>,
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

impl Capture {
    /// Starts recording everything this thread emits into a fresh capture,
    /// until the guard is dropped. Installs the process-wide routing
    /// subscriber on first use.
    ///
    /// # Panics
    /// When another global subscriber was installed first (the suite cannot
    /// see anything then).
    pub fn start() -> (Capture, CaptureGuard) {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::registry().with(CaptureLayer);
            tracing::subscriber::set_global_default(subscriber)
                .expect("egress-conformance needs to own the global tracing subscriber in its test binaries");
        });
        let capture = Capture::default();
        let previous = CURRENT.with(|c| c.borrow_mut().replace(capture.clone()));
        (capture, CaptureGuard { previous })
    }

    /// The capture of the current thread, if one is running.
    fn current() -> Option<Capture> {
        CURRENT.with(|c| c.borrow().clone())
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<CapturedEvent> {
        self.lock().events.clone()
    }

    /// Every span so far.
    pub fn spans(&self) -> Vec<CapturedSpan> {
        self.lock().spans.clone()
    }

    /// How many events were captured (to look at only later ones).
    pub fn event_mark(&self) -> usize {
        self.lock().events.len()
    }

    /// How many spans were created (to look at only later ones).
    pub fn span_mark(&self) -> usize {
        self.lock().spans.len()
    }

    /// Events captured after `mark`.
    pub fn events_since(&self, mark: usize) -> Vec<CapturedEvent> {
        self.lock().events.iter().skip(mark).cloned().collect()
    }

    /// Spans created after `mark`.
    pub fn spans_since(&self, mark: usize) -> Vec<CapturedSpan> {
        self.lock().spans.iter().skip(mark).cloned().collect()
    }

    /// Whether span `id` is `ancestor` or descends from it.
    pub fn descends_from(&self, id: u64, ancestor: u64) -> bool {
        let store = self.lock();
        let mut cur = Some(id);
        let mut hops = 0;
        while let Some(c) = cur {
            if c == ancestor {
                return true;
            }
            hops += 1;
            if hops > 10_000 {
                return false;
            }
            cur = store.spans.iter().rev().find(|s| s.id == c).and_then(|s| s.parent);
        }
        false
    }

    /// Where `needle` appears in any event or span (name, field), if anywhere.
    pub fn find_text(&self, needle: &str) -> Option<String> {
        self.find_text_from(needle, "")
    }

    /// Like [`find_text`](Self::find_text), over the events of targets starting with
    /// `target_prefix` only (this workspace's code, not a client library that logs raw backend
    /// answers from tasks of its own) and every span.
    pub fn find_text_from(&self, needle: &str, target_prefix: &str) -> Option<String> {
        let store = self.lock();
        for e in store.events.iter().filter(|e| e.target.starts_with(target_prefix)) {
            let t = e.text();
            if t.contains(needle) {
                return Some(format!("event: {t}"));
            }
        }
        for s in &store.spans {
            if s.name.contains(needle) {
                return Some(format!("span name: {}", s.name));
            }
            for (n, v) in &s.fields {
                if v.contains(needle) || n.contains(needle) {
                    return Some(format!("span {} field {n}={v}", s.name));
                }
            }
        }
        None
    }
}

struct CaptureLayer;

/// Our own span number, kept in the span's extensions. NB: the registry
/// reuses span ids after a span closes, so parentage is tracked by these
/// numbers, which are never reused.
#[derive(Clone, Copy)]
struct Seq(u64);

static NEXT_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[derive(Default)]
struct FieldsVisitor(Vec<(String, String)>);

impl Visit for FieldsVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        // Record the whole chain: a secret hiding in a source must be seen.
        let mut text = value.to_string();
        let mut next = value.source();
        while let Some(e) = next {
            let _ = write!(text, ": {e}");
            next = e.source();
        }
        self.0.push((field.name().to_owned(), text));
    }
}

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(capture) = Capture::current() else {
            return;
        };
        let mut visitor = FieldsVisitor::default();
        attrs.record(&mut visitor);
        let parent_id = if attrs.is_root() {
            None
        } else if let Some(p) = attrs.parent() {
            Some(p.clone())
        } else {
            ctx.current_span().id().cloned()
        };
        let parent = parent_id
            .and_then(|p| ctx.span(&p))
            .and_then(|p| p.extensions().get::<Seq>().map(|s| s.0));
        let seq = NEXT_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Seq(seq));
        }
        capture.lock().spans.push(CapturedSpan {
            id: seq,
            name: attrs.metadata().name().to_owned(),
            parent,
            fields: visitor.0,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(capture) = Capture::current() else {
            return;
        };
        let mut visitor = FieldsVisitor::default();
        values.record(&mut visitor);
        let Some(seq) = ctx.span(id).and_then(|s| s.extensions().get::<Seq>().map(|s| s.0)) else {
            return;
        };
        let mut store = capture.lock();
        if let Some(span) = store.spans.iter_mut().rev().find(|s| s.id == seq) {
            span.fields.extend(visitor.0);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(capture) = Capture::current() else {
            return;
        };
        let mut visitor = FieldsVisitor::default();
        event.record(&mut visitor);
        let (scope, scope_ids) = ctx
            .event_scope(event)
            .map(|scope| {
                let spans: Vec<_> = scope
                    .from_root()
                    .map(|s| {
                        let seq = s.extensions().get::<Seq>().map_or(0, |q| q.0);
                        (s.name().to_owned(), seq)
                    })
                    .collect();
                spans.into_iter().unzip()
            })
            .unwrap_or_default();
        capture.lock().events.push(CapturedEvent {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields: visitor.0,
            scope,
            scope_ids,
        });
    }
}
