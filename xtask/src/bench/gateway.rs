//! `cargo xtask bench --only gateway`: the gateway's cost over tinyproxy alone, in one run on
//! the same backends. The `egress-gateway` binary is built here and run as a process of its own
//! by the bench program (`crates/gateway/examples/gateway_bench`), which serves the discovery
//! API, starts the tinyproxies and the targets, and prints one `name=value` line per figure;
//! this lays them out as the guide's table (docs/gateway.md#figures).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::examples::example;
use super::report::{self, Conditions, Table};

/// What the bench program printed, by name.
type Figures = BTreeMap<String, String>;

/// Builds the gateway binary, runs the bench program against it and prints the table.
pub(super) fn run(root: &Path, release: bool, conditions: &Conditions) -> Result<()> {
    let mut build = Command::new(crate::cargo_bin());
    build.current_dir(root).args(["build", "-p", "egress-gateway-bin"]);
    if release {
        build.arg("--release");
    }
    if !build.status().context("running cargo build")?.success() {
        bail!("building egress-gateway failed");
    }
    let target = crate::target_dir(root);
    let bin = target.join(super::profile(release)).join("egress-gateway");
    let dir = target.join("bench-gateway");
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("gateway.log");
    let out = example(root, "egress-gateway", "gateway_bench", release)
        .arg("--")
        .arg("--gateway")
        .arg(&bin)
        .arg("--log")
        .arg(&log)
        .stderr(Stdio::inherit())
        .output()
        .context("running the gateway bench")?;
    if !out.status.success() {
        bail!("the gateway bench failed (the gateway's log: {})", log.display());
    }
    let figures = parse(&String::from_utf8_lossy(&out.stdout));
    table(&figures).print(&conditions.line("gateway", &setup(&figures)));
    Ok(())
}

/// `name=value` lines; anything else is left out.
fn parse(stdout: &str) -> Figures {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// Figure `name` as a number, when the bench printed it.
fn num(f: &Figures, name: &str) -> Option<f64> {
    f.get(name).and_then(|v| v.parse().ok())
}

/// Figure `name` as printed, `?` when missing.
fn text<'a>(f: &'a Figures, name: &str) -> &'a str {
    f.get(name).map_or("?", String::as_str)
}

/// A route's requests per second, p50 / p99, and its failures.
fn route(f: &Figures, name: &str) -> String {
    let per_s = num(f, &format!("{name}_per_s")).map_or("?".to_owned(), |n| report::count(n as u64));
    format!(
        "{per_s}/s, {} ms / {} ms ({} failed)",
        text(f, &format!("{name}_p50_ms")),
        text(f, &format!("{name}_p99_ms")),
        text(f, &format!("{name}_errors"))
    )
}

/// What route `name` adds over the direct route at p50 and p99 (`prefix` names the run:
/// empty for the loaded one, `alone_` for one client's).
fn added(f: &Figures, prefix: &str, name: &str) -> String {
    let diff = |q: &str| {
        let route = num(f, &format!("{prefix}{name}_{q}_ms"));
        match (route, num(f, &format!("{prefix}direct_{q}_ms"))) {
            (Some(a), Some(b)) => format!("{:+.2} ms", a - b),
            _ => "?".to_owned(),
        }
    };
    format!("{} / {}", diff("p50"), diff("p99"))
}

/// p50 / p99 of run `name`.
fn p50_p99(f: &Figures, name: &str) -> String {
    format!(
        "{} ms / {} ms",
        text(f, &format!("{name}_p50_ms")),
        text(f, &format!("{name}_p99_ms"))
    )
}

/// KiB as MiB, `?` when missing.
fn mib(f: &Figures, name: &str) -> String {
    num(f, name).map_or("?".to_owned(), |k| report::mib(k as u64))
}

/// The streams' MiB/s and the gateway's share of the direct rate.
fn streams(f: &Figures) -> (String, String) {
    let (direct, gateway) = (num(f, "stream_direct_mibs"), num(f, "stream_gateway_mibs"));
    let rates = format!(
        "{} MiB/s / {} MiB/s",
        text(f, "stream_direct_mibs"),
        text(f, "stream_gateway_mibs")
    );
    let share = match (direct, gateway) {
        (Some(d), Some(g)) if d > 0.0 => format!("{:.0} %", g / d * 100.0),
        _ => "?".to_owned(),
    };
    (rates, share)
}

