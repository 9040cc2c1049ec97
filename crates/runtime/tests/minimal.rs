//! The example program (`examples/minimal.rs`) does what its lines promise: its flag and the
//! `--zap-*` ones parse, a bad command line exits 2, it logs zap-shaped JSON, serves `/metrics`,
//! and stops with exit code 0 at SIGTERM.

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use egress_testkit::examples::{example_binary, run_example};

/// A liveness bound for each step, not a speed check.
const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn a_bad_command_line_exits_2_and_names_the_flag() {
    let out = run_example(
        Command::new(example_binary("minimal")).arg("--metrics-adr=:0"),
        PATIENCE,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("flag provided but not defined: -metrics-adr"),
        "{stderr}"
    );
    assert!(stderr.contains("Run minimal -h to list the flags."), "{stderr}");
}

#[tokio::test]
async fn it_serves_metrics_and_stops_cleanly_at_sigterm() {
    let mut child = Command::new(example_binary("minimal"))
        .args(["--metrics-addr=127.0.0.1:0", "--zap-encoder=json"])
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the example");
    let (tx, lines) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let serving = wait_for(&lines, "Serving metrics");
    let address = serving["address"].as_str().unwrap().to_owned();
    let answer = get(&address, "/metrics").await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.ends_with("# EOF\n"), "{answer}");

    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(killed.unwrap().success());
    wait_for(&lines, "Stopping");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// A plain `GET` of `path`, the whole answer as text.
async fn get(address: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut answer))
        .await
        .expect("the metrics server answers")
        .unwrap();
    answer
}

/// The first JSON log line whose message is `msg`.
fn wait_for(lines: &mpsc::Receiver<String>, msg: &str) -> serde_json::Value {
    loop {
        let line = lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|e| panic!("no {msg:?} line: {e}"));
        let value: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        if value["msg"] == msg {
            return value;
        }
    }
}
