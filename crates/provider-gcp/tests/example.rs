//! The `list_instances` example is what a tool that reuses this crate does: it runs here
//! against the fake Compute server (`--endpoint`), with a service-account key file found as
//! Application Default Credentials find it, and nothing of the operator around it.

mod support;

use std::process::Command;
use std::time::Duration;

use egress_provider::{LABEL_MANAGED, LABEL_UID};
use egress_testkit::examples::{example_binary, run_example, succeeded};
use support::{GcpBackend, PROJECT, ZONE};

/// Longer than the example's own list deadline.
const PATIENCE: Duration = Duration::from_secs(180);

/// Runs the example off the runtime's threads (the fake serves on them meanwhile).
async fn list_instances(configure: impl FnOnce(&mut Command) + Send + 'static) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(example_binary("list_instances"));
        cmd.env_remove("GOOGLE_CLOUD_PROJECT")
            .env_remove("GOOGLE_APPLICATION_CREDENTIALS");
        configure(&mut cmd);
        run_example(&mut cmd, PATIENCE)
    })
    .await
    .expect("the example's thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_instances_example_lists_the_managed_vms_of_a_project_and_no_others() {
    let backend = GcpBackend::new().await;
    backend.fake.with(|w| {
        let mut managed = w.new_vm("proxy-listed", ZONE);
        managed.status = "RUNNING".to_owned();
        managed.nat_ip = Some("203.0.113.7".to_owned());
        managed.labels.insert(LABEL_MANAGED.to_owned(), "true".to_owned());
        managed.labels.insert(LABEL_UID.to_owned(), "uid-listed".to_owned());
        w.seed(managed);
        let other = w.new_vm("not-ours", ZONE);
        w.seed(other);
    });
    let (url, key) = (backend.fake.base_url(), backend.key_path());
    let out = list_instances(move |cmd| {
        cmd.args([PROJECT, "--endpoint", &url])
            .env("GOOGLE_APPLICATION_CREDENTIALS", key);
    })
    .await;
    let lines = succeeded(&out);
    let stdout = lines.join("\n");
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains("proxy-listed"), "{stdout}");
    assert!(lines[0].ends_with(" Running 203.0.113.7 uid=uid-listed"), "{stdout}");
    assert_eq!(lines[1], "1 managed instances", "{stdout}");
    assert!(
        backend.fake.with(|w| w.token_requests()) >= 1,
        "the token came from the key file's endpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_instances_example_takes_the_project_from_the_environment() {
    let backend = GcpBackend::new().await;
    let (url, key) = (backend.fake.base_url(), backend.key_path());
    let out = list_instances(move |cmd| {
        cmd.args(["--endpoint", &url])
            .env("GOOGLE_CLOUD_PROJECT", PROJECT)
            .env("GOOGLE_APPLICATION_CREDENTIALS", key);
    })
    .await;
    assert_eq!(succeeded(&out), ["0 managed instances"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_instances_example_without_a_project_says_so_and_calls_nothing() {
    let backend = GcpBackend::new().await;
    let url = backend.fake.base_url();
    let out = list_instances(move |cmd| {
        cmd.args(["--endpoint", &url]);
    })
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no project"), "{stderr}");
    assert!(backend.fake.with(|w| w.seen()).is_empty(), "no call was made");
}
