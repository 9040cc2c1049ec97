//! The health check of one host (spec/kvm.md §10): libvirt's version and hostname, then the
//! pool's state and space; one verdict. kvm2 checks on a connection of its own, with the reasons
//! of §10.4; kvm probes the shared connection and, when its round ends first, abandons the probe
//! without closing the connection (a slow check must not cut off an upload), with the reasons
//! of §10.3.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::host::{DialFailure, Host, LibvirtError, POOL_RUNNING};
use egress_provider::{
    OpCtx, REASON_API_ERROR, REASON_FORBIDDEN, REASON_TIMEOUT, REASON_UNAUTHORIZED, REASON_UNREACHABLE, TargetStatus,
};

/// The SSH material (key or known_hosts) is missing or unusable: fix the Secret, not the host.
pub const REASON_CREDENTIALS_UNAVAILABLE: &str = "CredentialsUnavailable";
/// libvirt has no pool by the configured name.
pub const REASON_POOL_NOT_FOUND: &str = "PoolNotFound";
/// The pool exists but is not running.
pub const REASON_POOL_NOT_ACTIVE: &str = "PoolNotActive";

/// kvm: the SSH key or known_hosts is missing or does not parse.
pub const REASON_SSH_MATERIAL_UNAVAILABLE: &str = "SSHMaterialUnavailable";
/// kvm: the host key is unknown or changed, or the host refused the key.
pub const REASON_SSH_HANDSHAKE_FAILED: &str = "SSHHandshakeFailed";
/// kvm: SSH worked, the libvirt socket or handshake did not.
pub const REASON_LIBVIRT_CONNECT_FAILED: &str = "LibvirtConnectFailed";
/// kvm: any other libvirt error.
pub const REASON_LIBVIRT_ERROR: &str = "LibvirtError";

/// libvirt's version number as `major.minor.micro` (11006000 is 11.6.0).
pub fn version_text(v: u32) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000)
}

/// A pool state as virsh words it.
pub fn pool_state_word(state: u32) -> String {
    match state {
        0 => "inactive".to_owned(),
        1 => "building".to_owned(),
        2 => "running".to_owned(),
        3 => "degraded".to_owned(),
        4 => "inaccessible".to_owned(),
        n => format!("state {n}"),
    }
}

/// A pool state as libvirt's constant names it (`StoragePoolInactive`), for messages.
pub fn pool_state_name(state: u32) -> String {
    match state {
        0 => "StoragePoolInactive".to_owned(),
        1 => "StoragePoolBuilding".to_owned(),
        2 => "StoragePoolRunning".to_owned(),
        3 => "StoragePoolDegraded".to_owned(),
        4 => "StoragePoolInaccessible".to_owned(),
        n => format!("StoragePoolState({n})"),
    }
}

/// Bytes as GiB with one decimal.
pub fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)] // one decimal of a pool's size
    let g = bytes as f64 / f64::from(1u32 << 30);
    format!("{g:.1}")
}

/// The reason for a failed check (§10.4), decided by the error itself (review L16: a host
/// that failed for its own reason as the round ended keeps that reason): what stopped the
/// connection; a call that ran out of time or was given up; a connection lost; libvirt's
/// answer.
pub fn reason(e: &LibvirtError) -> &'static str {
    if let Some(failure) = e.dial {
        return match failure {
            // The round ended while the dial ran.
            DialFailure::Timeout if e.timed_out => REASON_TIMEOUT,
            DialFailure::KeyUnreadable
            | DialFailure::KeyInvalid
            | DialFailure::KnownHostsUnreadable
            | DialFailure::KnownHostsInvalid => REASON_CREDENTIALS_UNAVAILABLE,
            DialFailure::HostKey | DialFailure::Auth => REASON_UNAUTHORIZED,
            DialFailure::Timeout | DialFailure::Network | DialFailure::Socket | DialFailure::Libvirt => {
                REASON_UNREACHABLE
            }
        };
    }
    if e.timed_out {
        return REASON_TIMEOUT;
    }
    if e.transport {
        return REASON_UNREACHABLE;
    }
    match e.code {
        45 | 88 => REASON_FORBIDDEN,
        49 => REASON_POOL_NOT_FOUND,
        _ => REASON_API_ERROR,
    }
}

