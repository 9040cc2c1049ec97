//! How a bench prints its result: one line of the conditions it ran under (the bench, its
//! counts and durations, the build, the commit, the machine), then one Markdown table. A guide
//! shows the two as they are printed, so updating its figures is a copy; what came before
//! belongs in the commit message that replaces them, not in the guide.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// What every bench's conditions line says besides the bench's own setup.
pub(crate) struct Conditions {
    /// `release` or `debug`.
    profile: &'static str,
    /// The commit measured, and whether the tree had changes on top of it.
    commit: String,
    machine: String,
}

impl Conditions {
    /// The conditions of a run from `root`, of a release build when `release`.
    pub(crate) fn here(root: &Path, release: bool) -> Self {
        Self {
            profile: super::profile(release),
            commit: commit(root),
            machine: machine(),
        }
    }

    /// The line printed above bench `bench`'s table; `setup` says what it measured and how
    /// (counts, durations), as a sentence without its full stop.
    pub(crate) fn line(&self, bench: &str, setup: &str) -> String {
        format!(
            "`cargo xtask bench --only {bench}`: {setup}. A {} build of {}, on {}.",
            self.profile, self.commit, self.machine
        )
    }
}

/// The commit checked out in `root` (short hash), saying so when the tree has uncommitted
/// changes to tracked files.
fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(hash) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if changes.is_empty() => format!("commit {hash}"),
            _ => format!("commit {hash} with uncommitted changes"),
        },
        None => "an unknown commit (no git)".to_owned(),
    }
}

/// This machine: its cores, CPU model and memory, from `/proc`.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    describe_machine(cores, &cpuinfo, &meminfo)
}

/// "2 cores (model), 7.8 GiB of memory" from the core count and `/proc`'s two files; what a
/// file does not say is left out.
fn describe_machine(cores: usize, cpuinfo: &str, meminfo: &str) -> String {
    let field = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == key))
            .map(|(_, v)| v.trim().to_owned())
    };
    let mut out = format!("{cores} {}", if cores == 1 { "core" } else { "cores" });
    if let Some(model) = field(cpuinfo, "model name") {
        let model = model.split_whitespace().collect::<Vec<_>>().join(" ");
        let _ = write!(out, " ({model})");
    }
    let kib = field(meminfo, "MemTotal").and_then(|v| v.trim_end_matches("kB").trim().parse::<f64>().ok());
    if let Some(kib) = kib {
        let _ = write!(out, ", {:.1} GiB of memory", kib / (1024.0 * 1024.0));
    }
    out
}

/// One Markdown table: a header row, then rows of as many cells.
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; its cells are the header's in number.
    pub(crate) fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        let cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        debug_assert_eq!(cells.len(), self.header.len(), "{cells:?}");
        self.rows.push(cells);
        self
    }

    /// The table as Markdown; a `|` in a cell is escaped so it stays one cell.
    pub(crate) fn markdown(&self) -> String {
        let line = |cells: &[String]| {
            let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
            format!("| {} |\n", cells.join(" | "))
        };
        let mut out = line(&self.header);
        out.push_str(&format!("|{}\n", "---|".repeat(self.header.len())));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }

    /// Prints the conditions line and the table, set apart by blank lines, as a guide shows them.
    pub(crate) fn print(&self, conditions: &str) {
        println!("\n{conditions}\n\n{}", self.markdown());
    }
}

/// A duration in seconds, to a tenth: `10.6 s`.
pub(crate) fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// A duration in whole milliseconds: `22 ms`.
pub(crate) fn millis(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// A count with its thousands set apart as the guides write them: `198 432`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(d);
    }
    out
}

/// KiB as MiB, to a tenth: `63.5 MiB`.
pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_markdown_with_pipes_in_cells_escaped() {
        let mut table = Table::new(&["Figure", "Value"]);
        table.row(["failover p50 / p99", "22 ms / 38 ms"]).row(["a | b", "1"]);
        assert_eq!(
            table.markdown(),
            "| Figure | Value |\n|---|---|\n| failover p50 / p99 | 22 ms / 38 ms |\n| a \\| b | 1 |\n"
        );
    }

    #[test]
    fn the_machine_is_its_cores_model_and_memory_and_leaves_out_what_proc_does_not_say() {
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC  7B13\nprocessor\t: 1\nmodel name\t: AMD EPYC  7B13\n";
        let meminfo = "MemTotal:        8144000 kB\nMemFree:  1 kB\n";
        assert_eq!(
            describe_machine(2, cpuinfo, meminfo),
            "2 cores (AMD EPYC 7B13), 7.8 GiB of memory"
        );
        assert_eq!(describe_machine(1, "", "garbage"), "1 core");
    }

    #[test]
    fn the_conditions_line_names_the_bench_its_setup_the_build_the_commit_and_the_machine() {
        let conditions = Conditions {
            profile: "release",
            commit: "commit 0123456789ab".to_owned(),
            machine: "2 cores".to_owned(),
        };
        assert_eq!(
            conditions.line("pool", "a pool of 100 members"),
            "`cargo xtask bench --only pool`: a pool of 100 members. A release build of commit \
             0123456789ab, on 2 cores."
        );
    }

    #[test]
    fn figures_are_written_as_the_guides_write_them() {
        assert_eq!(seconds(Duration::from_millis(10_640)), "10.6 s");
        assert_eq!(millis(Duration::from_micros(22_400)), "22 ms");
        assert_eq!(count(198_432), "198 432");
        assert_eq!(count(1_000_000), "1 000 000");
        assert_eq!(count(981), "981");
        assert_eq!(mib(65_024), "63.5 MiB");
    }
}
