//! The kvm2 provider's own rules over the libvirt fake and a local image mirror: the image
//! cache (spec/kvm.md §6), the pool-space precheck, the adoption guard, and the review's
//! findings (§13) that concern kvm2, each named where it is tested.

use egress_libvirt::testing as support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_conformance::{CallKind, Fault, Times};
use egress_libvirt::engine::url_guard::{Addresses, Lookup};
use egress_libvirt::fake::{FakeHost, FakeVolume};
use egress_libvirt::host::{DomainState, Host, PauseReason};
use egress_libvirt::{DomainSpec, Generation, KVM_NAMESPACE, KVM2_NAMESPACE, Mark};
use egress_netguard::Guard;
use egress_provider::{ErrorClass, InstanceState, OpCtx, Provider, ProviderError, ProviderId};
use egress_provider_kvm2::Kvm2Provider;
use egress_testkit::image_server::Serve;
use support::{FakeBackend, HOSTS, IMAGE_KEY, POOL, image_bytes, request_in, sha256_hex};

const ENTRY: &str = "kvm2-home";

fn base() -> String {
    egress_provider_kvm2::names::base(ENTRY, IMAGE_KEY, "qcow2")
}

fn marker() -> String {
    egress_provider_kvm2::names::marker(&base())
}

async fn backend() -> (FakeBackend, Kvm2Provider) {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let p = b.provider(ENTRY, b.config(false)).unwrap();
    (b, p)
}

fn class(r: Result<impl std::fmt::Debug, ProviderError>) -> (ErrorClass, String) {
    let e = r.expect_err("an error");
    (e.class(), e.to_string())
}

fn host(b: &FakeBackend) -> &FakeHost {
    &b.hosts[0]
}

fn volume_names(b: &FakeBackend) -> Vec<String> {
    host(b).volumes(POOL).into_keys().collect()
}

fn calls(b: &FakeBackend, kind: &str) -> usize {
    b.interceptor.call_log().iter().filter(|c| c.kind.0 == kind).count()
}

#[tokio::test]
async fn a_cold_cache_downloads_once_and_a_warm_one_not_at_all() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    // Two proxies on one host at once: the image lock lets one download.
    let (q1, q2) = (request_in("cold-1", HOSTS[0]), request_in("cold-2", HOSTS[0]));
    let (r1, r2) = tokio::join!(p.create(&cx, &q1), p.create(&cx, &q2));
    let id = r1.unwrap();
    r2.unwrap();
    assert_eq!(b.server.gets(), 1, "one download for two creates");
    let vols = host(&b).volumes(POOL);
    assert_eq!(vols[&base()].bytes, image_bytes());
    assert_eq!(vols[&marker()].bytes, sha256_hex(&image_bytes()).into_bytes());
    // The overlay is backed by the base and sized by diskSizeGb.
    let overlay = &vols[&egress_provider_kvm2::names::overlay(&request_in("cold-1", HOSTS[0]).name)];
    assert_eq!(overlay.backing.as_deref(), Some(vols[&base()].path.as_str()));
    assert_eq!(overlay.capacity, 10 << 30);
    // Warm: no request at all, not even the precheck's HEAD.
    let before = b.server.requests();
    p.create(&cx, &request_in("warm", HOSTS[0])).await.unwrap();
    assert_eq!(b.server.requests(), before);
    // Delete leaves the shared cache.
    p.delete(&cx, &id).await.unwrap();
    assert!(volume_names(&b).contains(&base()) && volume_names(&b).contains(&marker()));
}

/// M14 at create: the domain's NIC carries the MAC derived from its name, the one the address
/// read matches interfaces against.
#[tokio::test]
async fn m14_create_puts_the_mac_of_the_name_on_the_nic() {
    let (b, p) = backend().await;
    let req = request_in("mac", HOSTS[0]);
    p.create(&OpCtx::background(), &req).await.unwrap();
    let xml = host(&b).domains()[&req.name].xml.clone();
    let mac = egress_provider_kvm2::names::mac(&req.name);
    assert!(xml.contains(&format!("<mac address=\"{mac}\"")), "{xml}");
}

#[tokio::test]
async fn h4_a_cached_digest_that_differs_from_the_config_is_refused_untouched() {
    let (b, _) = backend().await;
    let cx = OpCtx::background();
    // Another digest on the host than the config names.
    let other = "d1".repeat(32);
    for (name, bytes) in [(base(), b"old image".to_vec()), (marker(), other.clone().into_bytes())] {
        host(&b).put_volume(
            POOL,
            &name,
            FakeVolume {
                path: format!("/fake/{POOL}/{name}"),
                capacity: bytes.len() as u64,
                format: "qcow2".into(),
                backing: None,
                bytes,
            },
        );
    }
    let p = b.provider(ENTRY, b.config(false)).unwrap();
    let (c, text) = class(p.create(&cx, &request_in("h4", HOSTS[0])).await);
    assert_eq!(c, ErrorClass::Permanent);
    assert!(
        text.contains(&other) && text.contains(&sha256_hex(&image_bytes())),
        "{text}"
    );
    assert_eq!(b.server.requests(), 0, "no HTTP request");
    assert_eq!(calls(&b, "StorageVolDelete"), 0, "nothing deleted");
    assert_eq!(host(&b).volumes(POOL)[&base()].bytes, b"old image");
    // Another entry has a base of its own: no clash at all.
    assert_ne!(
        egress_provider_kvm2::names::base("kvm2-lab", IMAGE_KEY, "qcow2"),
        base()
    );
}

#[tokio::test]
async fn h4_an_entry_name_that_cannot_name_a_volume_is_refused() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let e = b.provider("kvm2/home", b.config(false)).unwrap_err().to_string();
    assert!(e.contains("\"kvm2/home\"") && e.contains("letters, digits"), "{e}");
}

