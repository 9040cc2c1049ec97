//! The first generation's trust in cached base images (spec/kvm.md §6.2, with the review's
//! refusal): a marker's presence completes its base, its content is read only against a
//! configured `sha256`, and a base under a marker is never deleted or fetched over, since the Go
//! operator's overlays may use it.

use egress_libvirt::testing as support;

use egress_libvirt::engine::Generation;
use egress_libvirt::fake::FakeVolume;
use egress_provider::{ErrorClass, OpCtx, Provider};
use support::{FakeBackend, HOSTS, IMAGE_KEY, POOL, image_bytes, request_in, sha256_hex};

const BASE: &str = "base-test-image.qcow2";
const MARKER: &str = "base-test-image.qcow2.sha256";

fn put(b: &FakeBackend, name: &str, bytes: Vec<u8>) {
    b.hosts[0].put_volume(
        POOL,
        name,
        FakeVolume {
            path: format!("/fake/{POOL}/{name}"),
            capacity: 1 << 20,
            format: "qcow2".into(),
            backing: None,
            bytes,
        },
    );
}

/// A Go-made cache whose marker holds `marker`; a provider whose image has `sha256`.
async fn cache(marker: &[u8], sha256: Option<String>) -> (FakeBackend, impl Provider) {
    let b = FakeBackend::new(Generation::Kvm).await;
    put(&b, BASE, b"the Go operator's image".to_vec());
    put(&b, MARKER, marker.to_vec());
    let mut cfg = b.config(false);
    cfg.images.get_mut(IMAGE_KEY).unwrap().sha256 = sha256.unwrap_or_default();
    let p = b.provider("kvm-home", cfg).unwrap();
    (b, p)
}

#[tokio::test]
async fn without_a_configured_digest_the_markers_presence_is_enough() {
    let (b, p) = cache(b"whatever the Go operator wrote", None).await;
    p.create(&OpCtx::background(), &request_in("a", HOSTS[0]))
        .await
        .unwrap();
    assert_eq!(b.server.requests(), 0);
    assert_eq!(b.hosts[0].volumes(POOL)[BASE].bytes, b"the Go operator's image");
}

#[tokio::test]
async fn a_marker_written_by_sha256sum_matches_its_digest() {
    let digest = sha256_hex(&image_bytes());
    let (b, p) = cache(format!("{digest}  {BASE}\n").as_bytes(), Some(digest)).await;
    p.create(&OpCtx::background(), &request_in("b", HOSTS[0]))
        .await
        .unwrap();
    assert_eq!(b.server.requests(), 0);
}

#[tokio::test]
async fn another_digest_is_refused_and_nothing_is_touched() {
    let (b, p) = cache("d1".repeat(32).as_bytes(), Some(sha256_hex(&image_bytes()))).await;
    let e = p
        .create(&OpCtx::background(), &request_in("c", HOSTS[0]))
        .await
        .unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert_eq!(b.server.requests(), 0);
    let vols = b.hosts[0].volumes(POOL);
    assert_eq!(vols[BASE].bytes, b"the Go operator's image");
    assert!(vols.contains_key(MARKER));
}

/// A marker created but never written (its writer died between the create and the upload):
/// a raw volume reads as zeros. With a digest configured the base is fetched again rather than
/// refused for good; without one, its presence is trusted as the Go operator trusts it.
#[tokio::test]
async fn a_marker_left_empty_by_a_crash_is_recovered_from() {
    let digest = sha256_hex(&image_bytes());
    let (b, p) = cache(&[0; 64], Some(digest.clone())).await;
    p.create(&OpCtx::background(), &request_in("d", HOSTS[0]))
        .await
        .unwrap();
    assert_eq!(b.server.gets(), 1, "fetched again");
    let vols = b.hosts[0].volumes(POOL);
    assert_eq!(vols[BASE].bytes, image_bytes());
    assert_eq!(vols[MARKER].bytes, digest.into_bytes());
    assert!(
        !vols.keys().any(|v| v.contains(".fill-")),
        "no fill lease left: {:?}",
        vols.keys()
    );
}
