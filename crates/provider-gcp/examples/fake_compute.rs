//! The fake Compute Engine API of this crate's tests as a process of its own, for a tool or a
//! run that needs a project without Google: `cargo xtask test` points
//! `cargo xtask conformance --provider gcp --real` at it, and it can stand in for a project when
//! trying the provider by hand.
//!
//! ```sh
//! cargo run -p egress-provider-gcp --example fake_compute -- /tmp/fake-gcp [--leftovers]
//! ```
//!
//! It writes a service-account key file that its token endpoint accepts into the directory,
//! prints one JSON line (`api_url`, `key_file`, `project`, `zones`), and serves until its
//! standard input closes; then it prints one more JSON line, every instance it still holds
//! (`name`, `installation`), and exits. With `--leftovers` it starts with two instances: one
//! labelled by an earlier conformance run (`conformance-1`), which a janitor must remove, and
//! one of installation `prod`, which it must leave alone.

#[path = "../tests/support/fake.rs"]
mod fake;

use std::io::Write;
use std::process::ExitCode;

use serde_json::json;

/// An instance of `installation`, made long ago.
fn seed(fake: &fake::FakeCompute, name: &str, installation: &str) {
    fake.with(|w| {
        let mut vm = w.new_vm(name, fake::ZONES[0]);
        vm.status = "RUNNING".into();
        for (k, v) in [
            (egress_provider::LABEL_MANAGED, egress_provider::LABEL_MANAGED_YES),
            (egress_provider::LABEL_UID, "00000000-0000-4000-8000-000000000001"),
            (egress_provider::LABEL_INSTALLATION, installation),
        ] {
            vm.labels.insert(k.to_owned(), v.to_owned());
        }
        w.seed(vm);
    });
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().filter(|a| !a.starts_with("--")) else {
        eprintln!("usage: fake_compute <directory for the key file> [--leftovers]");
        return ExitCode::from(2);
    };
    let fake = fake::FakeCompute::start().await;
    let key_file = std::path::Path::new(dir).join("key.json");
    if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| {
        std::fs::write(
            &key_file,
            fake.service_account_json("fake-key-1", fake::SERVICE_ACCOUNT),
        )
    }) {
        eprintln!("fake_compute: writing {}: {e}", key_file.display());
        return ExitCode::FAILURE;
    }
    if args.iter().any(|a| a == "--leftovers") {
        seed(&fake, "proxy-left-by-a-killed-run", "conformance-1");
        seed(&fake, "proxy-of-another-installation", "prod");
    }
    let ready = json!({
        "api_url": fake.base_url(),
        "key_file": key_file,
        "project": fake::PROJECT,
        "zones": fake::ZONES.join(","),
    });
    println!("{ready}");
    let _ = std::io::stdout().flush();
    // Serve until standard input closes (read on a thread of its own: the server runs on this
    // runtime meanwhile).
    let _ = tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink())).await;
    let held: Vec<_> = fake.with(|w| {
        w.vms()
            .into_iter()
            .map(|vm| json!({"name": vm.name, "installation": vm.labels.get(egress_provider::LABEL_INSTALLATION)}))
            .collect()
    });
    println!("{}", json!(held));
    ExitCode::SUCCESS
}
