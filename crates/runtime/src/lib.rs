//! What every binary of the project shares, so that each one is composition:
//!
//! - [`flags`]: command lines parsed as Go's `flag` package parses them, from one table per
//!   program, and the `--zap-*` flags every binary takes;
//! - [`logging`]: log lines shaped like the Go operator's (zap through controller-runtime);
//! - [`telemetry`]: span export, switched by the standard OpenTelemetry environment variables;
//! - [`serve`]: the probe server (`/healthz`, `/readyz`) and the metrics server (plain, or HTTPS
//!   for callers the API server authorises or who present a configured token);
//! - [`process`]: a program's life from its command line to its exit code, with SIGTERM and
//!   SIGINT asking it to stop;
//! - [`files`]: followed files, and the one bounded read of a file from a path (the
//!   `egress-files` crate, which the crates below the runtime use directly).
//!
//! `examples/minimal.rs` is a whole program on it.

pub mod flags;
pub mod logging;
pub mod process;
pub mod serve;
pub mod telemetry;

/// Files read from a path and followed: the `egress-files` crate, for binaries.
pub use egress_files as files;
pub use process::{Fatal, Program, ProgramOptions};

/// The commit the binaries are built from (`build.rs`: `EGRESS_BUILD_COMMIT`, else git), for
/// `--version`, the start-up line and the `service.version` of exported spans.
pub const COMMIT: &str = env!("EGRESS_COMMIT");
/// The compiler they are built with, on the start-up line.
pub const RUSTC_VERSION: &str = env!("EGRESS_RUSTC_VERSION");