/// The memory growth per 1 000 of the idle tunnels that opened.
fn per_thousand(f: &Figures) -> String {
    match (num(f, "rss_before_kib"), num(f, "rss_open_kib"), num(f, "idle_opened")) {
        (Some(before), Some(open), Some(n)) if n > 0.0 => {
            let kib = (open - before) / n * 1000.0;
            format!(
                "{} (≈ {:.1} KiB a tunnel)",
                report::mib(kib.max(0.0) as u64),
                kib / 1000.0
            )
        }
        _ => "?".to_owned(),
    }
}

/// How the API's calls were timed, as the table says it.
const PROBED: &str = "timed from the bench side: one more client (egress-discovery's client, as the \
    gateway uses it, with the same token) making the call every 10 ms while the route runs";

/// The guide's table.
fn table(f: &Figures) -> Table {
    let mut t = Table::new(&["Figure", "Value", "Goal"]);
    let mut row = |figure: String, value: String, goal: &str| {
        t.row([figure, value, goal.to_owned()]);
    };
    let clients = text(f, "clients");
    row(
        format!(
            "(a) new tunnel + one HTTPS request, {clients} clients, directly through tinyproxy: requests/s, p50 / p99"
        ),
        route(f, "direct"),
        "",
    );
    row(
        "(b) the same through the gateway on held sessions (`session=bench-<i>`, each warmed once)".to_owned(),
        route(f, "held"),
        "",
    );
    row(
        "(b) added over (a): p50 / p99".to_owned(),
        added(f, "", "held"),
        "p99 under 1 ms",
    );
    row(
        "(c) the same through the gateway, a lease per tunnel (`any`)".to_owned(),
        route(f, "own"),
        "",
    );
    row("(c) added over (a): p50 / p99".to_owned(), added(f, "", "own"), "");
    row(
        "the gateway's CPU time per request, (b) / (c) (its utime + stime from /proc over the run)".to_owned(),
        format!(
            "{} ms / {} ms",
            text(f, "held_gateway_cpu_ms"),
            text(f, "own_gateway_cpu_ms")
        ),
        "",
    );
    row(
        format!(
            "(b)'s discovery API call per tunnel, a session's acquire (the gateway asks again for every tunnel of a session), {PROBED}: p50 / p99"
        ),
        p50_p99(f, "session_acquire"),
        "",
    );
    row(
        format!(
            "(c)'s discovery API calls, {PROBED}: acquire p50 / p99, release p50 / p99 (the release comes after the client's close)"
        ),
        format!("{}, {}", p50_p99(f, "acquire"), p50_p99(f, "release")),
        "",
    );
    quiet_rows(f, &mut row);
    other_rows(f, &mut row);
    t
}

/// The rows where the cores are not kept busy: one client alone, and the clients paced.
fn quiet_rows(f: &Figures, row: &mut impl FnMut(String, String, &str)) {
    row(
        "one client alone (no queueing): (a) / (b) / (c) p50 / p99".to_owned(),
        format!(
            "{}; {}; {}",
            p50_p99(f, "alone_direct"),
            p50_p99(f, "alone_held"),
            p50_p99(f, "alone_own")
        ),
        "",
    );
    row(
        "one client alone: (b) added over (a) p50 / p99; (c) added over (a)".to_owned(),
        format!("{}; {}", added(f, "alone_", "held"), added(f, "alone_", "own")),
        "",
    );
    let (clients, share) = (text(f, "clients"), text(f, "paced_share_pct"));
    row(
        format!(
            "{clients} clients paced to {share} % of (a)'s requests per second in all (the cores not kept busy): (a) / (b) requests/s, p50 / p99"
        ),
        format!("{}; {}", route(f, "paced_direct"), route(f, "paced_held")),
        "",
    );
    row(
        "paced: (b) added over (a) p50 / p99".to_owned(),
        added(f, "paced_", "held"),
        "",
    );
}

