//! Counting what `cargo test` ran: its output is streamed through unchanged while every
//! `test result:` line is summed, so `cargo xtask test` can close with one line for the whole
//! workspace.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitStatus, Stdio};

use anyhow::{Context, Result};

/// Tests counted over one or more test binaries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    /// cargo's `ignored`.
    pub(crate) skipped: u64,
}

impl Counts {
    pub(crate) fn add(&mut self, other: &Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }

    /// `N passed, M failed`, with `, K skipped` when any were.
    pub(crate) fn line(&self) -> String {
        let mut line = format!("{} passed, {} failed", self.passed, self.failed);
        if self.skipped > 0 {
            line.push_str(&format!(", {} skipped", self.skipped));
        }
        line
    }
}

/// One test binary's closing line: `test result: ok. 3 passed; 0 failed; 1 ignored; ...`.
fn parse_result(line: &str) -> Option<Counts> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let (_, figures) = rest.split_once(". ")?;
    let mut counts = Counts::default();
    for part in figures.split(';') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => counts.passed = n,
            "failed" => counts.failed = n,
            "ignored" => counts.skipped = n,
            _ => {}
        }
    }
    Some(counts)
}

/// What the streamed output said, line by line.
#[derive(Debug, Default)]
struct Reading {
    counts: Counts,
    /// Binaries whose own result line said FAILED.
    binaries_failed: u64,
    /// Binaries cargo reported as failed (`error: test failed, to rerun pass ...`): more than
    /// `binaries_failed` means some died before their result line (a crash, an abort).
    binaries_reported_failed: u64,
}

/// `line` without ANSI colour sequences (`CARGO_TERM_COLOR=always` colours cargo's own lines).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then one final byte in @..~.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Reading {
    fn take(&mut self, line: &str) {
        let line = plain(line);
        if let Some(c) = parse_result(&line) {
            if c.failed > 0 || line.contains("test result: FAILED") {
                self.binaries_failed += 1;
            }
            self.counts.add(&c);
        } else if line.trim_start().starts_with("error: ") && line.contains(" failed, to rerun pass") {
            // `error: test failed, ...` for a test binary, `error: doctest failed, ...` for a
            // crate's doc tests.
            self.binaries_reported_failed += 1;
        }
    }

    /// The counts, where a failure no result line shows (a crashed binary, a build error)
    /// counts as one failed test each, so the closing line never says `0 failed` for a run that
    /// failed.
    fn finish(mut self, status: ExitStatus) -> Counts {
        self.counts.failed += self.binaries_reported_failed.saturating_sub(self.binaries_failed);
        if !status.success() && self.counts.failed == 0 {
            self.counts.failed = 1;
        }
        self.counts
    }
}

/// Runs `cmd` (a `cargo test`) with its output passed through as it comes, and returns its
/// status and what its result lines add up to.
pub(crate) fn run_counting(cmd: &mut Command) -> Result<(ExitStatus, Counts)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting cargo test")?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let stderr = child.stderr.take().context("cargo's stderr")?;
    // stderr carries cargo's own lines (compiling, `Running`, the rerun hints); each stream is
    // forwarded on a thread of its own so neither can fill up and stall the other.
    // A line that cannot be written (a full disk under a redirected stream) is dropped, not
    // fatal: `eprintln!` would panic the thread and lose the counts.
    let errors = std::thread::spawn(move || {
        let mut reading = Reading::default();
        let mut err = std::io::stderr();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(err, "{line}");
            reading.take(&line);
        }
        reading
    });
    let mut reading = Reading::default();
    let mut out = std::io::stdout();
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let _ = writeln!(out, "{line}");
        reading.take(&line);
    }
    let status = child.wait().context("waiting for cargo test")?;
    let from_stderr = errors
        .join()
        .map_err(|_| anyhow::anyhow!("the thread reading cargo's stderr panicked"))?;
    reading.binaries_reported_failed += from_stderr.binaries_reported_failed;
    reading.binaries_failed += from_stderr.binaries_failed;
    reading.counts.add(&from_stderr.counts);
    Ok((status, reading.finish(status)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn result_lines_are_read() {
        let ok = parse_result(
            "test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 0 filtered out; finished in 0.5s",
        );
        assert_eq!(
            ok,
            Some(Counts {
                passed: 12,
                failed: 0,
                skipped: 3
            })
        );
        let failed = parse_result("test result: FAILED. 4 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out");
        assert_eq!(
            failed,
            Some(Counts {
                passed: 4,
                failed: 2,
                skipped: 0
            })
        );
        assert_eq!(parse_result("running 3 tests"), None);
    }

    #[test]
    fn the_line_names_skips_only_when_there_are_some() {
        let mut c = Counts {
            passed: 7,
            failed: 1,
            skipped: 0,
        };
        assert_eq!(c.line(), "7 passed, 1 failed");
        c.skipped = 2;
        assert_eq!(c.line(), "7 passed, 1 failed, 2 skipped");
    }

    #[test]
    fn a_binary_that_died_before_its_result_line_counts_as_a_failure() {
        let mut r = Reading::default();
        r.take("test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
        r.take("test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out");
        r.take("error: test failed, to rerun pass `-p a --test one`");
        r.take("error: test failed, to rerun pass `-p a --test crashed`");
        let counts = r.finish(ExitStatus::from_raw(101 << 8));
        assert_eq!((counts.passed, counts.failed), (6, 2));
    }

    #[test]
    fn coloured_lines_and_failed_doctests_are_read() {
        let mut r = Reading::default();
        r.take("\u{1b}[0m\u{1b}[1mtest result: \u{1b}[31mFAILED\u{1b}[0m. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out");
        r.take("\u{1b}[1m\u{1b}[91merror\u{1b}[0m\u{1b}[1m: doctest failed, to rerun pass `-p a --doc`\u{1b}[0m");
        r.take("\u{1b}[1m\u{1b}[91merror\u{1b}[0m\u{1b}[1m: test failed, to rerun pass `-p a --test died`\u{1b}[0m");
        let counts = r.finish(ExitStatus::from_raw(101 << 8));
        // The doctest binary's own FAILED line accounts for its report; the binary that died
        // without one counts once.
        assert_eq!((counts.passed, counts.failed), (2, 2));
    }

    #[test]
    fn a_failed_run_without_results_is_not_reported_clean() {
        let counts = Reading::default().finish(ExitStatus::from_raw(101 << 8));
        assert_eq!(counts.line(), "0 passed, 1 failed");
        let counts = Reading::default().finish(ExitStatus::from_raw(0));
        assert_eq!(counts.line(), "0 passed, 0 failed");
    }
}