#[tokio::test]
async fn an_incomplete_or_unreadable_cache_is_fetched_again() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    // A base without its marker: a download that died.
    host(&b).put_volume(
        POOL,
        &base(),
        FakeVolume {
            path: "/fake/half".into(),
            capacity: 1,
            format: "qcow2".into(),
            backing: None,
            bytes: b"half".to_vec(),
        },
    );
    p.create(&cx, &request_in("half", HOSTS[0])).await.unwrap();
    assert_eq!(b.server.gets(), 1);
    assert_eq!(host(&b).volumes(POOL)[&base()].bytes, image_bytes());
    // A marker that holds no digest: both go, and the image comes again.
    host(&b).put_volume(
        POOL,
        &marker(),
        FakeVolume {
            path: "/fake/m".into(),
            capacity: 64,
            format: "raw".into(),
            backing: None,
            bytes: b"not a digest".to_vec(),
        },
    );
    p.create(&cx, &request_in("garbled", HOSTS[0])).await.unwrap();
    assert_eq!(b.server.gets(), 2);
    assert_eq!(
        host(&b).volumes(POOL)[&marker()].bytes,
        sha256_hex(&image_bytes()).into_bytes()
    );
}

/// No fill lease is left among `vols`.
fn assert_no_lease(vols: &std::collections::BTreeMap<String, FakeVolume>) {
    assert!(
        !vols.keys().any(|v| v.contains(".fill-")),
        "no lease left: {:?}",
        vols.keys()
    );
}

fn unix_now() -> u64 {
    egress_provider_kvm2::fence::unix_seconds(SystemTime::now())
}

/// H4 fenced: a base without its marker whose fill lease belongs to another writer (another
/// entry, replica or operator instance) that may still be filling it is left alone, and the
/// create says it will try again; once that lease is past its deadline and the clock margin,
/// its writer is gone and the leftovers are cleared and the image fetched.
#[tokio::test]
async fn h4_a_base_another_writer_may_be_filling_is_not_touched_until_its_lease_expires() {
    use egress_provider_kvm2::fence::{CLOCK_MARGIN, lease_name};
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    put(&b, &base(), 1, b"half of another writer's download".to_vec());
    let live = lease_name(&base(), unix_now() + 600, "0123456789abcdef");
    put(&b, &live, 1, b"\0".to_vec());
    let (c, text) = class(p.create(&cx, &request_in("fenced", HOSTS[0])).await);
    assert_eq!(c, ErrorClass::Transient, "{text}");
    assert!(
        text.contains("being filled by another writer") && text.contains(&live),
        "{text}"
    );
    assert_eq!(calls(&b, "StorageVolDelete"), 0, "nothing deleted");
    assert_eq!(calls(&b, "StorageVolUpload"), 0, "nothing written");
    assert_eq!(
        host(&b).volumes(POOL)[&base()].bytes,
        b"half of another writer's download"
    );

    // The same lease, past its deadline by more than the clock margin.
    host(&b).remove_volume(POOL, &live);
    let dead = lease_name(&base(), unix_now() - CLOCK_MARGIN.as_secs() - 1, "0123456789abcdef");
    put(&b, &dead, 1, b"\0".to_vec());
    p.create(&cx, &request_in("fenced", HOSTS[0])).await.unwrap();
    let vols = host(&b).volumes(POOL);
    assert_eq!(vols[&base()].bytes, image_bytes());
    assert_eq!(vols[&marker()].bytes, sha256_hex(&image_bytes()).into_bytes());
    assert_no_lease(&vols);
}

/// H4 fenced, two replicas of one entry over one pool (two lock tables): while the first fills
/// the base, the second gives way at once instead of deleting the half-written base, and finds
/// the image cached once the first is done.
#[tokio::test]
async fn h4_a_second_replica_gives_way_to_the_one_filling_the_base() {
    let (b, first) = backend().await;
    let second = b.provider(ENTRY, b.config(false)).unwrap();
    // The first replica's upload of the base is held once it starts.
    let upload = b.interceptor.freeze(CallKind("StorageVolUpload"));
    let filling = tokio::spawn({
        let first = first.clone();
        async move {
            first
                .create(&OpCtx::background(), &request_in("replica-1", HOSTS[0]))
                .await
        }
    });
    upload.entered().await;
    let deletes = calls(&b, "StorageVolDelete");
    let gave_way = tokio::time::timeout(
        Duration::from_secs(60),
        second.create(&OpCtx::background(), &request_in("replica-2", HOSTS[0])),
    )
    .await
    .expect("the second replica does not wait on the first's download");
    let (c, text) = class(gave_way);
    assert_eq!(c, ErrorClass::Transient, "{text}");
    assert!(text.contains("being filled by another writer"), "{text}");
    assert_eq!(calls(&b, "StorageVolDelete"), deletes, "the second deleted nothing");
    upload.release();
    filling.await.unwrap().unwrap();
    let gets = b.server.gets();
    second
        .create(&OpCtx::background(), &request_in("replica-2", HOSTS[0]))
        .await
        .unwrap();
    assert_eq!(b.server.gets(), gets, "the second found the image cached");
    assert_eq!(host(&b).volumes(POOL)[&base()].bytes, image_bytes());
}

