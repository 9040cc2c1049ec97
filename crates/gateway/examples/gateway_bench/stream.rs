//! One long tunnel's throughput: the streaming target's bytes read as fast as the client can
//! for [`STREAM_FOR`], through tinyproxy directly and through the gateway to the same tinyproxy,
//! [`ROUNDS`] times each, taking turns (so a slow moment of the machine is not all one path's).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use crate::wire::{IO_TIMEOUT, open_tunnel};
use crate::world::World;

/// How long one tunnel is read.
pub(crate) const STREAM_FOR: Duration = Duration::from_secs(4);
/// Tunnels per path; the median is the figure.
pub(crate) const ROUNDS: usize = 3;

/// MiB/s of one tunnel through `proxy` (sent `auth`) from the streaming target.
async fn one(proxy: SocketAddr, auth: &str, target: SocketAddr) -> Result<f64, String> {
    let (mut tcp, rest) = open_tunnel(proxy, auth, target).await?;
    let started = Instant::now();
    let mut bytes = rest.len() as u64;
    let mut buf = vec![0u8; 256 * 1024];
    while started.elapsed() < STREAM_FOR {
        let n = match tokio::time::timeout(IO_TIMEOUT, tcp.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            Ok(Ok(_)) => return Err("the tunnel closed while streaming".into()),
            Ok(Err(e)) => return Err(format!("reading the stream: {e}")),
            Err(_) => return Err(format!("no byte for {IO_TIMEOUT:?}")),
        };
        bytes += n as u64;
    }
    Ok(bytes as f64 / (1024.0 * 1024.0) / started.elapsed().as_secs_f64())
}

/// The median MiB/s directly through tinyproxy 0 and through the gateway, which is asked for
/// that same tinyproxy by name (`backend=tinyproxy-0`).
pub(crate) async fn measure(world: &World) -> Result<(f64, f64), String> {
    let direct = (world.tinyproxy(0), World::backend_auth());
    let gateway = (world.gateway.addr, World::gateway_auth("backend=tinyproxy-0"));
    let (mut through_direct, mut through_gateway) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        through_direct.push(one(direct.0, &direct.1, world.stream).await?);
        through_gateway.push(one(gateway.0, &gateway.1, world.stream).await?);
    }
    Ok((median(through_direct), median(through_gateway)))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
