//! The request bench: [`CLIENTS`] clients each opening a new tunnel and making one small HTTPS
//! request through it, again and again for [`MEASURE`], by one of three routes over the same
//! tinyproxies; then one client alone by each route for [`ALONE`] (no queueing: the latency a
//! route adds to one request); then the direct route and the held sessions again with the
//! clients paced to [`PACED_SHARE`] of the direct route's rate. While the gateway's routes run
//! loaded, one more client times the discovery API's calls the gateway makes for them, and the
//! gateway's CPU time is read.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use egress_discovery::client::{AcquireRequest, Client};
use tokio_util::sync::CancellationToken;

use crate::wire::https_request;
use crate::world::{TOKEN, World};

/// Clients at once.
pub(crate) const CLIENTS: usize = 64;
/// How long each route is measured with [`CLIENTS`] clients.
pub(crate) const MEASURE: Duration = Duration::from_secs(10);
/// How long each route is measured with one client.
pub(crate) const ALONE: Duration = Duration::from_secs(5);
/// The share of the direct route's loaded rate the paced runs ask for in all: enough clients
/// at once that they overlap, few enough requests that the cores have time to spare, so a
/// route's latency is its own work and not mostly the wait for a core.
pub(crate) const PACED_SHARE: f64 = 0.25;
/// The pause between two samples of the API probe: it samples the API under the gateway's load
/// without adding much of its own (at most 100 a second).
const PROBE_PAUSE: Duration = Duration::from_millis(10);

/// How a client reaches the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Straight to tinyproxy `i % proxies` with its credentials.
    Direct,
    /// Through the gateway in the session `bench-<i>`, warmed before the run.
    Held,
    /// Through the gateway as `any`: a lease per tunnel, given back at its close.
    Own,
}

const ROUTES: [Route; 3] = [Route::Direct, Route::Held, Route::Own];

/// Sorted latencies of one run and what failed.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    pub(crate) sorted: Vec<Duration>,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) elapsed: Duration,
}

impl Samples {
    /// Successful samples per second of the run.
    pub(crate) fn per_second(&self) -> f64 {
        self.sorted.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `p`-th percentile in milliseconds (nearest rank); 0 without samples.
    pub(crate) fn ms(&self, p: f64) -> f64 {
        if self.sorted.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * self.sorted.len() as f64).ceil() as usize;
        self.sorted[rank.clamp(1, self.sorted.len()) - 1].as_secs_f64() * 1e3
    }