/// H4 fenced: a writer that found the base incomplete looks again once it holds the lease, so a
/// base another replica completed in between is used, never cleared as a leftover.
#[tokio::test]
async fn h4_a_base_completed_while_the_lease_was_being_taken_is_used_not_replaced() {
    let (b, late) = backend().await;
    let early = b.provider(ENTRY, b.config(false)).unwrap();
    // The late replica is held at its first look at the leases, after finding no marker.
    let listing = b.interceptor.freeze(CallKind("StoragePoolListAllVolumes"));
    let waiting = tokio::spawn({
        let late = late.clone();
        async move { late.create(&OpCtx::background(), &request_in("late", HOSTS[0])).await }
    });
    listing.entered().await;
    early
        .create(&OpCtx::background(), &request_in("early", HOSTS[0]))
        .await
        .unwrap();
    let before = b.interceptor.call_log().len();
    listing.release();
    waiting.await.unwrap().unwrap();
    // The late one neither removed nor wrote the marker or the base; its own lease it removed.
    let touched = |kind: &str| -> Vec<String> {
        b.interceptor.call_log()[before..]
            .iter()
            .filter(|c| c.kind.0 == kind)
            .map(|c| c.target.clone())
            .collect()
    };
    let cache = [base(), marker()];
    for kind in ["StorageVolDelete", "StorageVolUpload", "StorageVolCreateXML"] {
        let targets = touched(kind);
        assert!(
            !targets.iter().any(|t| cache.iter().any(|v| t.ends_with(v.as_str()))),
            "{kind}: {targets:?}"
        );
    }
    assert!(
        touched("StorageVolDelete").iter().any(|t| t.contains(".fill-")),
        "its lease removed"
    );
    let vols = host(&b).volumes(POOL);
    assert_eq!(vols[&marker()].bytes, sha256_hex(&image_bytes()).into_bytes());
    assert_no_lease(&vols);
}

#[tokio::test]
async fn failed_downloads_are_classified_and_leave_no_base() {
    for (serve, want, words) in [
        (Serve::Status(404), ErrorClass::Permanent, "HTTP 404"),
        (Serve::Status(503), ErrorClass::Transient, "HTTP 503"),
        (Serve::Status(429), ErrorClass::Transient, "HTTP 429"),
        (Serve::NoLength, ErrorClass::Permanent, "no Content-Length"),
        // H2: the body ends early; the upload ends cleanly and the short read is reported.
        (
            Serve::Truncate(100_000),
            ErrorClass::Transient,
            "the response ended after",
        ),
    ] {
        let (b, p) = backend().await;
        // The precheck must pass for the download to be reached.
        if matches!(serve, Serve::NoLength | Serve::Truncate(_)) {
            b.server.serve(Serve::HeadLength(image_bytes().len() as u64));
            b.server.serve(serve.clone());
        } else {
            b.server.serve(serve.clone());
        }
        let (c, text) = class(p.create(&OpCtx::background(), &request_in("dl", HOSTS[0])).await);
        assert_eq!(c, want, "{serve:?}: {text}");
        assert!(text.contains(words), "{serve:?}: {text}");
        assert!(
            !volume_names(&b).iter().any(|v| v.starts_with("base-")),
            "{serve:?} left {:?}",
            volume_names(&b)
        );
    }
}

#[tokio::test]
async fn a_digest_mismatch_is_permanent_and_discards_the_download() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let mut cfg = b.config(false);
    cfg.images.get_mut(IMAGE_KEY).unwrap().sha256 = "ab".repeat(32);
    let p = b.provider(ENTRY, cfg).unwrap();
    let (c, text) = class(p.create(&OpCtx::background(), &request_in("sha", HOSTS[0])).await);
    assert_eq!(c, ErrorClass::Permanent);
    assert!(text.contains("does not match the configured"), "{text}");
    assert!(volume_names(&b).is_empty(), "{:?}", volume_names(&b));
}

#[tokio::test]
async fn m9_a_head_without_a_usable_length_falls_back_to_get() {
    for serve in [Serve::HeadZero, Serve::HeadRefused] {
        let (b, p) = backend().await;
        b.server.serve(serve.clone());
        p.create(&OpCtx::background(), &request_in("m9", HOSTS[0]))
            .await
            .unwrap_or_else(|e| panic!("{serve:?}: {e}"));
    }
}

#[tokio::test]
async fn the_pool_space_precheck_is_a_quota_and_creates_nothing() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    // Room for the image and the seed, not for a 10 GiB overlay.
    let small = FakeHost::sharing(HOSTS[0], POOL, 1 << 30, b.interceptor.clone());
    let p = egress_provider_kvm2::new(
        ENTRY,
        b.config(false),
        vec![Box::new(small.clone()), Box::new(b.hosts[1].clone())],
    )
    .unwrap();
    let (c, text) = class(p.create(&OpCtx::background(), &request_in("q", HOSTS[0])).await);
    assert_eq!(c, ErrorClass::QuotaExceeded, "{text}");
    assert!(text.contains("bytes available"), "{text}");
    assert!(small.volumes(POOL).is_empty() && small.domains().is_empty());
    // M4: the pool is refreshed before its free space is read.
    let log: Vec<_> = b.interceptor.call_log().into_iter().map(|c| c.kind.0).collect();
    let refresh = log.iter().position(|k| *k == "StoragePoolRefresh").unwrap();
    let info = log.iter().position(|k| *k == "StoragePoolGetInfo").unwrap();
    assert!(refresh < info, "{log:?}");
}

#[tokio::test]
async fn m11_the_downloads_own_length_is_checked_against_the_pool() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let mut cfg = b.config(false);
    cfg.disk_size_gb = 1;
    // HEAD says small (the precheck passes); GET's real length does not fit.
    // What the overlay, the seed and 100 kB need, once a twentieth of the pool is kept free.
    let room = (1u64 << 30) + (16 << 20) + 100_000;
    let tight = FakeHost::sharing(HOSTS[0], POOL, room * 20 / 19 + 1, b.interceptor.clone());
    let p = egress_provider_kvm2::new(ENTRY, cfg, vec![Box::new(tight.clone()), Box::new(b.hosts[1].clone())]).unwrap();
    b.server.serve(Serve::HeadLength(1000));
    let (c, text) = class(p.create(&OpCtx::background(), &request_in("m11", HOSTS[0])).await);
    assert_eq!(c, ErrorClass::QuotaExceeded, "{text}");
    assert!(text.contains("needed for image"), "{text}");
    assert!(tight.volumes(POOL).is_empty(), "{:?}", tight.volumes(POOL));
}