/// The long tunnel's rows and the memory rows.
fn other_rows(f: &Figures, row: &mut impl FnMut(String, String, &str)) {
    let (rates, share) = streams(f);
    row(
        "one long tunnel from a target streaming as fast as it can: directly through tinyproxy / through the gateway to the same tinyproxy".to_owned(),
        rates,
        "",
    );
    row(
        "the long tunnel through the gateway, share of direct".to_owned(),
        share,
        "at least 80 %",
    );
    let idle = num(f, "idle_tunnels").map_or("?".to_owned(), |n| report::count(n as u64));
    row(
        format!(
            "gateway VmRSS: before / with {idle} idle CONNECT tunnels open / after they closed (backend: the bench's in-process CONNECT backend, not tinyproxy)"
        ),
        format!(
            "{} / {} / {}",
            mib(f, "rss_before_kib"),
            mib(f, "rss_open_kib"),
            mib(f, "rss_after_kib")
        ),
        "",
    );
    let opened = num(f, "idle_opened").map_or("?".to_owned(), |n| report::count(n as u64));
    row(
        format!("gateway memory per 1 000 idle tunnels ({opened} of {idle} opened)"),
        per_thousand(f),
        "",
    );
}

/// The conditions line's account of the setup.
fn setup(f: &Figures) -> String {
    format!(
        "the `egress-gateway` binary as a process of its own, leasing from the discovery API on a \
         memory store (served in the bench's process, one token); {proxies} real tinyproxies \
         (Basic credentials, MaxClients 50 each; the direct clients spread over them as the \
         leases are) in front of an HTTPS target in the bench's process, all on loopback and \
         sharing the machine's cores; {clients} clients each opening a new tunnel, TLS to the \
         target, `GET`, the answer read, closed, again and again for {measure} s per route, after \
         one request of each client by each route; then one client for {alone} s per route; then \
         (a) and (b) for {measure} s each with the clients paced to {share} % of (a)'s rate; the \
         long tunnel read for {stream} s, {rounds} times per path taking turns, \
         the median; the {idle} idle tunnels through the gateway to a bench-only in-process \
         CONNECT backend (it answers 200 and holds the tunnel without dialling the destination, \
         with no client limit: tinyproxy's test config takes 50 clients per process), VmRSS of \
         the gateway process from /proc 1 s after each step",
        proxies = text(f, "proxies"),
        clients = text(f, "clients"),
        measure = text(f, "measure_s"),
        alone = text(f, "alone_s"),
        share = text(f, "paced_share_pct"),
        stream = text(f, "stream_s"),
        rounds = text(f, "stream_rounds"),
        idle = num(f, "idle_tunnels").map_or("?".to_owned(), |n| report::count(n as u64)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_puts_each_figure_in_its_row_and_marks_what_is_missing() {
        let f = parse(
            "clients=64\ndirect_per_s=1234\ndirect_p50_ms=10.00\ndirect_p99_ms=20.00\ndirect_errors=0\n\
             held_per_s=1000\nheld_p50_ms=10.50\nheld_p99_ms=21.25\nheld_errors=1\n\
             alone_direct_p50_ms=1.00\nalone_direct_p99_ms=2.00\nalone_held_p50_ms=1.25\n\
             paced_share_pct=25\npaced_direct_p50_ms=5.00\npaced_direct_p99_ms=9.00\n\
             paced_held_p50_ms=5.40\npaced_held_p99_ms=9.75\n\
             stream_direct_mibs=1000.0\nstream_gateway_mibs=850.0\nidle_tunnels=1000\n\
             rss_before_kib=10240\nrss_open_kib=30720\nidle_opened=1000\nnoise\n",
        );
        let md = table(&f).markdown();
        let rows: Vec<&str> = md.lines().collect();
        assert_eq!(rows.len(), 18);
        assert!(rows[2].contains("64 clients"), "{}", rows[2]);
        assert!(
            rows[2].contains("| 1 234/s, 10.00 ms / 20.00 ms (0 failed) |"),
            "{}",
            rows[2]
        );
        assert!(
            rows[4].contains("| +0.50 ms / +1.25 ms | p99 under 1 ms |"),
            "{}",
            rows[4]
        );
        assert!(rows[5].contains("| ?/s, ? ms / ? ms (? failed) |"), "{}", rows[5]);
        assert!(rows[11].contains("| +0.25 ms / ?; ? / ? |"), "{}", rows[11]);
        assert!(rows[12].contains("paced to 25 %"), "{}", rows[12]);
        assert!(rows[13].contains("| +0.40 ms / +0.75 ms |"), "{}", rows[13]);
        assert!(rows[15].contains("| 85 % | at least 80 % |"), "{}", rows[15]);
        assert!(rows[16].contains("with 1 000 idle"), "{}", rows[16]);
        assert!(rows[17].contains("| 20.0 MiB (≈ 20.5 KiB a tunnel) |"), "{}", rows[17]);
    }
}
