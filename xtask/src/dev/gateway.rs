//! The run's gateway: started beside the operator (its HTTP and SOCKS5 fronts on loopback,
//! leasing from the run's discovery API), the curl lines the guide prints for it, and the smoke
//! check that runs those same lines: over HTTP `CONNECT` naming the pool, and over SOCKS5 in a
//! session, each to the local target.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::layout::{Discovery, Layout};
use super::smoke::TARGET_GREETING;
use crate::procs::Killed;

/// Where the run's gateway listens.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fronts {
    pub(super) http: SocketAddr,
    pub(super) socks: SocketAddr,
}

/// Starts the gateway from `bin` in a process group of its own, leasing from `discovery`, its
/// log in the run's directory; returns once both fronts accept connections.
pub(super) fn start(bin: &Path, layout: &Layout, discovery: &Discovery<'_>) -> Result<(Killed, Fronts)> {
    let fronts = Fronts {
        http: (std::net::Ipv4Addr::LOCALHOST, egress_testkit::try_free_port()?).into(),
        socks: (std::net::Ipv4Addr::LOCALHOST, egress_testkit::try_free_port()?).into(),
    };
    let mut gateway = Killed(
        Command::new(bin.join("egress-gateway"))
            .arg(format!("--listen={}", fronts.http))
            .arg(format!("--socks-listen={}", fronts.socks))
            .arg(format!("--discovery-url={}", discovery.url))
            .arg(format!("--discovery-ca-file={}", discovery.ca.display()))
            .args(["--health-probe-bind-address=0", "--access-log"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(layout.file("gateway.log"))?)
            .process_group(0)
            .spawn()
            .context("starting egress-gateway")?,
    );
    layout.remember_pid(gateway.0.id())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    for front in [fronts.http, fronts.socks] {
        while std::net::TcpStream::connect(front).is_err() {
            if let Some(status) = gateway.0.try_wait()? {
                bail!(
                    "the gateway exited at start ({status}); see {}",
                    layout.file("gateway.log").display()
                );
            }
            if Instant::now() > deadline {
                bail!("the gateway did not listen on {front} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok((gateway, fronts))
}

/// The guide's curl lines through the gateway, as argument lists: over HTTP `CONNECT` with the
/// pool's members, and over SOCKS5 (the name resolved by the proxy) in a session.
pub(super) fn curl_lines(fronts: Fronts, token: &str, ca: &Path, target: SocketAddr) -> [Vec<String>; 2] {
    let url = format!("https://127.0.0.1:{}/", target.port());
    let ca = ca.display().to_string();
    [
        vec![
            "curl".into(),
            "--cacert".into(),
            ca.clone(),
            "-x".into(),
            format!("http://{}", fronts.http),
            "--proxy-user".into(),
            format!("pool=local-pool:{token}"),
            url.clone(),
        ],
        vec![
            "curl".into(),
            "--cacert".into(),
            ca,
            "-x".into(),
            format!("socks5h://session=login-1:{token}@{}", fronts.socks),
            url,
        ],
    ]
}

/// A line as a shell takes it: each argument with anything but plain characters single-quoted.
pub(super) fn shell_line(args: &[String]) -> String {
    let plain = |a: &str| a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:@%+,".contains(c));
    args.iter()
        .map(|a| if plain(a) { a.clone() } else { format!("'{a}'") })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Smoke: each guide line, run as printed (the session's twice), reaches the target through
/// the gateway; the gateway's log (its access lines on) holds neither the token nor `password`.
pub(super) async fn smoke(layout: &Layout, lines: &[Vec<String>], token: &str, password: &str) -> Result<()> {
    for (line, times) in lines.iter().zip([1, 2]) {
        for _ in 0..times {
            let out = tokio::time::timeout(
                Duration::from_secs(30),
                tokio::process::Command::new(&line[0])
                    .args(["-sS", "--max-time", "20"])
                    .args(&line[1..])
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .context("curl through the gateway did not finish")??;
            let body = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || !body.contains(TARGET_GREETING) {
                bail!(
                    "{} answered {body:?}: {}",
                    shell_line(line),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        println!(
            "dev: smoke: through the gateway: {}",
            shell_line(line).replace(token, "$TOKEN")
        );
    }
    let log = std::fs::read_to_string(layout.file("gateway.log"))?;
    if !log.contains("Tunnel") {
        bail!("the gateway's log has no access line");
    }
    if log.contains(token) || log.contains(password) {
        bail!("the gateway's log holds a token or a proxy password");
    }
    println!("dev: smoke: the gateway's log holds its access lines and no secret");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_quoted_where_a_shell_needs_it() {
        let fronts = Fronts {
            http: "127.0.0.1:8080".parse().unwrap(),
            socks: "127.0.0.1:1080".parse().unwrap(),
        };
        let lines = curl_lines(fronts, "tok", Path::new("/d/ca.pem"), "127.0.0.1:9443".parse().unwrap());
        assert_eq!(
            shell_line(&lines[0]),
            "curl --cacert /d/ca.pem -x http://127.0.0.1:8080 --proxy-user 'pool=local-pool:tok' https://127.0.0.1:9443/"
        );
        assert_eq!(
            shell_line(&lines[1]),
            "curl --cacert /d/ca.pem -x 'socks5h://session=login-1:tok@127.0.0.1:1080' https://127.0.0.1:9443/"
        );
    }
}