#[tokio::test]
async fn m3_a_failed_define_removes_the_volumes_it_made() {
    let (b, p) = backend().await;
    b.interceptor
        .fail(CallKind("DomainDefineXML"), Fault::BadRequest, Times::Once);
    let req = request_in("m3", HOSTS[0]);
    let (c, _) = class(p.create(&OpCtx::background(), &req).await);
    assert_eq!(c, ErrorClass::Permanent);
    let left = volume_names(&b);
    assert!(
        !left.iter().any(|v| v.starts_with(&req.name)),
        "the overlay or seed was left: {left:?}"
    );
    // The cache stays.
    assert!(left.contains(&base()));
}

/// Review L21: the caller giving up mid-upload does not stop the cleanup, which runs on a
/// context of its own (the fake, like libvirt's adapter, refuses calls on a done one).
#[tokio::test]
async fn l21_a_create_cancelled_mid_upload_still_removes_its_base() {
    let (b, p) = backend().await;
    let upload = b.interceptor.freeze(CallKind("StorageVolUpload"));
    let token = egress_provider::CancellationToken::new();
    let create = tokio::spawn({
        let (p, cx) = (p.clone(), OpCtx::with_cancel(token.clone()));
        async move { p.create(&cx, &request_in("l21", HOSTS[0])).await }
    });
    upload.entered().await;
    token.cancel();
    let (c, text) = class(create.await.unwrap());
    assert_eq!(c, ErrorClass::Transient, "{text}");
    assert_eq!(volume_names(&b), Vec::<String>::new(), "the base or its lease was left");
}

/// Review L21 with M3: the volumes a failed define leaves are removed though the caller gave
/// up while the removal ran.
#[tokio::test]
async fn l21_m3_the_cleanup_of_a_failed_define_outlives_the_callers_cancel() {
    let (b, p) = backend().await;
    let req = request_in("l21-m3", HOSTS[0]);
    b.interceptor
        .fail(CallKind("DomainDefineXML"), Fault::BadRequest, Times::Once);
    let define = b.interceptor.freeze(CallKind("DomainDefineXML"));
    let token = egress_provider::CancellationToken::new();
    let create = tokio::spawn({
        let (p, cx, req) = (p.clone(), OpCtx::with_cancel(token.clone()), req.clone());
        async move { p.create(&cx, &req).await }
    });
    define.entered().await;
    // The next delete is the cleanup's first.
    let delete = b.interceptor.freeze(CallKind("StorageVolDelete"));
    define.release();
    delete.entered().await;
    token.cancel();
    delete.release();
    let (c, text) = class(create.await.unwrap());
    assert_eq!(c, ErrorClass::Permanent, "{text}");
    let left = volume_names(&b);
    assert!(
        !left.iter().any(|v| v.starts_with(&req.name)),
        "the overlay or seed was left: {left:?}"
    );
}

fn domain_xml(name: &str) -> String {
    DomainSpec {
        name: name.into(),
        memory_mib: 128,
        vcpus: 1,
        mark: Mark::default(),
        firmware: "uefi".into(),
        domain_type: "qemu".into(),
        cpu_mode: None,
        disk_path: "/d".into(),
        disk_format: "qcow2".into(),
        seed_path: "/s".into(),
        bridge: "br0".into(),
        mac: None,
    }
    .to_xml(Generation::Kvm2)
    .unwrap()
}

#[tokio::test]
async fn m2_a_domain_of_another_provider_is_neither_read_nor_deleted() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    let name = "docker-29";
    host(&b).define_directly(&domain_xml(name));
    // Marked by the first-generation provider only.
    host(&b).set_metadata(name, KVM2_NAMESPACE, None);
    host(&b).set_metadata(
        name,
        KVM_NAMESPACE,
        Some(Mark::new("u-1", SystemTime::now()).to_xml(KVM_NAMESPACE).unwrap()),
    );
    for v in [format!("{name}.qcow2"), format!("{name}-seed.iso")] {
        host(&b).put_volume(
            POOL,
            &v,
            FakeVolume {
                path: format!("/fake/{v}"),
                capacity: 1,
                format: "raw".into(),
                backing: None,
                bytes: Vec::new(),
            },
        );
    }
    let id = ProviderId::new(format!("hosts/{}/domains/{name}", HOSTS[0]));
    let (c, text) = class(p.get(&cx, &id).await);
    assert_eq!(c, ErrorClass::Permanent);
    assert!(text.contains("not managed by this provider"), "{text}");
    p.delete(&cx, &id).await.unwrap();
    assert!(host(&b).domains().contains_key(name), "the domain was deleted");
    assert_eq!(volume_names(&b).len(), 2, "its volumes were deleted");
}

#[tokio::test]
async fn a_paused_domain_is_not_started_and_m1_not_stopped() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    let req = request_in("paused", HOSTS[0]);
    let id = p.create(&cx, &req).await.unwrap();
    // M1: get does not report Stopped (which would make the reconciler destroy it) for a
    // pause that can end: QEMU's on a full disk, an administrator's, an unknown one.
    for reason in [PauseReason::IO_ERROR, PauseReason::USER, PauseReason::UNKNOWN] {
        host(&b).set_state(&req.name, DomainState::Paused(reason));
        assert_eq!(
            p.get(&cx, &id).await.unwrap().state,
            InstanceState::Provisioning,
            "{reason:?}"
        );
    }
    // A repeated create does not start it: an administrator's doing.
    let starts = calls(&b, "DomainCreate");
    let (c, text) = class(p.create(&cx, &req).await);
    assert_eq!(c, ErrorClass::Permanent);
    assert!(text.contains("DomainPaused"), "{text}");
    assert_eq!(calls(&b, "DomainCreate"), starts);
}

#[tokio::test]
async fn m1_a_domain_paused_for_good_reads_stopped_so_it_is_rebuilt() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    let req = request_in("m1-gone", HOSTS[0]);
    let id = p.create(&cx, &req).await.unwrap();
    for reason in [
        PauseReason::CRASHED,
        PauseReason::SHUTTING_DOWN,
        PauseReason::POSTCOPY_FAILED,
    ] {
        host(&b).set_state(&req.name, DomainState::Paused(reason));
        assert_eq!(
            p.get(&cx, &id).await.unwrap().state,
            InstanceState::Stopped,
            "{reason:?}"
        );
    }
    // And the delete that follows removes it, paused as it is.
    p.delete(&cx, &id).await.unwrap();
    assert!(!host(&b).domains().contains_key(&req.name));
}

