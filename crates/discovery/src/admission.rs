//! Admission: which request is served now, which waits its turn, and which is refused, so that
//! work is shared between clients rather than connections.
//!
//! Each client (a name, see [`crate::Auth`]) has a [`Budget`]: a token bucket of requests
//! (`requests_per_second`, `burst`) and a cap on its requests served at once (`concurrency`).
//! Across clients the server serves at most `max_in_flight` requests at once.
//!
//! ```text
//! request ─► bucket empty? ──yes──► 429 rate_limited, Retry-After: seconds until a token
//!               │no
//!               ▼
//!          client under its cap and a slot free? ──yes──► served (a Permit; its drop frees the slot)
//!               │no
//!               ▼
//!          waits in its client's queue (at most WAITING_PER_CLIENT, at most MAX_WAIT)
//!               │ a slot frees: it goes to the waiting client with the fewest requests in
//!               │ flight (ties: the one waiting longest), never to one at its cap
//!               ▼
//!          served, or after MAX_WAIT refused: 429 when its own cap held it, 503 overloaded
//!          when the whole server was busy
//! ```
//!
//! A client with 64 connections therefore has no more requests in flight than a client with
//! 8 once both want more than their share; the other 56 wait without costing the server work.
//! Which client to serve next is a pure function ([`next_client`]) of what is in flight and
//! what waits.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_http::TokenBucket;
use tokio::sync::oneshot;

use crate::admission_metrics::AdmissionMetrics;
use crate::auth::ClientName;

/// The longest a request waits for its turn.
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// Requests of one client waiting at once; one more is refused at once.
pub const WAITING_PER_CLIENT: usize = 256;

/// A client's budget unless the clients config file gives it another (the flags' defaults).
/// The rate is well above what one replica serves (about 55 000 requests a second on a core of
/// this project's machines), so by default a client is held to its share of the server (its
/// concurrency, as many requests at once as the whole server serves), never refused for its
/// rate alone; a rate for a team is set in the clients config file.
pub const DEFAULT_BUDGET: Budget = Budget {
    requests_per_second: 200_000,
    burst: 200_000,
    concurrency: DEFAULT_MAX_IN_FLIGHT as u32,
};

/// Requests served at once across clients unless configured otherwise, with the in-memory
/// store. Its requests are all work for the core, so a few at once keep it busy, and few slots
/// are what makes the share between clients bind: with 16, a client with 64 connections still
/// got three times the share of one with 8 (the operator bench); with 4, about as much.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4;

/// Requests served at once, across clients and by one client, unless configured otherwise, with
/// a shared store (Redis): its requests mostly wait for the store's rounds of up to 64 calls,
/// which fewer requests at once would leave part empty (16 halved the pair rate on Redis).
pub const SHARED_STORE_AT_ONCE: u32 = 64;

/// The default budget and requests served at once for the store: shared (Redis) or not.
pub fn defaults(shared_store: bool) -> (Budget, usize) {
    if shared_store {
        let budget = Budget {
            concurrency: SHARED_STORE_AT_ONCE,
            ..DEFAULT_BUDGET
        };
        (budget, SHARED_STORE_AT_ONCE as usize)
    } else {
        (DEFAULT_BUDGET, DEFAULT_MAX_IN_FLIGHT)
    }
}

/// One client's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Requests a second, on average.
    pub requests_per_second: u32,
    /// Requests at once above the average (the bucket's capacity).
    pub burst: u32,
    /// Requests served at once; more wait their turn.
    pub concurrency: u32,
}

/// Every client's budget: the default, and the clients that have their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budgets {
    pub default: Budget,
    pub clients: BTreeMap<String, Budget>,
}

impl Budgets {
    /// Every client on `default`.
    pub fn uniform(default: Budget) -> Self {
        Self {
            default,
            clients: BTreeMap::new(),
        }
    }

    /// The budget of `client`.
    pub fn of(&self, client: &str) -> Budget {
        self.clients.get(client).copied().unwrap_or(self.default)
    }
}

/// Why a request was not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its client is over its budget: `429 rate_limited`, come back after `retry_after`.
    RateLimited { retry_after: Duration },
    /// Its client has as many requests waiting as may wait, or its own cap held it for
    /// [`MAX_WAIT`]: `429 rate_limited`.
    TooManyAtOnce,
    /// The whole server was busy for [`MAX_WAIT`]: `503 overloaded`.
    Overloaded,
}

