//! The provider's steps on one host, over the [`Host`] seam: removing a domain with everything
//! made for it, and listing the marked domains (spec/kvm.md §7.7, §7.8).

use crate::Mark;
use crate::host::{Host, LibvirtError, UNDEFINE_FLAGS, code};
use egress_provider::{Instance, InstanceState, OpCtx};

use super::id;
use crate::names;

/// Removes domain `name` and its overlay and seed from `pool`. Everything already gone is
/// success (a domain not running, undefined, a pool or volume missing); the shared base image
/// and its marker are never touched.
///
/// # Errors
/// The first call that failed otherwise.
pub async fn remove(cx: &OpCtx, host: &dyn Host, pool: &str, name: &str) -> Result<(), LibvirtError> {
    match host.destroy_domain(cx, name).await {
        Ok(()) => tracing::debug!(host = host.name(), name, "domain destroyed"),
        Err(e) if e.is(code::OPERATION_INVALID) => {
            tracing::debug!(host = host.name(), name, "domain not running, destroy skipped")
        }
        Err(e) if e.is(code::NO_DOMAIN) => tracing::debug!(host = host.name(), name, "domain already gone"),
        Err(e) => return Err(e),
    }
    match host.undefine_domain(cx, name, UNDEFINE_FLAGS).await {
        Ok(()) => tracing::debug!(host = host.name(), name, "domain undefined"),
        Err(e) if e.is(code::NO_DOMAIN) => {}
        Err(e) => return Err(e),
    }
    // Volumes go by name whether or not a domain existed: that is how the leftovers of a create
    // that died before its define are cleaned by the next delete.
    for volume in [names::overlay(name), names::seed(name)] {
        match host.delete_volume(cx, pool, &volume).await {
            Ok(()) => {}
            Err(e) if e.is(code::NO_STORAGE_VOL) => {}
            Err(e) if e.is(code::NO_STORAGE_POOL) => {
                tracing::debug!(host = host.name(), name, pool, "pool not found, no volumes to delete");
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
    tracing::debug!(host = host.name(), name, "per-VM volumes deleted");
    Ok(())
}

/// The domains on `host` that carry a mark in `namespace` (the provider's), with their UID and creation time (no state,
/// no address: GC reads nothing else). A domain whose mark cannot be read is skipped with a log
/// line; a failed connection, or a caller that gives up, fails the whole list (a partial list
/// must not look complete).
///
/// # Errors
/// The listing's error, or the caller's interruption.
pub async fn list_marked(cx: &OpCtx, host: &dyn Host, namespace: &str) -> Result<Vec<Instance>, LibvirtError> {
    let mut out = Vec::new();
    for name in host.domain_names(cx).await? {
        let read = host.domain_metadata(cx, &name, namespace).await;
        if let Some(why) = cx.interrupted() {
            return Err(LibvirtError::timeout(format!(
                "reading the mark of domain {name}: {why}"
            )));
        }
        let element = match read {
            Ok(Some(element)) => element,
            // Not ours (or not a proxy at all).
            Ok(None) => continue,
            // Gone since the listing.
            Err(e) if e.is(code::NO_DOMAIN) => continue,
            // Review M15: a connection that failed would make every later domain "unreadable";
            // a list that quietly lost them must not look complete.
            Err(e) if e.transport => return Err(e),
            Err(e) => {
                tracing::debug!(host = host.name(), name = %name, error = %e, "skipping domain with unreadable metadata");
                continue;
            }
        };
        match Mark::parse(&element) {
            Ok(mark) if mark.managed => out.push(
                Instance::new(id::format(host.name(), &name), InstanceState::Provisioning)
                    .with_uid(mark.uid)
                    .with_created_at(mark.created_at)
                    .with_installation(mark.installation),
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(host = host.name(), name = %name, error = %e, "skipping domain with unreadable metadata")
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use crate::fake::{FakeHost, FakeVolume};
    use crate::{KVM_NAMESPACE, KVM2_NAMESPACE};
    use egress_conformance::{CallKind, Fault, Times};

    use super::*;

    async fn define(fake: &FakeHost, name: &str, mark: Option<Mark>, namespace: &str) {
        let xml = crate::engine::test_domain_xml(name, mark.clone().unwrap_or_default());
        fake.define_domain(&OpCtx::background(), &xml).await.unwrap();
        let element = mark.map(|m| m.to_xml(namespace).unwrap());
        fake.set_metadata(name, KVM2_NAMESPACE, None);
        if let Some(e) = element {
            fake.set_metadata(name, namespace, Some(e));
        }
    }

    fn volume() -> FakeVolume {
        FakeVolume {
            path: "/p".into(),
            capacity: 1,
            format: "qcow2".into(),
            backing: None,
            bytes: Vec::new(),
        }
    }

    #[tokio::test]
    async fn remove_takes_the_domain_and_its_volumes_and_leaves_the_base() {
        let fake = FakeHost::new("hv", "default", 1 << 30);
        let cx = OpCtx::background();
        define(&fake, "vm", Some(Mark::new("u", SystemTime::now())), KVM2_NAMESPACE).await;
        fake.start_domain(&cx, "vm").await.unwrap();
        for v in ["vm.qcow2", "vm-seed.iso", "base-e-k.qcow2", "base-e-k.qcow2.sha256"] {
            fake.put_volume("default", v, volume());
        }
        remove(&cx, &fake, "default", "vm").await.unwrap();
        assert!(fake.domains().is_empty());
        let left: Vec<String> = fake.volumes("default").into_keys().collect();
        assert_eq!(left, ["base-e-k.qcow2", "base-e-k.qcow2.sha256"]);
        // Again, with everything gone; and on a host without the pool.
        remove(&cx, &fake, "default", "vm").await.unwrap();
        remove(&cx, &fake, "no-such-pool", "vm").await.unwrap();
    }

    #[tokio::test]
    async fn remove_reports_a_real_failure() {
        let fake = FakeHost::new("hv", "default", 1 << 30);
        let cx = OpCtx::background();
        define(&fake, "vm", None, KVM2_NAMESPACE).await;
        fake.interceptor()
            .fail(CallKind("DomainUndefineFlags"), Fault::Server5xx, Times::Once);
        let e = remove(&cx, &fake, "default", "vm").await.unwrap_err();
        assert_eq!(e.code, code::INTERNAL_ERROR);
    }

    #[tokio::test]
    async fn list_finds_our_marked_domains_only() {
        let fake = FakeHost::new("hv", "default", 1 << 30);
        let cx = OpCtx::background();
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_789_560_000);
        define(&fake, "ours", Some(Mark::new("U-1", at)), KVM2_NAMESPACE).await;
        define(&fake, "first-generation", Some(Mark::new("u-2", at)), KVM_NAMESPACE).await;
        define(&fake, "unmarked", None, KVM2_NAMESPACE).await;
        let mut unmanaged = Mark::new("u-3", at);
        unmanaged.managed = false;
        define(&fake, "not-managed", Some(unmanaged), KVM2_NAMESPACE).await;
        define(&fake, "garbled", None, KVM2_NAMESPACE).await;
        fake.set_metadata("garbled", KVM2_NAMESPACE, Some("<vm/>".into()));
        let listed = list_marked(&cx, &fake, KVM2_NAMESPACE).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].id.as_str(), "hosts/hv/domains/ours");
        assert_eq!(listed[0].uid, "u-1");
        assert_eq!(listed[0].created_at, Some(at));
        // A listing that fails fails whole.
        fake.interceptor()
            .fail(CallKind("ConnectListAllDomains"), Fault::ConnectionReset, Times::Once);
        assert!(list_marked(&cx, &fake, KVM2_NAMESPACE).await.unwrap_err().transport);
        // So does one whose connection drops while a domain's mark is read (review M15): the
        // domains after it would otherwise be skipped as unreadable.
        fake.interceptor()
            .fail(CallKind("DomainGetMetadata"), Fault::ConnectionReset, Times::Once);
        assert!(list_marked(&cx, &fake, KVM2_NAMESPACE).await.unwrap_err().transport);
    }
}