#[tokio::test]
async fn l9_a_creation_time_in_the_future_reads_as_now() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    let req = request_in("l9", HOSTS[0]);
    let id = p.create(&cx, &req).await.unwrap();
    let tomorrow = SystemTime::now() + Duration::from_secs(86_400);
    host(&b).set_metadata(
        &req.name,
        KVM2_NAMESPACE,
        Some(Mark::new(req.uid.clone(), tomorrow).to_xml(KVM2_NAMESPACE).unwrap()),
    );
    let got = p.get(&cx, &id).await.unwrap().created_at.unwrap();
    assert!(got <= SystemTime::now(), "{got:?}");
    let listed = p.list_by_tag(&cx).await.unwrap();
    assert!(listed.iter().all(|i| i.created_at.unwrap() <= SystemTime::now()));
}

#[tokio::test]
async fn the_installation_mark_is_written_and_read_back() {
    let (_b, p) = backend().await;
    let cx = OpCtx::background();
    let mut req = request_in("inst", HOSTS[0]);
    req.installation = Some("prod-eu".into());
    let id = p.create(&cx, &req).await.unwrap();
    assert_eq!(p.get(&cx, &id).await.unwrap().installation.as_deref(), Some("prod-eu"));
    let listed = p.list_by_tag(&cx).await.unwrap();
    assert_eq!(listed[0].installation.as_deref(), Some("prod-eu"));
}

#[tokio::test]
async fn m12_a_link_local_image_url_is_refused_before_any_request() {
    let (b, p) = backend().await;
    let mut req = request_in("m12", HOSTS[0]);
    req.placement.image = "http://169.254.169.254/latest/x.qcow2".into();
    let (c, _) = class(p.create(&OpCtx::background(), &req).await);
    assert_eq!(c, ErrorClass::Permanent);
    assert!(b.interceptor.call_log().is_empty());
}

#[tokio::test]
async fn m12_with_url_images_off_a_url_placement_fails_before_any_request() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let mut cfg = b.config(false);
    cfg.image_url_hosts = Some(Vec::new());
    let p = b.provider(ENTRY, cfg).unwrap();
    let mut req = request_in("m12-off", HOSTS[0]);
    req.placement.image = b.server.url();
    let (c, message) = class(p.create(&OpCtx::background(), &req).await);
    assert_eq!(c, ErrorClass::Permanent);
    assert!(message.contains("URL images are off for this entry"), "{message}");
    assert_eq!(b.server.requests(), 0, "no HTTP request");
    assert!(b.interceptor.call_log().is_empty(), "no libvirt call");
    // Catalogue images are the operator's own: still served.
    p.create(&OpCtx::background(), &request_in("m12-catalogue", HOSTS[0]))
        .await
        .unwrap();
}

#[tokio::test]
async fn m12_url_images_come_only_from_listed_hosts_and_redirects_stay_on_them() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let cx = OpCtx::background();
    // The same mirror under two names: 127.0.0.1 is listed, localhost is not.
    let elsewhere = b.server.url().replace("127.0.0.1", "localhost");
    let mut cfg = b.config(false);
    cfg.image_url_hosts = Some(vec!["127.0.0.1".into()]);
    let p = b.provider(ENTRY, cfg.clone()).unwrap();

    let mut unlisted = request_in("m12-unlisted", HOSTS[0]);
    unlisted.placement.image = elsewhere.clone();
    let (c, message) = class(p.create(&cx, &unlisted).await);
    assert_eq!(c, ErrorClass::Permanent);
    assert!(message.contains("host localhost is not in imageUrlHosts"), "{message}");
    assert_eq!(b.server.requests(), 0, "no HTTP request");

    // A listed mirror that redirects to an unlisted host: refused, nothing fetched or made.
    let redirector = egress_testkit::image_server::ImageServer::start(image_bytes(), "127.0.0.1:0").await;
    redirector.serve(Serve::Redirect(elsewhere));
    let mut redirected = request_in("m12-redirect", HOSTS[0]);
    redirected.placement.image = redirector.url();
    let (c, message) = class(p.create(&cx, &redirected).await);
    assert_eq!(c, ErrorClass::Permanent, "{message}");
    assert!(
        message.contains("redirect refused: host localhost is not in imageUrlHosts"),
        "{message}"
    );
    assert_eq!(b.server.requests(), 0, "the redirect was not followed");
    assert!(redirector.requests() > 0);
    assert!(!host(&b).domains().contains_key(&redirected.name));

    // Listing the redirect's target too lets it through.
    cfg.image_url_hosts = Some(vec!["127.0.0.1".into(), "LOCALHOST".into()]);
    let p = b.provider(ENTRY, cfg).unwrap();
    p.create(&cx, &redirected).await.unwrap();
    assert!(b.server.gets() > 0);
}

/// Names resolved where a test says: each name to its address, anything else not found.
#[derive(Debug)]
struct Names(Vec<(&'static str, std::net::IpAddr)>);

impl Lookup for Names {
    fn lookup(&self, name: &str) -> Addresses {
        let found: Vec<_> = self.0.iter().filter(|(n, _)| *n == name).map(|(_, ip)| *ip).collect();
        Box::pin(async move {
            if found.is_empty() {
                return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "no such name"));
            }
            Ok(found)
        })
    }
}

