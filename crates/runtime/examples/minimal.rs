//! A whole program on egress-runtime: Go-style flags, zap-shaped logs, `/metrics`, and a clean
//! stop at SIGTERM. `cargo run -p egress-runtime --example minimal -- --metrics-addr=:9090`
use std::sync::{Arc, Mutex};

use egress_runtime::flags::{Flag, Kind, log_flags};
use egress_runtime::{Fatal, Program, ProgramOptions, logging::LogOptions, process, serve};

#[derive(Default)]
struct Options {
    log: LogOptions,
    metrics: Option<String>,
}
impl ProgramOptions for Options {
    fn log(&mut self) -> &mut LogOptions {
        &mut self.log
    }
}

fn main() -> std::process::ExitCode {
    let set = |o: &mut Options, v: &str| {
        o.metrics = Some(v.to_owned());
        Ok(())
    };
    let mut flags = vec![Flag::new("metrics-addr", Kind::Text, ":8080", "Metrics address.", set)];
    flags.extend(log_flags());
    process::main(&Program::new("minimal", "dev"), &flags, |o, shutdown| async move {
        let addr = serve::bind_address("metrics-addr", o.metrics.as_deref().unwrap_or(":8080"));
        let (addr, registry) = (addr.map_err(Fatal::plain)?, Arc::new(Mutex::new(Default::default())));
        let limits = egress_http::Limits::default();
        let bound = serve::metrics(addr, registry, None, false, limits, shutdown.clone()).await;
        let bound = bound.map_err(|e| Fatal::new("Failed to serve metrics", e))?;
        tracing::info!(address = %bound, "Serving metrics");
        shutdown.cancelled().await;
        Ok(())
    })
}