impl Refusal {
    /// The metric label of the refusal.
    pub fn reason(self) -> &'static str {
        match self {
            Self::RateLimited { .. } => "rate",
            Self::TooManyAtOnce => "concurrency",
            Self::Overloaded => "overloaded",
        }
    }

    /// `Retry-After`, in whole seconds, at least 1.
    pub fn retry_after_seconds(self) -> u64 {
        match self {
            Self::RateLimited { retry_after } => retry_after.as_secs_f64().ceil().max(1.0) as u64,
            Self::TooManyAtOnce | Self::Overloaded => 1,
        }
    }
}

/// A request being served; dropping it frees its slot for the next.
#[must_use = "the slot is freed when the permit is dropped"]
pub struct Permit {
    admission: Admission,
    client: ClientName,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Permit({})", self.client)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission.release(&self.client);
    }
}

/// One client's state.
struct Client {
    budget: Budget,
    bucket: TokenBucket,
    in_flight: u32,
    /// Tickets in arrival order, each with where to hand its slot.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl Client {
    fn new(budget: Budget, now: Instant) -> Self {
        Self {
            budget,
            bucket: TokenBucket::full(budget.burst, budget.requests_per_second, Duration::from_secs(1), now),
            in_flight: 0,
            waiting: VecDeque::new(),
        }
    }

    fn under_cap(&self) -> bool {
        self.in_flight < self.budget.concurrency.max(1)
    }
}

/// What the scheduler knows of a client waiting for a slot (`K` names the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting<K> {
    pub client: K,
    pub in_flight: u32,
    /// Its cap on requests at once.
    pub concurrency: u32,
    /// Its longest-waiting request's ticket (smaller: waiting longer).
    pub oldest_ticket: u64,
}

/// Which waiting client gets the next free slot: among those under their cap, the one with the
/// fewest requests in flight; of those, the one waiting longest. `None`: nobody may take it.
pub fn next_client<K>(waiting: impl IntoIterator<Item = Waiting<K>>) -> Option<K> {
    waiting
        .into_iter()
        .filter(|w| w.in_flight < w.concurrency.max(1))
        .min_by_key(|w| (w.in_flight, w.oldest_ticket))
        .map(|w| w.client)
}

struct State {
    budgets: Arc<Budgets>,
    clients: HashMap<ClientName, Client>,
    in_flight: usize,
    next_ticket: u64,
    recent: Recent,
}

/// Another client's request this recent means the server's work is being shared.
const SHARED_WITHIN: Duration = Duration::from_millis(100);

/// The two clients whose requests arrived last (the latest first), each with when its last
/// one did: enough to tell when any client but a given one last sent a request.
#[derive(Default)]
struct Recent([Option<(ClientName, Instant)>; 2]);

impl Recent {
    fn arrived(&mut self, client: &ClientName, now: Instant) {
        match &mut self.0[0] {
            Some((latest, at)) if latest == client => *at = now,
            _ => {
                self.0[1] = self.0[0].take();
                self.0[0] = Some((client.clone(), now));
            }
        }
    }

    /// When a request of a client other than `client` last arrived.
    fn other_than(&self, client: &ClientName) -> Option<Instant> {
        match &self.0 {
            [Some((latest, _)), other] if latest == client => other.as_ref().map(|(_, at)| *at),
            [latest, _] => latest.as_ref().map(|(_, at)| *at),
        }
    }
}

struct Inner {
    state: Mutex<State>,
    max_in_flight: usize,
    metrics: AdmissionMetrics,
}