#[tokio::test]
async fn m12_every_spelling_of_an_internal_address_is_refused_before_any_request() {
    let (b, p) = backend().await;
    for (n, url) in [
        "http://2852039166/x.qcow2",
        "http://0xa9fea9fe/x.qcow2",
        "http://169.254.169.254./x.qcow2",
        "http://[::ffff:169.254.169.254]/x.qcow2",
        "http://[64:ff9b::a9fe:a9fe]/x.qcow2",
        "http://metadata.google.internal/x.qcow2",
        "http://10.0.0.5/x.qcow2",
        "http://192.168.1.1:8080/x.qcow2",
        "http://mirror.egress.svc/x.qcow2",
        "http://mirror.egress.svc.cluster.local/x.qcow2",
        "http://169.254.169.254\\@mirror.example/x.qcow2",
    ]
    .into_iter()
    .enumerate()
    {
        let mut req = request_in(&format!("m12-form-{n}"), HOSTS[0]);
        req.placement.image = url.into();
        let (c, message) = class(p.create(&OpCtx::background(), &req).await);
        assert_eq!(c, ErrorClass::Permanent, "{url}: {message}");
        assert!(message.contains("list it in imageUrlHosts"), "{url}: {message}");
    }
    assert!(b.interceptor.call_log().is_empty(), "no libvirt call");
}

#[tokio::test]
async fn m12_a_name_that_resolves_inside_is_refused_as_it_connects_redirect_or_not() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let cx = OpCtx::background();
    // The tests' mirror (127.0.0.1) is let through; 127.0.0.2 is loopback like any other.
    let inside = egress_testkit::image_server::ImageServer::start(image_bytes(), "127.0.0.2:0").await;
    let names = Names(vec![
        ("mirror.example", "127.0.0.1".parse().unwrap()),
        ("inside.example", "127.0.0.2".parse().unwrap()),
    ]);
    let guard = Guard::new(&[], &["127.0.0.1".to_owned()]).unwrap();
    let p = b
        .provider_resolving(ENTRY, b.config(false), guard, Arc::new(names))
        .unwrap();
    let port = |url: &str| reqwest_port(url);
    let inside_url = format!("http://inside.example:{}/x.img", port(&inside.url()));

    let mut direct = request_in("m12-inside", HOSTS[0]);
    direct.placement.image = inside_url.clone();
    let (c, message) = class(p.create(&cx, &direct).await);
    assert_eq!(c, ErrorClass::Permanent, "{message}");
    assert!(
        message.contains("host inside.example resolves to 127.0.0.2, a loopback or unspecified address"),
        "{message}"
    );

    let redirector = egress_testkit::image_server::ImageServer::start(image_bytes(), "127.0.0.1:0").await;
    redirector.serve(Serve::Redirect(inside_url));
    let mut redirected = request_in("m12-inside-redirect", HOSTS[0]);
    redirected.placement.image = format!("http://mirror.example:{}/x.img", port(&redirector.url()));
    let (c, message) = class(p.create(&cx, &redirected).await);
    assert_eq!(c, ErrorClass::Permanent, "{message}");
    assert!(message.contains("resolves to 127.0.0.2"), "{message}");
    assert!(redirector.requests() > 0, "the mirror itself was asked");
    assert_eq!(inside.requests(), 0, "nothing reached the inside address");
    assert!(!host(&b).domains().contains_key(&redirected.name));

    // The same mirror by the name that resolves to an allowed address serves the image.
    let mut fine = request_in("m12-named", HOSTS[0]);
    fine.placement.image = format!("http://mirror.example:{}/x.img", port(&b.server.url()));
    p.create(&cx, &fine).await.unwrap();
}

/// The port of an `http://127.0.0.1:PORT/...` URL.
fn reqwest_port(url: &str) -> u16 {
    let after = url.rsplit_once(':').map(|(_, rest)| rest).unwrap_or_default();
    after.split('/').next().unwrap_or_default().parse().expect("a port")
}

#[tokio::test]
async fn m15_a_connection_lost_while_listing_fails_the_list() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    p.create(&cx, &request_in("m15", HOSTS[0])).await.unwrap();
    b.interceptor
        .fail(CallKind("DomainGetMetadata"), Fault::ConnectionReset, Times::Once);
    let (c, _) = class(p.list_by_tag(&cx).await);
    assert_eq!(c, ErrorClass::Transient);
}

#[tokio::test]
async fn l18_l19_the_check_covers_every_host_and_bounds_what_it_reports() {
    let (b, p) = backend().await;
    // 300 two-byte characters: 600 bytes, over a DNS name's 253, with no boundary at 253.
    let long = "é".repeat(300);
    host(&b).set_hostname(&long);
    let checker = p.clone();
    let statuses = egress_provider::Checker::check(&checker, &OpCtx::background()).await;
    let names: Vec<_> = statuses.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, HOSTS);
    assert!(statuses.iter().all(|s| s.ready));
    let reported = &statuses[0].details["hostname"];
    assert_eq!(
        reported.len(),
        252,
        "cut at the last character boundary under 253 bytes"
    );
    assert!(long.starts_with(reported.as_str()));
    assert_eq!(statuses[1].details["hostname"], HOSTS[1]);
}

/// A host that stops taking the upload of a cold image holds up creates on that host only:
/// another host's create of the same image goes through meanwhile (the image lock is per host
/// and base, each download its own). The stuck create ends when its host answers again.
#[tokio::test]
async fn a_host_stuck_mid_upload_holds_up_no_other_host() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    // Hosts of their own, each with its own interceptor, so only the first is held.
    let stuck = FakeHost::new(HOSTS[0], POOL, 1 << 40);
    let other = FakeHost::new(HOSTS[1], POOL, 1 << 40);
    let hosts = vec![Box::new(stuck.clone()) as Box<dyn Host>, Box::new(other.clone())];
    let cfg = support::config(&HOSTS, &b.server.url(), Some(sha256_hex(&image_bytes())), &b.files);
    let p = egress_provider_kvm2::new(ENTRY, cfg, hosts).unwrap();
    let held = stuck.interceptor().freeze(CallKind("StorageVolUpload"));
    let creating = tokio::spawn({
        let p = p.clone();
        async move { p.create(&OpCtx::background(), &request_in("stuck", HOSTS[0])).await }
    });
    held.entered().await;
    // A liveness bound only: held up behind the stuck host, the create would end Transient
    // at it, waiting for the image.
    let bounded = OpCtx::background().with_timeout(Duration::from_secs(60));
    p.create(&bounded, &request_in("free", HOSTS[1]))
        .await
        .expect("a create on another host goes on");
    assert!(other.volumes(POOL).contains_key(&marker()));
    assert!(!creating.is_finished(), "the stuck create is still held");
    held.release();
    creating
        .await
        .unwrap()
        .expect("the stuck create, once its host answers");
    assert_eq!(b.server.gets(), 2, "one download per host");
}

