//! A program's life, the same for every binary of the project:
//!
//! ```text
//! flags ─► -h / --version / a bad line (exit 2) ─► async runtime ─► tracing export ─► logger
//!       ─► "Starting" ─► SIGTERM/SIGINT watch ─► the program's body ─► trace flush ─► exit code
//! ```
//!
//! Exit codes follow the Go operator: 2 for an unusable command line, 1 for a failed start or
//! run, 0 after a clean shutdown.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::flags::{self, Flag, FlagError, Parsed};
use crate::logging::LogOptions;
use crate::telemetry;

/// The budget of the final trace flush.
const FLUSH_BUDGET: Duration = Duration::from_secs(10);

/// Who the program is, for its help, its start line and its spans.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// The binary's name, as the help and the hint after a bad command line give it.
    pub name: &'static str,
    /// The service name spans carry (unless `OTEL_SERVICE_NAME` says otherwise) and the start
    /// line names.
    pub service: &'static str,
    /// The commit the binary was built from, printed by `--version`.
    pub commit: &'static str,
    /// The compiler it was built with, on the start line.
    pub rust_version: &'static str,
    /// Keys of the lines inside some spans ([`crate::logging::SpanKeys`]).
    pub span_keys: &'static [crate::logging::SpanKeys],
}

impl Program {
    /// A program called `name` (its service name too), built from `commit`, with no span keys.
    pub const fn new(name: &'static str, commit: &'static str) -> Self {
        Self {
            name,
            service: name,
            commit,
            rust_version: "",
            span_keys: &[],
        }
    }
}

/// Options every program has: its logging settings (which [`flags::log_flags`] set) and
/// whether `--version` was asked for.
pub trait ProgramOptions {
    fn log(&mut self) -> &mut LogOptions;

    /// Whether to print the commit and exit; a program without a `--version` flag never does.
    fn version(&self) -> bool {
        false
    }
}

/// Why a program stops with exit code 1: the message, and the cause when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal {
    pub message: String,
    pub error: Option<String>,
    /// The file the problem is in, as its own log key.
    pub path: Option<String>,
}

impl Fatal {
    /// `message`, caused by `error`.
    pub fn new(message: impl Into<String>, error: impl std::fmt::Display) -> Self {
        Self {
            message: message.into(),
            error: Some(error.to_string()),
            path: None,
        }
    }

    /// `message` alone.
    pub fn plain(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            error: None,
            path: None,
        }
    }

    fn log(&self) {
        match (&self.error, &self.path) {
            (Some(error), Some(path)) => tracing::error!(error = %error, path = %path, "{}", self.message),
            (Some(error), None) => tracing::error!(error = %error, "{}", self.message),
            _ => tracing::error!("{}", self.message),
        }
    }
}

/// Parses the process's arguments with `flags` into `O`'s defaults and, unless they ask for
/// help or the version, runs `body` with them on a multi-threaded runtime ([`run`]).
pub fn main<O, F, Fut>(program: &Program, flags: &[Flag<O>], body: F) -> ExitCode
where
    O: ProgramOptions + Default,
    F: FnOnce(O, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), Fatal>>,
{
    let mut options = O::default();
    match flags::parse(flags, &mut options, std::env::args().skip(1)) {
        Ok(Parsed::Run) => {}
        Ok(Parsed::Help) => {
            eprint!("{}", flags::usage(program.name, flags));
            return ExitCode::SUCCESS;
        }
        Err(e) => return bad_command_line(program, &e),
    }
    if options.version() {
        println!("{}", program.commit);
        return ExitCode::SUCCESS;
    }
    block_on(run(program, options, body))
}

/// Says why the command line is unusable, before any logger exists: plain text, exit 2.
pub fn bad_command_line(program: &Program, error: &FlagError) -> ExitCode {
    eprintln!("{error}");
    eprintln!("Run {} -h to list the flags.", program.name);
    ExitCode::from(2)
}

/// Runs `future` to its end on a new multi-threaded runtime; tasks still running then (servers,
/// watches) are dropped without waiting on them.
pub fn block_on(future: impl Future<Output = ExitCode>) -> ExitCode {
    // reqwest (OTLP export) is built without a default crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(future);
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// Sets up tracing export and the logger, then runs `body` until it ends or a signal asks it to
/// stop (the token it gets is cancelled), then flushes the spans: the exit code says how it
/// went.
pub async fn run<O, F, Fut>(program: &Program, mut options: O, body: F) -> ExitCode
where
    O: ProgramOptions,
    F: FnOnce(O, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), Fatal>>,
{
    let env = |k: &str| std::env::var(k).ok();
    let tracing_mode = telemetry::mode(env);
    let provider = match &tracing_mode {
        Ok(mode) => telemetry::provider(*mode, program.service, program.commit),
        Err(e) => Err(e.clone()),
    };
    crate::logging::install(
        options.log(),
        provider.as_ref().ok().and_then(Option::as_ref),
        program.span_keys,
    );
    tracing::info!(
        commit = program.commit,
        rustVersion = program.rust_version,
        "Starting {}",
        program.service
    );
    let tracer = match provider {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "Failed to set up tracing");
            return ExitCode::FAILURE;
        }
    };
    match (&tracer, &tracing_mode) {
        (Some(_), Ok(mode)) => tracing::info!(exporter = ?mode, "tracing enabled"),
        _ => tracing::info!("tracing disabled"),
    }
    let shutdown = CancellationToken::new();
    if let Err(e) = on_signal(shutdown.clone()) {
        tracing::error!(error = %e, "Failed to install the signal handler");
        return ExitCode::FAILURE;
    }
    let outcome = body(options, shutdown).await;
    if let Some(provider) = tracer
        && let Err(e) = telemetry::shutdown(provider, FLUSH_BUDGET).await
    {
        tracing::error!(error = %e, "Failed to flush traces on shutdown");
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(fatal) => {
            fatal.log();
            ExitCode::FAILURE
        }
    }
}

/// Cancels `shutdown` at the first SIGTERM (as the kubelet sends) or SIGINT.
///
/// # Errors
///
/// The signal handlers cannot be installed.
pub fn on_signal(shutdown: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "Stopping"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "Stopping"),
        }
        shutdown.cancel();
    });
    Ok(())
}
