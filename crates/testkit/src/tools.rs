//! Finding the real programs a test drives.

use std::path::PathBuf;

/// `tool` on `PATH`. `None` (the caller skips `test`, and this says so) only when real backends
/// are not required ([`crate::real::skip_or_fail`]): under `cargo xtask test` a missing tool fails
/// the test.
///
/// # Panics
/// When `tool` is missing and real backends are required.
pub fn on_path(tool: &str, test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        crate::real::skip_or_fail(test, &format!("no {tool} on PATH"));
    }
    found
}

/// Makes a named pipe (FIFO) at `path`, with coreutils' `mkfifo`: what a file read by the
/// code under test must not stall on.
///
/// # Panics
/// When `mkfifo` is missing or fails.
pub fn make_fifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo (coreutils)");
    assert!(made.success(), "mkfifo {}", path.display());
}
