//! The gateway's resident memory per 1 000 idle tunnels: its `VmRSS` before, with
//! [`IDLE_TUNNELS`] `CONNECT` tunnels open through it and nothing sent on them, and after they
//! closed. The backend is the bench's in-process CONNECT backend ([`crate::world::IdleBackend`]):
//! tinyproxy's test config takes 50 clients per process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::wire::open_tunnel;
use crate::world::World;

/// Idle tunnels held at once.
pub(crate) const IDLE_TUNNELS: usize = 1_000;
/// Tunnels being opened at once: the gateway asks the API for each, and the API queues at most
/// 256 requests of one client.
const OPENING_AT_ONCE: usize = 32;
/// How long the memory settles before each reading.
const SETTLE: Duration = Duration::from_secs(1);

/// The gateway's `VmRSS` in KiB before, with the tunnels, after; and how many opened.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub(crate) before: u64,
    pub(crate) open: u64,
    pub(crate) after: u64,
    pub(crate) opened: usize,
    pub(crate) first_error: Option<String>,
}

/// `n` tunnels through the gateway to the idle backend, [`OPENING_AT_ONCE`] at a time; the
/// open ones and the first failure.
async fn open_many(world: &World, n: usize) -> (Vec<TcpStream>, Option<String>) {
    let gate = Arc::new(tokio::sync::Semaphore::new(OPENING_AT_ONCE));
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (gate, gateway, destination) = (gate.clone(), world.gateway.addr, world.https);
        opening.spawn(async move {
            let _turn = gate.acquire_owned().await.expect("the gate stays open");
            open_tunnel(gateway, &World::gateway_auth("any"), destination).await
        });
    }
    let (mut open, mut first_error) = (Vec::with_capacity(n), None);
    while let Some(opened) = opening.join_next().await {
        match opened.expect("an opening task") {
            Ok((tcp, _)) => open.push(tcp),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    (open, first_error)
}

/// Waits (at most `limit`) until the idle backend holds `n` tunnels.
async fn until_held(world: &World, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while world.idle.open() != n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The memory figures; the API lists only the idle backend meanwhile.
pub(crate) async fn measure(world: &World) -> Memory {
    world.lease_idle_backend();
    // A few tunnels first: what the gateway sets up once (its API connections, buffers) is
    // not counted per tunnel.
    let (warm, _) = open_many(world, OPENING_AT_ONCE).await;
    drop(warm);
    until_held(world, 0, Duration::from_secs(30)).await;
    tokio::time::sleep(SETTLE).await;
    let before = world.gateway.rss_kib();
    let (open, first_error) = open_many(world, IDLE_TUNNELS).await;
    until_held(world, open.len(), Duration::from_secs(30)).await;
    tokio::time::sleep(SETTLE).await;
    let with_open = world.gateway.rss_kib();
    let opened = open.len();
    drop(open);
    until_held(world, 0, Duration::from_secs(30)).await;
    tokio::time::sleep(SETTLE).await;
    let after = world.gateway.rss_kib();
    // The gateway gives each tunnel's lease back as it closes; a burst of closes is a burst of
    // releases, which the API queues and may refuse: what is still held shows it.
    let left = crate::load::leases_each(&world.api).await;
    eprintln!(
        "gateway bench: leases still held on the idle backend {SETTLE:?} after the last idle tunnel closed: {left:?}"
    );
    world.lease_tinyproxies();
    Memory {
        before,
        open: with_open,
        after,
        opened,
        first_error,
    }
}