#[tokio::test]
async fn l19_at_most_eight_hosts_are_checked_at_once() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let names: Vec<String> = (0..20).map(|i| format!("hv-{i:02}")).collect();
    let listed: Vec<&str> = names.iter().map(String::as_str).collect();
    let cfg = support::config(&listed, &b.server.url(), None, &b.files);
    let hosts = names
        .iter()
        .map(|n| Box::new(FakeHost::sharing(n, POOL, 1 << 40, b.interceptor.clone())) as Box<dyn Host>)
        .collect();
    let p = egress_provider_kvm2::new("kvm2-wide", cfg, hosts).unwrap();
    // Each host's check starts with a dial; each dial is held at the next gate.
    let gates: Vec<_> = (0..names.len())
        .map(|_| b.interceptor.freeze(CallKind("Dial")))
        .collect();
    let check = tokio::spawn(async move { egress_provider::Checker::check(&p, &OpCtx::background()).await });
    for gate in &gates[..8] {
        gate.entered().await;
    }
    // Without a cap every host's dial would have been reached in the poll that reached these.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(gates.iter().filter(|g| g.was_entered()).count(), 8);
    for gate in &gates {
        gate.release();
    }
    let statuses = check.await.unwrap();
    let checked: Vec<&str> = statuses.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(checked, listed, "every host, in the config's order");
}

#[tokio::test]
async fn m10_a_refresh_refused_by_another_upload_does_not_lose_the_download() {
    let (b, p) = backend().await;
    // The first upload is the base's; the refusal is armed while it runs, so the precheck's
    // refreshes before it cannot use it up.
    let gate = b.interceptor.freeze(CallKind("StorageVolUpload"));
    let create = tokio::spawn({
        let p = p.clone();
        async move { p.create(&OpCtx::background(), &request_in("m10", HOSTS[0])).await }
    });
    gate.entered().await;
    // The refresh after the upload is refused, as libvirt does while another upload into the
    // pool runs (another create's seed, say); it is asked again.
    b.interceptor.fail(
        CallKind("StoragePoolRefresh"),
        Fault::Raw("internal error: pool 'default' has asynchronous jobs running.".into()),
        Times::Once,
    );
    gate.release();
    create.await.unwrap().unwrap();
    assert_eq!(b.server.gets(), 1);
    assert!(volume_names(&b).contains(&marker()));
}

#[tokio::test]
async fn l5_a_domain_with_checkpoints_and_snapshots_is_deleted() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    let req = request_in("l5", HOSTS[0]);
    let id = p.create(&cx, &req).await.unwrap();
    assert!(host(&b).add_checkpoint(&req.name) && host(&b).add_snapshot(&req.name));
    p.delete(&cx, &id).await.unwrap();
    assert!(!host(&b).domains().contains_key(&req.name));
}

#[tokio::test]
async fn m10_a_finished_upload_survives_a_killed_pooled_link() {
    let (b, p) = backend().await;
    // The first upload is the base's, on the fill's dedicated connection.
    let upload = b.interceptor.freeze(CallKind("StorageVolUpload"));
    let create = tokio::spawn({
        let p = p.clone();
        async move { p.create(&OpCtx::background(), &request_in("m10k", HOSTS[0])).await }
    });
    upload.entered().await;
    // Another caller's cancelled call kills the pooled link while the upload runs.
    host(&b).set_pooled_link_down(true);
    let removal = b.interceptor.freeze(CallKind("StorageVolDelete"));
    upload.release();
    // The first removal after the upload is the fill's lease, on the pooled link: by then the
    // refresh and the marker must be done. The link is redialled for it, as a real one would
    // be on its next call.
    removal.entered().await;
    host(&b).set_pooled_link_down(false);
    removal.release();
    create.await.unwrap().expect("the verified download was kept");
    assert_eq!(b.server.gets(), 1);
    assert_eq!(
        host(&b).volumes(POOL)[&marker()].bytes,
        sha256_hex(&image_bytes()).into_bytes()
    );
}

fn put(b: &FakeBackend, name: &str, capacity: u64, bytes: Vec<u8>) {
    host(b).put_volume(
        POOL,
        name,
        FakeVolume {
            path: format!("/fake/{POOL}/{name}"),
            capacity,
            format: "qcow2".into(),
            backing: None,
            bytes,
        },
    );
}

#[tokio::test]
async fn m5_an_image_larger_than_the_overlay_is_refused_and_a_short_overlay_made_again() {
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    // A cached base whose virtual size is 3 GiB.
    put(&b, &base(), 3 << 30, image_bytes());
    put(&b, &marker(), 64, sha256_hex(&image_bytes()).into_bytes());
    let mut cfg = b.config(false);
    cfg.disk_size_gb = 2;
    let p = b.provider(ENTRY, cfg).unwrap();
    let req = request_in("m5", HOSTS[0]);
    let (c, text) = class(p.create(&OpCtx::background(), &req).await);
    assert_eq!(c, ErrorClass::Permanent);
    assert!(text.contains("diskSizeGb"), "{text}");
    assert!(host(&b).domains().is_empty());
    // With room, a leftover overlay smaller than the image is made again at the configured size.
    let p = b.provider(ENTRY, b.config(false)).unwrap();
    put(
        &b,
        &egress_provider_kvm2::names::overlay(&req.name),
        1 << 20,
        Vec::new(),
    );
    p.create(&OpCtx::background(), &req).await.unwrap();
    let overlay = &host(&b).volumes(POOL)[&egress_provider_kvm2::names::overlay(&req.name)];
    assert_eq!(overlay.capacity, 10 << 30);
}

