//! The conformance suite against a real project: run by `cargo xtask conformance --provider gcp
//! --real`, which checks the settings and credentials first and runs the janitor below before
//! and after the suite. Not run by a plain `cargo test` (`test = false` in Cargo.toml): CI has no
//! project, and runs this same path against the fake Compute server instead.

mod support;

egress_conformance::conformance_suite!(support::real::RealGcp);

/// The janitor: deletes the instances of the runs `EGRESS_GCP_SWEEP` names (`all`: every run's,
/// what a killed earlier one left included; `run`: this run's) and waits until they are gone.
/// Ignored unless asked for by name.
#[tokio::test]
#[ignore = "run by cargo xtask conformance --provider gcp --real before and after the suite"]
async fn janitor() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pacing = egress_provider_gcp::suite_run::Pacing::default();
    let which = egress_provider_gcp::suite_run::Sweep::from_vars(|name| std::env::var(name).ok())
        .unwrap_or_else(|e| panic!("janitor: {e}"));
    match support::real::sweep(&which, pacing).await {
        Ok(ids) => println!("janitor: {} instance(s) of conformance runs deleted", ids.len()),
        Err(e) => panic!("janitor: {e}"),
    }
}