    fn add(&mut self, other: Self) {
        self.sorted.extend(other.sorted);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn failed(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }

    fn finish(&mut self, started: Instant) {
        self.elapsed = started.elapsed();
        self.sorted.sort_unstable();
    }
}

/// Where client `i` sends its CONNECT by `route`, and its `Proxy-Authorization`.
fn hop(world: &World, route: Route, i: usize) -> (SocketAddr, String) {
    match route {
        Route::Direct => (world.tinyproxy(i % world.tinyproxies.len()), World::backend_auth()),
        Route::Held => (world.gateway.addr, World::gateway_auth(&format!("session=bench-{i}"))),
        Route::Own => (world.gateway.addr, World::gateway_auth("any")),
    }
}

/// How long each client of a run goes on.
#[derive(Debug, Clone, Copy)]
enum Until {
    Rounds(usize),
    Elapsed(Duration),
}

/// When each client of a run sends its requests: as soon as the last one is answered, or one
/// every `Some(interval)` (the clients' starts spread over one interval; a client whose request
/// took longer goes again at once).
type Pace = Option<Duration>;

/// `clients` clients' requests by `route` (clients `0..clients`).
async fn run(world: &World, route: Route, clients: usize, until: Until, pace: Pace) -> Samples {
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for i in 0..clients {
        let (proxy, auth) = hop(world, route, i);
        let (target, tls) = (world.https, world.tls.clone());
        running.spawn(async move {
            let mut samples = Samples::default();
            let mut done = 0;
            let mut next = pace.map(|p| tokio::time::Instant::from_std(started) + p * i as u32 / clients as u32);
            while match until {
                Until::Rounds(n) => done < n,
                Until::Elapsed(d) => started.elapsed() < d,
            } {
                done += 1;
                if let (Some(at), Some(interval)) = (next.as_mut(), pace) {
                    tokio::time::sleep_until(*at).await;
                    *at = (*at + interval).max(tokio::time::Instant::now());
                }
                let t = Instant::now();
                match https_request(proxy, &auth, target, &tls).await {
                    Ok(()) => samples.sorted.push(t.elapsed()),
                    Err(e) => {
                        samples.failed(e);
                        // A failing route must not spin: the next try waits a little.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            samples
        });
    }
    let mut all = Samples::default();
    while let Some(client) = running.join_next().await {
        all.add(client.expect("a client task"));
    }
    all.finish(started);
    all
}

/// The API's calls as one more client sees them: acquires, and releases (none in a session).
#[derive(Debug, Default)]
pub(crate) struct ApiCalls {
    pub(crate) acquire: Samples,
    pub(crate) release: Samples,
}

/// Samples, every [`PROBE_PAUSE`] until `stop`, the calls the gateway makes for a tunnel of
/// `route`, with its own API client type and the bench's token: for [`Route::Own`] an acquire
/// as for `any` (no selector, the target's host) and its release; for [`Route::Held`] the
/// acquire of a session that already holds its lease.
async fn probe_api(api: String, route: Route, stop: CancellationToken) -> ApiCalls {
    let client = Client::new(&api, Some(TOKEN.into())).expect("an API client");
    let request = AcquireRequest {
        target: Some("127.0.0.1".into()),
        session: (route == Route::Held).then(|| "bench-probe".to_owned()),
        ..Default::default()
    };
    let mut calls = ApiCalls::default();
    let started = Instant::now();
    while !stop.is_cancelled() {
        let t = Instant::now();
        match client.acquire(&request).await {
            Ok(lease) => {
                calls.acquire.sorted.push(t.elapsed());
                if request.session.is_none() {
                    let t = Instant::now();
                    match client.release(&lease.lease_id).await {
                        Ok(()) => calls.release.sorted.push(t.elapsed()),
                        Err(e) => calls.release.failed(e.to_string()),
                    }
                }
            }
            Err(e) => calls.acquire.failed(e.to_string()),
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    calls.acquire.finish(started);
    calls.release.finish(started);
    calls
}

/// The active leases on each proxy the API lists, in its order: how the held sessions spread.
pub(crate) async fn leases_each(api: &str) -> Vec<u64> {
    let client = Client::new(api, Some(TOKEN.into())).expect("an API client");
    match client.list(&Default::default()).await {
        Ok(proxies) => proxies.iter().map(|p| p.active_leases).collect(),
        Err(_) => Vec::new(),
    }
}

/// One route's figures.
#[derive(Debug, Default)]
pub(crate) struct RouteFigures {
    /// With [`CLIENTS`] clients.
    pub(crate) loaded: Samples,
    /// With one client.
    pub(crate) alone: Samples,
    /// With [`CLIENTS`] clients paced to [`PACED_SHARE`] of the direct route's loaded rate
    /// (none for a lease per tunnel).
    pub(crate) paced: Samples,
    /// The gateway's CPU time per successful request of the loaded run, in milliseconds.
    pub(crate) gateway_cpu_ms: f64,
    /// The API's calls for the route, sampled during the loaded run (none for the direct one).
    pub(crate) api: ApiCalls,
}

/// Route `route` with [`CLIENTS`] clients for [`MEASURE`], its API calls probed and the
/// gateway's CPU time read meanwhile.
async fn loaded(world: &World, route: Route) -> RouteFigures {
    let stop = CancellationToken::new();
    let probing = (route != Route::Direct).then(|| tokio::spawn(probe_api(world.api.clone(), route, stop.clone())));
    let cpu = world.gateway.cpu_seconds();
    let samples = run(world, route, CLIENTS, Until::Elapsed(MEASURE), None).await;
    let cpu = world.gateway.cpu_seconds() - cpu;
    stop.cancel();
    let api = match probing {
        Some(p) => p.await.expect("the API probe"),
        None => ApiCalls::default(),
    };
    RouteFigures {
        gateway_cpu_ms: cpu * 1e3 / samples.sorted.len().max(1) as f64,
        loaded: samples,
        alone: Samples::default(),
        paced: Samples::default(),
        api,
    }
}

/// The three routes: each client's first tunnel by each route made before any timing (so the
/// held sessions hold their lease, and every path's connections and caches are warm); then
/// each route loaded; then each route with one client; then the direct route and the held
/// sessions with the clients paced ([`PACED_SHARE`]).
pub(crate) async fn measure(world: &World) -> Vec<RouteFigures> {
    for route in ROUTES {
        let warm = run(world, route, CLIENTS, Until::Rounds(1), None).await;
        if let Some(e) = &warm.first_error {
            eprintln!("gateway bench: warm-up {route:?}: {} failed, e.g. {e}", warm.errors);
        }
    }
    eprintln!(
        "gateway bench: {CLIENTS} clients, {MEASURE:?} per route; the held sessions' leases per tinyproxy: {:?}",
        leases_each(&world.api).await
    );
    let mut figures = Vec::new();
    for route in ROUTES {
        figures.push(loaded(world, route).await);
    }
    eprintln!("gateway bench: one client, {ALONE:?} per route");
    for (route, f) in ROUTES.into_iter().zip(&mut figures) {
        f.alone = run(world, route, 1, Until::Elapsed(ALONE), None).await;
    }
    let rate = figures[0].loaded.per_second() * PACED_SHARE;
    let interval = Duration::from_secs_f64(CLIENTS as f64 / rate.max(1.0));
    eprintln!("gateway bench: {CLIENTS} clients paced to {rate:.0} requests a second in all");
    for (route, f) in ROUTES.into_iter().zip(&mut figures).take(2) {
        f.paced = run(world, route, CLIENTS, Until::Elapsed(MEASURE), Some(interval)).await;
    }
    figures
}