/// Checks `host` (its pool `pool`, logged in as `user`, dialled at `address`) on a connection of
/// its own, closed when the check ends. Never fails: every failure is a not-ready verdict.
/// The reason for a failed kvm check (§10.3): the dial's stage first, then the error.
pub fn reason_kvm(e: &LibvirtError) -> &'static str {
    if let Some(failure) = e.dial {
        return match failure {
            DialFailure::KeyUnreadable
            | DialFailure::KeyInvalid
            | DialFailure::KnownHostsUnreadable
            | DialFailure::KnownHostsInvalid => REASON_SSH_MATERIAL_UNAVAILABLE,
            DialFailure::HostKey | DialFailure::Auth => REASON_SSH_HANDSHAKE_FAILED,
            DialFailure::Socket | DialFailure::Libvirt => REASON_LIBVIRT_CONNECT_FAILED,
            DialFailure::Network => REASON_UNREACHABLE,
            DialFailure::Timeout => REASON_TIMEOUT,
        };
    }
    if e.timed_out {
        return REASON_TIMEOUT;
    }
    if e.transport {
        return REASON_UNREACHABLE;
    }
    match e.code {
        49 => REASON_POOL_NOT_FOUND,
        _ => REASON_LIBVIRT_ERROR,
    }
}

/// What a kvm probe learnt.
type Probed = Result<((u32, String), crate::host::PoolInfo), LibvirtError>;

/// Checks `host` as the kvm provider does: on its shared connection, at most one probe at a time
/// (`probing`). When `cx` ends first the probe is abandoned, not cut off: the connection stays
/// for the calls sharing it, and the probe, bounded by the transport's own budgets, clears
/// `probing` when it returns. Details only from a probe that went through.
pub async fn check_host_kvm(
    cx: &OpCtx,
    host: Arc<dyn Host>,
    address: &str,
    user: &str,
    pool: &str,
    probing: Arc<AtomicBool>,
) -> TargetStatus {
    let start = Instant::now();
    let name = host.name().to_owned();
    let mut details = BTreeMap::from([
        ("user".to_owned(), user.to_owned()),
        ("pool".to_owned(), pool.to_owned()),
    ]);
    let at_once = |reason: &str, message: String| {
        TargetStatus::failed(
            &name,
            address,
            reason,
            message,
            start.elapsed().max(std::time::Duration::from_nanos(1)),
        )
    };
    if let Some(why) = cx.interrupted() {
        let mut status = at_once(REASON_TIMEOUT, format!("checking host {name}: {why}"));
        status.details = details;
        return status;
    }
    if probing.swap(true, Ordering::SeqCst) {
        let mut status = at_once(
            REASON_TIMEOUT,
            "the previous check of this host is still waiting for libvirt to answer".to_owned(),
        );
        status.details = details;
        return status;
    }
    let probe = {
        let (host, pool, probing) = (host.clone(), pool.to_owned(), probing.clone());
        tokio::spawn(async move {
            // Not the round's context: the probe must not tear the shared connection down.
            let own = OpCtx::background();
            let probed: Probed = async {
                let version = host.version(&own).await?;
                let info = host.pool_info(&own, &pool).await?;
                Ok((version, info))
            }
            .await;
            probing.store(false, Ordering::SeqCst);
            probed
        })
    };
    let probed = tokio::select! {
        biased;
        why = cx.done() => {
            tracing::debug!(host = %name, "libvirt probe abandoned, connection kept");
            let mut status = at_once(REASON_TIMEOUT, format!("checking host {name}: {why}"));
            status.details = details;
            return status;
        }
        joined = probe => joined.unwrap_or_else(|e| Err(LibvirtError::transport(format!("the probe failed: {e}")))),
    };
    let latency = start.elapsed().max(std::time::Duration::from_nanos(1));
    let mut status = match probed {
        Ok(((version, hostname), info)) => {
            details.insert("libvirtVersion".to_owned(), version_text(version));
            details.insert("hostname".to_owned(), hostname);
            details.insert("poolState".to_owned(), pool_state_word(info.state));
            details.insert("poolCapacity".to_owned(), format!("{}GiB", gib(info.capacity)));
            details.insert("poolAvailable".to_owned(), format!("{}GiB", gib(info.available)));
            if info.state == POOL_RUNNING {
                TargetStatus::reachable(&name, address, latency)
            } else {
                TargetStatus::failed(
                    &name,
                    address,
                    REASON_POOL_NOT_ACTIVE,
                    format!("storage pool {pool:?} is {}", pool_state_word(info.state)),
                    latency,
                )
            }
        }
        Err(e) => TargetStatus::failed(&name, address, reason_kvm(&e), e.to_string(), latency),
    };
    status.details = details;
    status
}

