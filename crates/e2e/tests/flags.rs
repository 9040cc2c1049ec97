//! Each unusable start names its problem and exits non-zero, before touching any cluster.

mod common;

use common::{operator_binary, run_to_exit};

#[test]
fn version_prints_the_commit_and_exits_zero() {
    let (code, out) = run_to_exit(&operator_binary(), &["--version"]);
    assert_eq!(code, Some(0));
    assert_eq!(out.trim(), egress_manager::COMMIT);
    assert!(!out.contains("msg"), "written before any logger exists: {out}");
}

#[test]
fn help_lists_the_flags_and_exits_zero() {
    let (code, out) = run_to_exit(&operator_binary(), &["-h"]);
    assert_eq!(code, Some(0));
    for flag in [
        "-providers-config",
        "-provider-check-interval",
        "-gc-min-age",
        "-zap-encoder",
        "-gcp-wire-log-full-payloads",
    ] {
        assert!(out.contains(flag), "{flag} missing from\n{out}");
    }
}

#[test]
fn flag_errors_name_the_problem_and_exit_non_zero() {
    let dir = egress_testkit::scratch_dir("operator-flags");
    let empty = dir.join("empty.yaml");
    std::fs::write(&empty, "providers: []\n").unwrap();
    let malformed = dir.join("malformed.yaml");
    std::fs::write(&malformed, "providers:\n  - name: a\n    type: kvm9\n").unwrap();
    // The gcp type is registered: its block is validated, not refused as unknown.
    let gcp = dir.join("gcp.yaml");
    std::fs::write(
        &gcp,
        "providers:\n  - name: gcp-eu\n    type: gcp\n    gcp: {network: default}\n",
    )
    .unwrap();
    let not_yaml = dir.join("not-yaml.yaml");
    std::fs::write(&not_yaml, "providers: [\n").unwrap();
    let config = |p: &std::path::Path| format!("--providers-config={}", p.display());
    let (empty, malformed, not_yaml) = (config(&empty), config(&malformed), config(&not_yaml));
    let gcp = config(&gcp);
    let missing = format!("--providers-config={}", dir.join("absent.yaml").display());
    let missing_ca = format!("--health-check-ca-file={}", dir.join("absent-ca.pem").display());
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let not_a_ca = format!("--health-check-ca-file={}", garbage.display());
    let store_ca_file = dir.join("store-ca.pem");
    std::fs::write(&store_ca_file, egress_testkit::pki().ca_pem).unwrap();
    let store_ca = format!("--lease-store-ca-file={}", store_ca_file.display());
    let missing_store_ca = format!("--lease-store-ca-file={}", dir.join("absent-ca.pem").display());
    let not_a_store_ca = format!("--lease-store-ca-file={}", garbage.display());
    let client_pki = egress_testkit::pki();
    let (client_cert_file, client_key_file) = (dir.join("client.pem"), dir.join("client-key.pem"));
    std::fs::write(&client_cert_file, &client_pki.client_cert_pem).unwrap();
    std::fs::write(&client_key_file, &client_pki.client_key_pem).unwrap();
    let client_cert = format!("--lease-store-client-cert-file={}", client_cert_file.display());
    let client_key = format!("--lease-store-client-key-file={}", client_key_file.display());
    // A key file that is no key, holding a secret-looking line no message may repeat.
    let bad_key_file = dir.join("not-a-key.pem");
    std::fs::write(
        &bad_key_file,
        "-----BEGIN PRIVATE KEY-----\nkey-sentinel-7f3a\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let not_a_client_key = format!("--lease-store-client-key-file={}", bad_key_file.display());
    // A pipe nobody writes to (read, it would stall the start for good), and a file larger than
    // any certificate file.
    let pipe = dir.join("pipe.pem");
    egress_testkit::make_fifo(&pipe);
    let huge = dir.join("huge.pem");
    std::fs::write(&huge, vec![b'#'; 1024 * 1024 + 1]).unwrap();
    let pipe_ca = format!("--health-check-ca-file={}", pipe.display());
    let huge_ca = format!("--health-check-ca-file={}", huge.display());
    let pipe_store_ca = format!("--lease-store-ca-file={}", pipe.display());
    let huge_store_ca = format!("--lease-store-ca-file={}", huge.display());
    let pipe_client_key = format!("--lease-store-client-key-file={}", pipe.display());

    let cases: Vec<(Vec<&str>, i32, Vec<&str>)> = vec![
        (
            vec!["--provider-check-interval=soon", &empty],
            2,
            vec![r#"invalid value "soon" for flag -provider-check-interval: time: invalid duration "soon""#],
        ),
        (
            vec!["-gc-min-age", "10", &empty],
            2,
            vec![r#"invalid value "10" for flag -gc-min-age: time: missing unit in duration "10""#],
        ),
        (
            vec!["--provider-check-interval=5s", &empty],
            1,
            vec![
                "Invalid provider check flags",
                "--provider-check-interval must be 0 (off) or at least 10s, got 5s",
            ],
        ),
        (
            vec!["--provider-check-interval=30s", "--provider-check-timeout=1m", &empty],
            1,
            vec!["--provider-check-timeout must be at most --provider-check-interval (30s), got 60s"],
        ),
        (vec![], 1, vec!["--providers-config is required"]),
        (
            vec![&missing],
            1,
            vec!["Failed to load providers config", "absent.yaml"],
        ),
        (
            vec![&malformed],
            1,
            vec![
                "Failed to load providers config",
                r#"providers[0] \"a\": unknown provider type \"kvm9\""#,
            ],
        ),
        (
            vec![&gcp],
            1,
            vec![
                "Failed to load providers config",
                r#"providers[0] \"gcp-eu\": gcp.project is required"#,
            ],
        ),
        (
            vec!["--gcp-wire-log-full-payloads=maybe", &empty],
            2,
            vec!["for flag -gcp-wire-log-full-payloads"],
        ),
        (
            vec![&not_yaml],
            1,
            vec!["Failed to load providers config", "not-yaml.yaml"],
        ),
        (
            vec!["--no-such-flag"],
            2,
            vec!["flag provided but not defined: -no-such-flag"],
        ),
        (
            vec!["--zap-time-encoding=sundial"],
            2,
            vec![r#"invalid time encoding \"sundial\""#],
        ),
        (
            vec!["--health-workers=0"],
            2,
            vec!["must be a whole number from 1 to 10000"],
        ),
        (
            vec!["--health-check-url=ftp://x/"],
            2,
            vec!["the target URL is not usable: the scheme must be http or https"],
        ),
        (
            vec!["--max-lease-ttl=0"],
            2,
            vec!["for flag -max-lease-ttl: must be more than 0"],
        ),
        (vec!["--lease-cooldown=soon"], 2, vec!["time: invalid duration"]),
        (
            // An unknown auth mode must never fall back to serving without auth.
            vec!["--discovery-auth=off"],
            2,
            vec![r#"invalid value \"off\" for flag -discovery-auth: must be token or none"#],
        ),
        (
            vec!["--discovery-auth="],
            2,
            vec!["for flag -discovery-auth: must be token or none"],
        ),
        (
            vec!["--max-connections=0"],
            2,
            vec!["for flag -max-connections: must be a whole number from 1 to 65536"],
        ),
        (
            vec!["--lease-store=etcd://x"],
            2,
            vec!["must be memory, or a redis://, redis+cluster://, rediss:// or rediss+cluster:// URL"],
        ),
        (
            vec![&empty, &store_ca],
            1,
            vec![
                "Failed to set up the lease store",
                "--lease-store-ca-file is for a lease store reached over TLS",
            ],
        ),
        (
            vec![&empty, "--lease-store=redis://127.0.0.1:6379", &store_ca],
            1,
            vec!["Failed to set up the lease store", "for a Redis reached without TLS"],
        ),
        (
            vec![&empty, "--lease-store=rediss://127.0.0.1:6379", &missing_store_ca],
            1,
            vec![
                "Failed to set up the lease store",
                "absent-ca.pem",
                "--lease-store-ca-file",
            ],
        ),
        (
            vec![&empty, "--lease-store=rediss://127.0.0.1:6379", &not_a_store_ca],
            1,
            vec![
                "Failed to set up the lease store",
                "--lease-store-ca-file: no certificate",
            ],
        ),
        (
            vec![&empty, "--lease-store=rediss://127.0.0.1:6379", &client_cert],
            1,
            vec![
                "Failed to set up the lease store",
                "--lease-store-client-cert-file and --lease-store-client-key-file go together",
            ],
        ),
        (
            vec![&empty, &client_cert, &client_key],
            1,
            vec![
                "Failed to set up the lease store",
                "--lease-store-client-cert-file is for a lease store reached over TLS",
            ],
        ),
        (
            vec![
                &empty,
                "--lease-store=rediss://127.0.0.1:6379",
                &client_cert,
                &not_a_client_key,
            ],
            1,
            vec!["Failed to set up the lease store", "no private key"],
        ),
        (
            vec![
                &empty,
                "--lease-store=redis://127.0.0.1:6379",
                &client_cert,
                &client_key,
            ],
            1,
            vec!["Failed to set up the lease store", "for a Redis reached without TLS"],
        ),
        (
            vec![&empty, "--lease-store=rediss://127.0.0.1:6379/#insecure"],
            1,
            vec![
                "Failed to set up the lease store",
                "a TLS server's certificate is always checked",
            ],
        ),
        (
            vec![&empty, &missing_ca],
            1,
            vec!["Failed to load the health probes' CA roots", "absent-ca.pem"],
        ),
        (
            vec![&empty, &not_a_ca],
            1,
            vec!["Failed to load the health probes' CA roots", "no certificate"],
        ),
        (
            vec![&empty, &pipe_ca],
            1,
            vec![
                "Failed to load the health probes' CA roots",
                "pipe.pem: not a regular file",
            ],
        ),
        (
            vec![&empty, &huge_ca],
            1,
            vec![
                "Failed to load the health probes' CA roots",
                "huge.pem: larger than 1 MiB",
            ],
        ),
        (
            vec![&empty, "--lease-store=rediss://127.0.0.1:6379", &pipe_store_ca],
            1,
            vec![
                "Failed to set up the lease store",
                "--lease-store-ca-file: not a regular file",
            ],
        ),
        (
            vec![&empty, "--lease-store=rediss://127.0.0.1:6379", &huge_store_ca],
            1,
            vec![
                "Failed to set up the lease store",
                "--lease-store-ca-file: larger than 1 MiB",
            ],
        ),
        (
            vec![
                &empty,
                "--lease-store=rediss://127.0.0.1:6379",
                &client_cert,
                &pipe_client_key,
            ],
            1,
            vec![
                "Failed to set up the lease store",
                "--lease-store-client-key-file: not a regular file",
            ],
        ),
    ];
    for (mut args, want_code, wants) in cases {
        args.push("--zap-encoder=json");
        let (code, out) = run_to_exit(&operator_binary(), &args);
        assert_eq!(code, Some(want_code), "{args:?}:\n{out}");
        assert!(
            !out.contains("key-sentinel-7f3a"),
            "{args:?}: a key file's text in\n{out}"
        );
        for want in wants {
            let found = out.contains(want) || out.contains(&want.replace("\\\"", "\""));
            assert!(found, "{args:?}: {want:?} missing from\n{out}");
        }
    }
}

/// A GeoIP file that cannot be used stops the operator as it starts, before it connects to the
/// cluster or stands for election (so before it could lead with exits judged on nothing).
#[test]
fn a_geoip_file_that_cannot_be_used_stops_the_start() {
    let dir = egress_testkit::scratch_dir("operator-geoip");
    let config = dir.join("providers.yaml");
    std::fs::write(&config, "providers: []\n").unwrap();
    let garbage = dir.join("garbage.mmdb");
    std::fs::write(&garbage, "not a database").unwrap();
    let asn = dir.join("asn.mmdb");
    let asns = egress_geoip::testing::asn_database(&[("127.0.0.0/8", 64500, "Loopback Networks")]);
    std::fs::write(&asn, asns).unwrap();
    let country = |p: &std::path::Path| format!("--geoip-country-file={}", p.display());
    for (flag, want) in [
        (country(&dir.join("absent.mmdb")), "absent.mmdb"),
        (country(&garbage), "not a MaxMind DB"),
        (country(&asn), "not a country or city database"),
    ] {
        let providers = format!("--providers-config={}", config.display());
        let (code, out) = run_to_exit(&operator_binary(), &[&providers, &flag, "--zap-encoder=json"]);
        assert_eq!(code, Some(1), "{flag}: {out}");
        assert!(out.contains("Failed to read a GeoIP database"), "{flag}: {out}");
        assert!(out.contains(want), "{flag}: {want:?} missing from {out}");
    }
}

#[test]
fn a_lease_store_password_never_reaches_the_error_line() {
    for url in ["rediss:/:hunter2-pw@cache:6380", "redis:/user:hunter2-pw@cache"] {
        let (code, out) = run_to_exit(&operator_binary(), &[&format!("--lease-store={url}")]);
        assert_eq!(code, Some(2), "{out}");
        assert!(!out.contains("hunter2-pw"), "{out}");
    }
}

/// Nor does the start's error line, when the store refuses a URL of the right form.
#[test]
fn a_lease_store_password_never_reaches_the_start_error() {
    let dir = egress_testkit::scratch_dir("store-password");
    let config = dir.join("providers.yaml");
    std::fs::write(&config, "providers: []\n").unwrap();
    for url in [
        "rediss://:hunter2-pw@cache:6380/#insecure",
        "rediss+cluster://:hunter2-pw@a:1,b:2?wait=99",
    ] {
        let (code, out) = run_to_exit(
            &operator_binary(),
            &[
                &format!("--providers-config={}", config.display()),
                &format!("--lease-store={url}"),
                "--zap-encoder=json",
            ],
        );
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains("Failed to set up the lease store"), "{out}");
        assert!(!out.contains("hunter2-pw"), "{out}");
    }
}
