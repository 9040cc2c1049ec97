//! The judge of what is internal, as the operator builds it from `--cluster-cidrs` and
//! `--allowed-internal-destinations`, reaches the image downloads of the kvm2 entries the
//! registry's type constructs (`provider_type_judging`), where `provider_type` knows only the
//! fixed lists.
//!
//! Each create runs with its context already cancelled: a request that passes the placement
//! checks, the URL's among them, stops at its first wait ("waiting for the lock"), before any
//! dial or download; one that does not is refused for good first.

use egress_libvirt::Generation;
use egress_libvirt::testing::{FakeBackend, HOSTS, request_in};
use egress_netguard::Guard;
use egress_provider::config::ProviderConfig;
use egress_provider::{ErrorClass, OpCtx, Provider};

/// How a create of a Proxy whose image is `image` ends: its class and message.
async fn create(provider: &dyn Provider, image: &str) -> (ErrorClass, String) {
    let cx = OpCtx::background();
    cx.token().cancel();
    let mut req = request_in("internal-judge", HOSTS[0]);
    req.placement.image = image.to_owned();
    let e = provider.create(&cx, &req).await.expect_err("nothing is made");
    (e.class(), e.to_string())
}

#[tokio::test]
async fn the_cluster_ranges_refuse_an_image_url_and_the_allowed_list_lets_one_through() {
    let b = FakeBackend::new(Generation::Kvm2).await;
    let entry = ProviderConfig::new("kvm2-internal", "kvm2").with_block(&b.config(false));
    let internal = Guard::new(&["198.51.100.0/24".to_owned()], &["10.9.8.7".to_owned()]).unwrap();
    let judged = egress_provider_kvm2::provider_type_judging(internal)
        .construct(&entry)
        .unwrap();
    let fixed_only = egress_provider_kvm2::provider_type().construct(&entry).unwrap();

    let in_cluster = "http://198.51.100.7/x.qcow2";
    let (class, message) = create(judged.as_ref(), in_cluster).await;
    assert_eq!(class, ErrorClass::Permanent, "{message}");
    assert!(message.contains("an address in the cluster's ranges"), "{message}");
    let (class, message) = create(fixed_only.as_ref(), in_cluster).await;
    assert_eq!(class, ErrorClass::Transient, "{message}");
    assert!(message.contains("waiting for the lock"), "{message}");

    let allowed_private = "http://10.9.8.7/x.qcow2";
    let (class, message) = create(judged.as_ref(), allowed_private).await;
    assert_eq!(class, ErrorClass::Transient, "{message}");
    assert!(message.contains("waiting for the lock"), "{message}");
    let (class, message) = create(fixed_only.as_ref(), allowed_private).await;
    assert_eq!(class, ErrorClass::Permanent, "{message}");
    assert!(message.contains("a private address"), "{message}");
    assert!(b.interceptor.call_log().is_empty(), "no libvirt call");
}