/// Checks `host` as the kvm2 provider does (see the module's notes).
pub async fn check_host(cx: &OpCtx, host: &dyn Host, address: &str, user: &str, pool: &str) -> TargetStatus {
    let start = Instant::now();
    let mut details = BTreeMap::from([
        ("user".to_owned(), user.to_owned()),
        ("pool".to_owned(), pool.to_owned()),
    ]);
    let outcome = async {
        let own = host.dedicated(cx).await?;
        let (version, hostname) = own.version(cx).await?;
        details.insert("libvirtVersion".to_owned(), version_text(version));
        details.insert("hostname".to_owned(), hostname);
        let info = own.pool_info(cx, pool).await?;
        details.insert("poolState".to_owned(), pool_state_word(info.state));
        details.insert("poolCapacityGiB".to_owned(), gib(info.capacity));
        details.insert("poolAvailableGiB".to_owned(), gib(info.available));
        Ok::<_, LibvirtError>(info.state)
    }
    .await;
    let latency = start.elapsed().max(std::time::Duration::from_nanos(1));
    let mut status = match outcome {
        Ok(state) if state == POOL_RUNNING => TargetStatus::reachable(host.name(), address, latency),
        Ok(state) => TargetStatus::failed(
            host.name(),
            address,
            REASON_POOL_NOT_ACTIVE,
            format!("storage pool {pool:?} is {}", pool_state_word(state)),
            latency,
        ),
        Err(e) => TargetStatus::failed(host.name(), address, reason(&e), e.to_string(), latency),
    };
    status.details = details;
    tracing::debug!(host = host.name(), ready = status.ready, reason = %status.reason, latency = ?status.latency, "kvm2 host checked");
    status
}

#[cfg(test)]
mod tests {
    use crate::fake::FakeHost;
    use egress_conformance::{CallKind, Fault, Times};

    use super::*;

    #[test]
    fn details_read_as_virsh_would() {
        assert_eq!(version_text(11_006_000), "11.6.0");
        assert_eq!(version_text(9_010_012), "9.10.12");
        assert_eq!(version_text(0), "0.0.0");
        assert_eq!(pool_state_word(2), "running");
        assert_eq!(pool_state_word(4), "inaccessible");
        assert_eq!(pool_state_word(9), "state 9");
        assert_eq!(pool_state_name(0), "StoragePoolInactive");
        assert_eq!(pool_state_name(9), "StoragePoolState(9)");
        assert_eq!(gib(266_073_671_680), "247.8");
        assert_eq!(gib(0), "0.0");
    }

    #[test]
    fn reasons_follow_the_decision_order() {
        let daemon = |n| LibvirtError::daemon(n, "x");
        assert_eq!(reason(&daemon(88)), REASON_FORBIDDEN);
        assert_eq!(reason(&daemon(45)), REASON_FORBIDDEN);
        assert_eq!(reason(&daemon(49)), REASON_POOL_NOT_FOUND);
        assert_eq!(reason(&daemon(1)), REASON_API_ERROR);
        assert_eq!(reason(&LibvirtError::transport("link died")), REASON_UNREACHABLE);
        assert_eq!(reason(&LibvirtError::timeout("30s budget")), REASON_TIMEOUT);
        for (failure, want) in [
            (DialFailure::KeyUnreadable, REASON_CREDENTIALS_UNAVAILABLE),
            (DialFailure::KeyInvalid, REASON_CREDENTIALS_UNAVAILABLE),
            (DialFailure::KnownHostsUnreadable, REASON_CREDENTIALS_UNAVAILABLE),
            (DialFailure::KnownHostsInvalid, REASON_CREDENTIALS_UNAVAILABLE),
            (DialFailure::HostKey, REASON_UNAUTHORIZED),
            (DialFailure::Auth, REASON_UNAUTHORIZED),
            // Review L17: a blackholed host is unreachable, even when its dial ran out of time.
            (DialFailure::Timeout, REASON_UNREACHABLE),
            (DialFailure::Network, REASON_UNREACHABLE),
            (DialFailure::Socket, REASON_UNREACHABLE),
        ] {
            assert_eq!(reason(&LibvirtError::dial(failure, "d")), want, "{failure:?}");
        }
        // ... but a dial its caller gave up on is the round's timeout.
        let abandoned = LibvirtError {
            timed_out: true,
            ..LibvirtError::dial(DialFailure::Timeout, "dial abandoned: caller's deadline exceeded")
        };
        assert_eq!(reason(&abandoned), REASON_TIMEOUT);
    }

