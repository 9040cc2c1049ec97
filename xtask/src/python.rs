//! The Python package's checks (`clients/python`), run by `cargo xtask test`: a virtual
//! environment of this checkout (`target/python-venv`) with the pinned tools and libraries of
//! `requirements-dev.txt` from the package registry, the package built as a wheel and installed
//! into it, then ruff, mypy and pytest. pytest's tests count one each in the closing line; ruff and mypy count as
//! one test together.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::tally::Counts;

/// The machines' Python; the package holds 3.10 through ruff's and mypy's target versions.
const PYTHON: &str = "python3";

/// Runs the checks; the counts, and the first problem when one failed.
pub(crate) fn check(root: &Path) -> Result<(Counts, Option<String>)> {
    let package = root.join("clients/python");
    let venv = crate::target_dir(root).join("python-venv");
    if !venv.join("bin/python").exists() {
        run(
            Command::new(PYTHON).args(["-m", "venv"]).arg(&venv),
            "making the virtual environment",
        )?;
    }
    let python = venv.join("bin/python");
    let pip = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check"];
    run(
        Command::new(&python)
            .args(pip)
            .arg("-r")
            .arg(package.join("requirements-dev.txt")),
        "installing the pinned test tools",
    )?;
    // Built as a wheel with the pinned backend just installed (not whatever version an
    // isolated build fetches), and installed afresh: the tests import what a user installs.
    run(
        Command::new(&python)
            .args(pip)
            .args(["--no-build-isolation", "--no-deps", "--force-reinstall"])
            .arg(&package),
        "building and installing the package",
    )?;
    let mut counts = Counts::default();
    let mut problem = None;
    let lint = run(
        Command::new(venv.join("bin/ruff"))
            .args(["check", "src", "tests"])
            .current_dir(&package),
        "ruff check",
    )
    .and_then(|()| {
        run(
            Command::new(venv.join("bin/ruff"))
                .args(["format", "--check", "src", "tests"])
                .current_dir(&package),
            "ruff format --check",
        )
    })
    .and_then(|()| {
        run(
            Command::new(venv.join("bin/mypy"))
                .args(["src", "tests"])
                .current_dir(&package),
            "mypy",
        )
    });
    match lint {
        Ok(()) => counts.passed += 1,
        Err(e) => {
            counts.failed += 1;
            problem = Some(format!("{e:#}"));
        }
    }
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&package)
        .output()
        .context("running pytest")?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let tested = summary(&text);
    counts.add(&tested);
    if !out.status.success() && problem.is_none() {
        problem = Some(format!("pytest failed ({})", tested.line()));
    }
    Ok((counts, problem))
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("{what}: could not start"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// pytest's closing line (`3 passed, 1 failed, 2 skipped in 0.12s`) as counts.
fn summary(text: &str) -> Counts {
    let mut counts = Counts::default();
    let Some(line) = text
        .lines()
        .rev()
        .find(|l| l.contains(" in ") && (l.contains("passed") || l.contains("failed") || l.contains("error")))
    else {
        return counts;
    };
    for part in line.trim_matches('=').trim().split(", ") {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next().and_then(|n| n.parse::<u64>().ok()), words.next()) else {
            continue;
        };
        match what {
            "passed" => counts.passed += n,
            "failed" | "error" | "errors" => counts.failed += n,
            "skipped" => counts.skipped += n,
            _ => {}
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytests_closing_line_is_counted() {
        let c = summary("....F\n1 failed, 4 passed, 2 skipped in 0.31s\n");
        assert_eq!((c.passed, c.failed, c.skipped), (4, 1, 2));
        let c = summary("==== 20 passed in 0.10s ====\n");
        assert_eq!((c.passed, c.failed), (20, 0));
        let c = summary("= 1 error in 0.02s =\n");
        assert_eq!(c.failed, 1);
        assert_eq!(summary("nothing ran\n"), Counts::default());
    }
}
