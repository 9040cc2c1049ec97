//! The conformance suite against a real project: run by `cargo xtask conformance --provider gcp
//! --real`, which checks the settings and credentials first and runs the janitor below before
//! and after the suite. Not run by a plain `cargo test` (`test = false` in Cargo.toml): CI has no
//! project, and runs this same path against the fake Compute server instead.

mod support;

egress_conformance::conformance_suite!(support::real::RealGcp);

/// The janitor: deletes every instance a run of the suite left in the project (this run's, or a
/// killed earlier one's) and waits until they are gone. Ignored unless asked for by name.
#[tokio::test]
#[ignore = "run by cargo xtask conformance --provider gcp --real before and after the suite"]
async fn janitor() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pacing = egress_provider_gcp::suite_run::Pacing::default();
    match support::real::sweep(pacing).await {
        Ok(ids) => println!("janitor: {} instance(s) of conformance runs deleted", ids.len()),
        Err(e) => panic!("janitor: {e}"),
    }
}
