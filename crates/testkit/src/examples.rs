//! Running a crate's example program from its tests, as a user of the crate would run it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The example `name` of the crate under test, which `cargo test` builds next to the test
/// binaries. A run of one test target alone (`--test example`) does not build examples: build
/// them with `cargo build --examples` first.
///
/// # Panics
/// When the binary is not there.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> → target/<profile>/examples/<name>
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: cargo test builds the examples (or run cargo build --examples)",
        path.display()
    );
    path
}

/// Runs `cmd` to its end with its output captured, killing it after `patience` (a budget the
/// program's own deadlines should stay inside, so that it reports its failure first).
///
/// # Panics
/// When the program cannot start, or is still running after `patience`.
pub fn run_example(cmd: &mut Command, patience: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the example");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(patience) {
        Ok(out) => out.expect("waiting for the example"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("the example did not finish within {patience:?}");
        }
    }
}

/// The example's standard output as lines, after checking that it exited with success (the
/// panic message shows both streams).
///
/// # Panics
/// When the program failed.
pub fn succeeded(out: &Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status
    );
    stdout.lines().map(str::to_owned).collect()
}