    #[tokio::test]
    async fn a_check_reports_the_host_and_its_pool() {
        let fake = FakeHost::new("hv", "default", 10 << 30);
        let cx = OpCtx::background();
        let ok = check_host(&cx, &fake, "hv:22", "virt", "default").await;
        assert!(ok.ready, "{ok:?}");
        assert_eq!(ok.name, "hv");
        assert_eq!(ok.details["libvirtVersion"], "9.0.0");
        assert_eq!(ok.details["poolState"], "running");
        assert_eq!(ok.details["poolCapacityGiB"], "10.0");
        let missing = check_host(&cx, &fake, "hv:22", "virt", "elsewhere").await;
        assert_eq!((missing.ready, missing.reason.as_str()), (false, REASON_POOL_NOT_FOUND));
        assert_eq!(missing.details["libvirtVersion"], "9.0.0");
        fake.interceptor()
            .fail(CallKind("ConnectGetLibVersion"), Fault::PermissionDenied, Times::Once);
        let denied = check_host(&cx, &fake, "hv:22", "virt", "default").await;
        assert_eq!(denied.reason, REASON_FORBIDDEN);
        assert!(!denied.details.contains_key("libvirtVersion"));
        fake.interceptor()
            .fail(CallKind("Dial"), Fault::ConnectionReset, Times::Once);
        assert_eq!(
            check_host(&cx, &fake, "hv:22", "virt", "default").await.reason,
            REASON_UNREACHABLE
        );
        // A round that has ended is a timeout, whatever failed.
        let token = egress_provider::CancellationToken::new();
        token.cancel();
        let late = check_host(&OpCtx::with_cancel(token), &fake, "hv:22", "virt", "default").await;
        assert_eq!(late.reason, REASON_TIMEOUT);
    }

    /// Review L16: a host that fails for its own reason (here its link resets) as the round
    /// ends keeps that reason; the round's end alone does not make it a timeout.
    #[tokio::test]
    async fn l16_a_host_failing_for_its_own_reason_as_the_round_ends_keeps_it() {
        let fake = FakeHost::new("hv", "default", 10 << 30);
        fake.set_down(true);
        let token = egress_provider::CancellationToken::new();
        token.cancel();
        let status = check_host(&OpCtx::with_cancel(token), &fake, "hv:22", "virt", "default").await;
        assert_eq!(status.reason, REASON_UNREACHABLE, "{status:?}");
    }

    /// Reviews L14 and L15: the check never waits for its connection's teardown (a courtesy
    /// disconnect a slow or silent host may never answer), neither after a probe that
    /// answered, so the latency is the probes' alone, nor after the round ended mid-probe.
    #[tokio::test]
    async fn l14_l15_a_check_never_waits_for_its_connection_to_close() {
        let fake = FakeHost::new("hv", "default", 10 << 30);
        // Held for the whole test: a check that waited on a close would never return.
        let close = fake.interceptor().freeze(CallKind("Close"));
        let never = std::time::Duration::from_secs(60);
        let ok = tokio::time::timeout(
            never,
            check_host(&OpCtx::background(), &fake, "hv:22", "virt", "default"),
        )
        .await
        .expect("the check waited on the close");
        assert!(ok.ready, "{ok:?}");

        let probe = fake.interceptor().freeze(CallKind("StoragePoolGetInfo"));
        let token = egress_provider::CancellationToken::new();
        let check = tokio::spawn({
            let (fake, cx) = (fake.clone(), OpCtx::with_cancel(token.clone()));
            async move { check_host(&cx, &fake, "hv:22", "virt", "default").await }
        });
        probe.entered().await;
        token.cancel();
        let late = tokio::time::timeout(never, check)
            .await
            .expect("the check waited on the close")
            .unwrap();
        assert_eq!(late.reason, REASON_TIMEOUT, "{late:?}");
        assert!(!close.was_entered(), "the check asked for a courtesy close");
    }
}