/// The server's admission, shared by every connection.
#[derive(Clone)]
pub struct Admission(Arc<Inner>);

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("max_in_flight", &self.0.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl Default for Admission {
    /// The defaults with the in-memory store.
    fn default() -> Self {
        Self::with_defaults(false, AdmissionMetrics::default())
    }
}

impl Admission {
    /// Every client on the default budget, with the default requests at once for the store:
    /// [`DEFAULT_BUDGET`] and [`DEFAULT_MAX_IN_FLIGHT`], or [`SHARED_STORE_AT_ONCE`] for both
    /// with a shared store.
    pub fn with_defaults(shared_store: bool, metrics: AdmissionMetrics) -> Self {
        let (budget, at_once) = defaults(shared_store);
        Self::new(Budgets::uniform(budget), at_once, metrics)
    }

    /// Admission with these budgets, serving at most `max_in_flight` requests at once (at
    /// least one).
    pub fn new(budgets: Budgets, max_in_flight: usize, metrics: AdmissionMetrics) -> Self {
        Self(Arc::new(Inner {
            state: Mutex::new(State {
                budgets: Arc::new(budgets),
                clients: HashMap::new(),
                in_flight: 0,
                next_ticket: 0,
                recent: Recent::default(),
            }),
            max_in_flight: max_in_flight.max(1),
            metrics,
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `budgets` in force: a client whose budget changed starts again with a full bucket.
    pub fn set_budgets(&self, budgets: Budgets) {
        self.state().budgets = Arc::new(budgets);
    }

    /// The budgets in force.
    pub fn budgets(&self) -> Arc<Budgets> {
        self.state().budgets.clone()
    }

    /// The metrics it keeps.
    pub fn metrics(&self) -> &AdmissionMetrics {
        &self.0.metrics
    }

    /// Admits a request of `client`: at once, after its turn came, or not at all.
    ///
    /// While another client is sending too, an admitted request holds its slot through one
    /// turn of the scheduler before it goes on. Without that turn, a request whose work is all
    /// for the core runs to its end within one poll, so the slots are never all taken, nobody
    /// waits, and the runtime's turn order, connection by connection, decides who is served: a
    /// client with 64 connections got eight times the share of one with 8 (the operator bench).
    ///
    /// # Errors
    /// Why it is not served.
    pub async fn admit(&self, client: &ClientName) -> Result<Permit, Refusal> {
        let (permit, shared) = self.slot(client).await?;
        if shared {
            tokio::task::yield_now().await;
        }
        Ok(permit)
    }

    /// A slot for a request of `client`, and whether another client was sending meanwhile
    /// (always, when it had to wait).
    async fn slot(&self, client: &ClientName) -> Result<(Permit, bool), Refusal> {
        let mut waiter = match self.enter(client, Instant::now()) {
            Entry::Now { shared } => return Ok((self.permit(client), shared)),
            Entry::Refused(refusal) => return Err(self.refused(client, refusal)),
            Entry::Wait(ticket, rx) => Waiter {
                admission: self,
                client,
                ticket,
                rx,
            },
        };
        if let Ok(Ok(())) = tokio::time::timeout(MAX_WAIT, &mut waiter.rx).await {
            waiter.ticket = u64::MAX; // its turn came: nothing to undo
            return Ok((self.permit(client), true));
        }
        // Out of time. Under the queue's lock: a turn that came as the time ran out is taken,
        // not wasted. (The sender goes only with its queue entry.)
        match waiter.settle() {
            Ok(()) => Ok((self.permit(client), true)),
            Err(refusal) => Err(self.refused(client, refusal)),
        }
    }

    fn permit(&self, client: &ClientName) -> Permit {
        self.0.metrics.started(client.as_str());
        Permit {
            admission: self.clone(),
            client: client.clone(),
        }
    }

    fn refused(&self, client: &ClientName, refusal: Refusal) -> Refusal {
        self.0.metrics.refused(client.as_str(), refusal.reason());
        refusal
    }

    /// The decision at arrival, under the lock.
    fn enter(&self, name: &ClientName, now: Instant) -> Entry {
        let mut state = self.state();
        let budget = state.budgets.of(name.as_str());
        let global_free = state.in_flight < self.0.max_in_flight;
        let ticket = state.next_ticket;
        let client = state
            .clients
            .entry(name.clone())
            .or_insert_with(|| Client::new(budget, now));
        if client.budget != budget {
            *client = Client {
                in_flight: client.in_flight,
                waiting: std::mem::take(&mut client.waiting),
                ..Client::new(budget, now)
            };
        }
        if let Err(wait) = client.bucket.try_take(now) {
            return Entry::Refused(Refusal::RateLimited { retry_after: wait });
        }
        // Nobody of this client waits ahead of it, and it may start: it starts.
        if client.waiting.is_empty() && client.under_cap() && global_free {
            client.in_flight += 1;
            state.in_flight += 1;
            let shared = state
                .recent
                .other_than(name)
                .is_some_and(|at| now.saturating_duration_since(at) < SHARED_WITHIN);
            state.recent.arrived(name, now);
            return Entry::Now { shared };
        }
        if client.waiting.len() >= WAITING_PER_CLIENT {
            return Entry::Refused(Refusal::TooManyAtOnce);
        }
        let (tx, rx) = oneshot::channel();
        client.waiting.push_back((ticket, tx));
        state.next_ticket += 1;
        state.recent.arrived(name, now);
        self.0.metrics.queued(name.as_str());
        Entry::Wait(ticket, rx)
    }

    /// A request of `name` was served: its slot goes to the next.
    fn release(&self, name: &ClientName) {
        self.0.metrics.finished(name.as_str());
        self.free_slot(name);
    }

    /// Frees a slot of `name` and hands free slots to waiting clients.
    fn free_slot(&self, name: &ClientName) {
        let mut state = self.state();
        if let Some(client) = state.clients.get_mut(name) {
            client.in_flight = client.in_flight.saturating_sub(1);
        }
        state.in_flight = state.in_flight.saturating_sub(1);
        self.hand_over(&mut state);
    }

    /// Gives each free slot to the client [`next_client`] picks, until none is free or none may
    /// take one.
    fn hand_over(&self, state: &mut State) {
        while state.in_flight < self.0.max_in_flight {
            let waiting = state.clients.iter().filter_map(|(name, c)| {
                c.waiting.front().map(|(ticket, _)| Waiting {
                    client: name,
                    in_flight: c.in_flight,
                    concurrency: c.budget.concurrency,
                    oldest_ticket: *ticket,
                })
            });
            let Some(next) = next_client(waiting).cloned() else {
                return;
            };
            let Some(client) = state.clients.get_mut(&next) else {
                return;
            };
            let Some((_, tx)) = client.waiting.pop_front() else {
                return;
            };
            self.0.metrics.dequeued(next.as_str());
            // Counted before it is handed over: the waiter owns the slot from the send on.
            client.in_flight += 1;
            state.in_flight += 1;
            if tx.send(()).is_err() {
                // Its waiter is gone (it gives up under this lock, so this cannot be).
                client.in_flight -= 1;
                state.in_flight -= 1;
            }
        }
    }
}

/// What [`Admission::enter`] decided.
enum Entry {
    /// Served now; `shared` when another client sent a request within [`SHARED_WITHIN`].
    Now {
        shared: bool,
    },
    Refused(Refusal),
    Wait(u64, oneshot::Receiver<()>),
}

/// A request waiting for its turn. Dropped before its turn came (its connection went), it
/// leaves the queue; dropped after, it frees the slot it was handed.
struct Waiter<'a> {
    admission: &'a Admission,
    client: &'a ClientName,
    /// `u64::MAX` once it holds a permit.
    ticket: u64,
    rx: oneshot::Receiver<()>,
}

impl Waiter<'_> {
    /// Ends the wait: the slot if it was handed over, else out of the queue and why it waited.
    fn settle(&mut self) -> Result<(), Refusal> {
        let mut state = self.admission.state();
        let handed = self.leave(&mut state);
        self.ticket = u64::MAX;
        if handed {
            return Ok(());
        }
        let own_cap = state.clients.get(self.client).is_some_and(|c| !c.under_cap());
        Err(if own_cap {
            Refusal::TooManyAtOnce
        } else {
            Refusal::Overloaded
        })
    }

    /// Removes its ticket from the queue; `true` when a slot had been handed to it instead.
    fn leave(&mut self, state: &mut State) -> bool {
        if let Some(client) = state.clients.get_mut(self.client)
            && let Some(at) = client.waiting.iter().position(|(t, _)| *t == self.ticket)
        {
            client.waiting.remove(at);
            self.admission.0.metrics.dequeued(self.client.as_str());
            return false;
        }
        self.rx.try_recv().is_ok()
    }
}

impl Drop for Waiter<'_> {
    /// Its connection went while it waited: it leaves the queue, or gives back the slot it was
    /// handed meanwhile.
    fn drop(&mut self) {
        if self.ticket == u64::MAX {
            return;
        }
        let handed = {
            let mut state = self.admission.state();
            self.leave(&mut state)
        };
        if handed {
            self.admission.free_slot(self.client);
        }
    }
}

#[cfg(test)]
mod tests;
