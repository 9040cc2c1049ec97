//! Review L26: the seed ISO that carries a user's cloud-init and proxy password is built in
//! memory, never in a file on the operator's node. The test runs itself again as a child whose
//! `TMPDIR` names a directory that does not exist and whose working directory is empty: a
//! builder going through a temporary file fails there, or leaves something behind.

use std::path::Path;
use std::process::Command;

/// Set in the child: build the seed instead of starting a child.
const CHILD: &str = "EGRESS_SEED_IN_MEMORY_CHILD";
const SECRET_LINE: &str = "crawler:$apr1$l26salt$notarealhashbutsecret";

#[test]
fn l26_the_seed_iso_is_built_without_touching_the_disk() {
    if std::env::var_os(CHILD).is_some() {
        return build_and_read_back();
    }
    let scratch = std::env::temp_dir().join(format!("egress-seed-in-memory-{}", std::process::id()));
    let (missing, cwd) = (scratch.join("missing"), scratch.join("cwd"));
    std::fs::create_dir_all(&cwd).unwrap();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "l26_the_seed_iso_is_built_without_touching_the_disk",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("TMPDIR", &missing)
        .current_dir(&cwd)
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The child really built and read the seed (it did not return early).
    assert!(stdout.contains("seed read back from memory"), "{stdout}");
    assert!(!missing.exists(), "TMPDIR was created");
    assert_eq!(
        entries(&cwd),
        Vec::<String>::new(),
        "files left in the working directory"
    );
    let _ = std::fs::remove_dir_all(&scratch);
}

fn build_and_read_back() {
    let user_data = b"#cloud-config\nruncmd: [echo l26]\n";
    let iso = egress_libvirt::seed::seed_iso_with("l26", user_data, b"", Some(SECRET_LINE)).expect("the seed is built");
    assert_eq!(
        egress_libvirt::seed::read_seed_file(&iso, "user-data").as_deref(),
        Some(&user_data[..])
    );
    let htpasswd = egress_libvirt::seed::read_seed_file(&iso, egress_libvirt::seed::HTPASSWD_FILE).unwrap();
    assert!(String::from_utf8_lossy(&htpasswd).contains(SECRET_LINE));
    println!("seed read back from memory");
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}