#[tokio::test]
async fn l4_a_stopped_domain_whose_volumes_are_gone_is_defined_again() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    let req = request_in("l4", HOSTS[0]);
    p.create(&cx, &req).await.unwrap();
    host(&b).set_state(&req.name, DomainState::Shutoff);
    let overlay = egress_provider_kvm2::names::overlay(&req.name);
    egress_libvirt::host::Host::delete_volume(host(&b), &cx, POOL, &overlay)
        .await
        .unwrap();
    p.create(&cx, &req).await.unwrap();
    assert!(volume_names(&b).contains(&overlay), "the overlay was not made again");
    assert_eq!(host(&b).domains()[&req.name].state, DomainState::Running);
}

#[tokio::test]
async fn m11_an_image_over_the_size_limit_is_refused_before_any_volume() {
    let (b, p) = backend().await;
    b.server.serve(Serve::Claim(100 << 30));
    let (c, text) = class(p.create(&OpCtx::background(), &request_in("cap", HOSTS[0])).await);
    assert_eq!(c, ErrorClass::Permanent, "{text}");
    assert!(text.contains("limit"), "{text}");
    assert!(volume_names(&b).is_empty());
}

#[tokio::test]
async fn m17_a_plain_http_image_without_a_digest_is_warned_about_at_construction() {
    let (capture, _guard) = egress_conformance::capture::Capture::start();
    let b = FakeBackend::new(egress_libvirt::Generation::Kvm2).await;
    let mut cfg = b.config(false);
    cfg.images.get_mut(IMAGE_KEY).unwrap().sha256.clear();
    let _p = b.provider(ENTRY, cfg).unwrap();
    let warned: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.level == tracing::Level::WARN && e.text().contains("plain http without a sha256"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
}

#[tokio::test]
async fn l7_a_url_images_format_is_read_from_its_first_bytes() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    let mut qcow2 = b"QFI\xfb".to_vec();
    qcow2.extend_from_slice(&image_bytes());
    let qcow2_mirror = egress_testkit::image_server::ImageServer::start(qcow2, "127.0.0.1:0").await;
    for (url, want) in [(b.server.url(), "raw"), (qcow2_mirror.url(), "qcow2")] {
        let mut req = request_in(&format!("l7-{want}"), HOSTS[0]);
        req.placement.image = url.clone();
        p.create(&cx, &req).await.unwrap();
        let base = egress_provider_kvm2::names::base(ENTRY, &egress_provider_kvm2::names::url_key(&url), want);
        let vols = host(&b).volumes(POOL);
        assert!(vols.contains_key(&base), "{want}: {:?}", vols.keys());
        assert_eq!(vols[&base].format, want);
        // The cache answers the next time: no request for the format.
        let before = match want {
            "raw" => b.server.requests(),
            _ => qcow2_mirror.requests(),
        };
        let mut again = request_in(&format!("l7-{want}-again"), HOSTS[0]);
        again.placement.image = url;
        p.create(&cx, &again).await.unwrap();
        let after = match want {
            "raw" => b.server.requests(),
            _ => qcow2_mirror.requests(),
        };
        assert_eq!(before, after, "{want}");
    }
}

#[tokio::test]
async fn h2_a_failed_base_is_removed_after_its_upload_connection_is_closed() {
    let (b, p) = backend().await;
    b.server.serve(Serve::Truncate(100_000));
    let (c, _) = class(p.create(&OpCtx::background(), &request_in("h2", HOSTS[0])).await);
    assert_eq!(c, ErrorClass::Transient);
    let log: Vec<(String, String)> = b
        .interceptor
        .call_log()
        .into_iter()
        .map(|c| (c.kind.0.to_owned(), c.target))
        .collect();
    let closed: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, c)| c.0 == "Close")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(closed.len(), 1, "the upload connection is closed exactly once: {log:?}");
    // The last removal of the base (the first is the cache clearing a base without a marker).
    let removed = log
        .iter()
        .rposition(|c| c.0 == "StorageVolDelete" && c.1 == base())
        .expect("the failed base is removed");
    assert!(closed[0] < removed, "removed before its connection was closed: {log:?}");
}

#[tokio::test]
async fn credentials_reach_the_vm_as_an_htpasswd_file_on_its_seed_only() {
    let (b, p) = backend().await;
    let cx = OpCtx::background();
    let mut req = request_in("locked", HOSTS[0]);
    let credentials = egress_provider::Credentials::new("u1", "SENTINEL-password").unwrap();
    req.credentials = Some(egress_provider::ProxyCredentials::new(credentials.clone(), "s"));
    p.create(&cx, &req).await.unwrap();
    let seed = &host(&b).volumes(POOL)[&format!("{}-seed.iso", req.name)].bytes;
    let file = egress_libvirt::seed::read_seed_file(seed, egress_libvirt::seed::HTPASSWD_FILE).expect("the file");
    let line = String::from_utf8(file).unwrap();
    assert!(credentials.matches_htpasswd(&line), "{line}");
    // The password is nowhere in the seed, the domain or the user's cloud-init.
    let needle = b"SENTINEL";
    assert!(!seed.windows(needle.len()).any(|w| w == needle));
    let user_data = egress_libvirt::seed::read_seed_file(seed, "user-data").unwrap();
    assert_eq!(
        user_data, req.cloud_init,
        "the user's cloud-init is delivered untouched"
    );
    let domains = format!("{:?}", host(&b).domains());
    assert!(!domains.contains("SENTINEL") && !domains.contains("$6$"));
    // A Proxy without credentials gets no such file.
    let open = request_in("open", HOSTS[0]);
    p.create(&cx, &open).await.unwrap();
    let seed = &host(&b).volumes(POOL)[&format!("{}-seed.iso", open.name)].bytes;
    assert_eq!(
        egress_libvirt::seed::read_seed_file(seed, egress_libvirt::seed::HTPASSWD_FILE),
        None
    );
}
