//! The Python package's checks (`clients/python`), run by `cargo xtask test`: a virtual
//! environment of this checkout (`target/python-venv`) with the pinned tools and libraries of
//! `requirements-dev.txt` from the package registry, the package built as a wheel and installed
//! into it, then ruff, mypy and pytest, then the package built as users get it (a wheel and an
//! sdist, their metadata checked, the wheel installed into a fresh environment). pytest's tests
//! count one each in the closing line; ruff and mypy count as one test together, and so does
//! the build.

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
    let lint = lint(&venv, &package);
    match lint {
        Ok(()) => counts.passed += 1,
        Err(e) => {
            counts.failed += 1;
            problem = Some(format!("{e:#}"));
        }
    }
    // The tests against the real system start it with the xtask program the workspace's build
    // made beside the others (`dev --stack-file`): not this process's own file, which that
    // build may have replaced while it ran. As for the Rust tests, they fail rather than skip.
    let xtask = crate::target_dir(root).join("debug/xtask");
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&package)
        .env("EGRESS_STACK_COMMAND", &xtask)
        .env(egress_testkit::real::REQUIRED_ENV, "1")
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
    match package_installs(root, &python, &package) {
        Ok(()) => counts.passed += 1,
        Err(e) => {
            counts.failed += 1;
            problem.get_or_insert(format!("{e:#}"));
        }
    }
    Ok((counts, problem))
}

/// The package as users get it: a wheel and an sdist built (`python -m build`, the wheel from
/// the sdist), their metadata checked (`twine check --strict`), and the wheel, with its `scrapy`
/// extra, installed into a fresh virtual environment where every module imports.
fn package_installs(root: &Path, python: &Path, package: &Path) -> Result<()> {
    let target = crate::target_dir(root);
    let dist = target.join("python-dist");
    let fresh = target.join("python-fresh");
    for dir in [&dist, &fresh] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
    }
    run(
        Command::new(python)
            .args(["-m", "build", "--no-isolation", "--outdir"])
            .arg(&dist)
            .arg(package),
        "python -m build",
    )?;
    let built: Vec<_> = std::fs::read_dir(&dist)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    let wheel = built
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("python -m build made no wheel")?;
    if !built.iter().any(|p| p.to_string_lossy().ends_with(".tar.gz")) {
        bail!("python -m build made no sdist");
    }
    run(
        Command::new(python)
            .args(["-m", "twine", "check", "--strict"])
            .args(&built),
        "twine check",
    )?;
    run(
        Command::new(PYTHON).args(["-m", "venv"]).arg(&fresh),
        "making a fresh virtual environment",
    )?;
    let mut extra = wheel.as_os_str().to_owned();
    extra.push("[scrapy]");
    run(
        Command::new(fresh.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c"])
            .arg(package.join("requirements-dev.txt"))
            .arg(extra),
        "installing the wheel into a fresh virtual environment",
    )?;
    run(
        Command::new(fresh.join("bin/python")).args([
            "-c",
            "import egress_proxies, egress_proxies.scrapy, egress_proxies.transport",
        ]),
        "importing the installed wheel",
    )
}

/// ruff (check and format) and mypy over the package's sources and tests.
fn lint(venv: &Path, package: &Path) -> Result<()> {
    run(
        Command::new(venv.join("bin/ruff"))
            .args(["check", "src", "tests"])
            .current_dir(package),
        "ruff check",
    )
    .and_then(|()| {
        run(
            Command::new(venv.join("bin/ruff"))
                .args(["format", "--check", "src", "tests"])
                .current_dir(package),
            "ruff format --check",
        )
    })
    .and_then(|()| {
        run(
            Command::new(venv.join("bin/mypy"))
                .args(["src", "tests"])
                .current_dir(package),
            "mypy",
        )
    })
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
