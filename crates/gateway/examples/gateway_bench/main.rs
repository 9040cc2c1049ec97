//! The gateway's figures, for `cargo xtask bench --only gateway`, all on loopback in one run
//! on the same backends (real tinyproxies asking for Basic credentials, leased from the
//! discovery API served here on a memory store), the gateway being the `egress-gateway` binary
//! (`--gateway PATH`) as a process of its own:
//!
//! 1. a new tunnel plus one small HTTPS request, [`load::CLIENTS`] clients at once: directly
//!    through tinyproxy, through the gateway on held sessions, through the gateway with a lease
//!    per tunnel; the discovery API's calls for the last two timed from the bench side, and the
//!    gateway's CPU time per request; then the same with one client; then the direct route and
//!    the held sessions with the clients paced to a share of the direct rate ([`load`]);
//! 2. one long tunnel's throughput through the gateway against directly through the same
//!    tinyproxy ([`stream`]);
//! 3. the gateway's resident memory with 1 000 idle tunnels open through it ([`idle`]).
//!
//! Prints one `name=value` line per figure (xtask lays them out as the guide's table);
//! progress goes to stderr.

mod idle;
mod load;
mod stream;
mod wire;
mod world;

use crate::load::Samples;

/// Tinyproxies behind the gateway: tinyproxy's test config takes 50 clients each, and the
/// direct route spreads its clients over them as the gateway's leases do.
const PROXIES: usize = 2;

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (bin, log) = world::args();
    let mut world = world::World::start(PROXIES, &bin, &log).await;
    eprintln!("gateway bench: idle tunnels");
    let memory = idle::measure(&world).await;
    eprintln!("gateway bench: requests");
    let routes = load::measure(&world).await;
    eprintln!("gateway bench: one long tunnel");
    let streamed = stream::measure(&world).await;
    assert!(
        world.gateway.running(),
        "the gateway exited during the bench; see {}",
        log.display()
    );
    let mut out: Vec<(String, String)> = [
        ("clients", load::CLIENTS.to_string()),
        ("proxies", PROXIES.to_string()),
        ("measure_s", load::MEASURE.as_secs().to_string()),
        ("alone_s", load::ALONE.as_secs().to_string()),
        ("paced_share_pct", format!("{:.0}", load::PACED_SHARE * 100.0)),
        ("stream_s", stream::STREAM_FOR.as_secs().to_string()),
        ("stream_rounds", stream::ROUNDS.to_string()),
        ("idle_tunnels", idle::IDLE_TUNNELS.to_string()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .into();
    for (name, route) in ["direct", "held", "own"].into_iter().zip(&routes) {
        out.extend(figures(name, &route.loaded));
        out.extend(figures(&format!("alone_{name}"), &route.alone));
        if !route.paced.sorted.is_empty() || route.paced.errors > 0 {
            out.extend(figures(&format!("paced_{name}"), &route.paced));
        }
        out.push((format!("{name}_gateway_cpu_ms"), format!("{:.3}", route.gateway_cpu_ms)));
    }
    out.extend(figures("session_acquire", &routes[1].api.acquire));
    out.extend(figures("acquire", &routes[2].api.acquire));
    out.extend(figures("release", &routes[2].api.release));
    match streamed {
        Ok((direct, gateway)) => {
            out.push(("stream_direct_mibs".into(), format!("{direct:.1}")));
            out.push(("stream_gateway_mibs".into(), format!("{gateway:.1}")));
        }
        Err(e) => eprintln!("gateway bench: the long tunnel failed: {e}"),
    }
    for (k, v) in [
        ("rss_before_kib", memory.before),
        ("rss_open_kib", memory.open),
        ("rss_after_kib", memory.after),
    ] {
        out.push((k.into(), v.to_string()));
    }
    out.push(("idle_opened".into(), memory.opened.to_string()));
    if let Some(e) = memory.first_error {
        eprintln!("gateway bench: idle tunnels: {e}");
    }
    for (name, value) in out {
        println!("{name}={value}");
    }
}

/// A run's `<name>_n`, `_errors`, `_per_s`, `_p50_ms`, `_p99_ms`; its first error to stderr.
fn figures(name: &str, s: &Samples) -> Vec<(String, String)> {
    if let Some(e) = &s.first_error {
        eprintln!("gateway bench: {name}: {} failed, e.g. {e}", s.errors);
    }
    [
        ("n", s.sorted.len().to_string()),
        ("errors", s.errors.to_string()),
        ("per_s", format!("{:.0}", s.per_second())),
        ("p50_ms", format!("{:.2}", s.ms(50.0))),
        ("p99_ms", format!("{:.2}", s.ms(99.0))),
    ]
    .into_iter()
    .map(|(suffix, v)| (format!("{name}_{suffix}"), v))
    .collect()
}
