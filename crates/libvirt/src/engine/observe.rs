//! Reading a domain back: its state, mapped for the reconciler, and its address by the H3 rule
//! (spec/kvm.md §7.5, §7.6).

use std::net::IpAddr;

use crate::host::{DomainState, Host, Interface, code, first_ipv4};
use egress_provider::{InstanceState, OpCtx};

use super::failure::OpFailure;
use crate::generation::Generation;
use crate::names;

/// The reconciler's state for a libvirt state and whether an address was found.
///
/// No state (libvirt could not tell) is Provisioning, not Stopped: Stopped would make the
/// reconciler delete and recreate a VM the next poll may find running. Paused and suspended
/// are Provisioning too (review M1): a guest QEMU paused on a full disk, or one an
/// administrator suspended, is kept, not destroyed and rebuilt; it reads Running again once
/// resumed. A pause whose guest is gone for good (it crashed, powered off, or failed a
/// post-copy migration: [`crate::host::PauseReason::is_terminal`]) is Stopped, so the proxy is rebuilt
/// rather than left waiting for a resume that cannot help.
pub fn map_state(state: DomainState, has_ip: bool) -> InstanceState {
    match state {
        DomainState::Paused(reason) if reason.is_terminal() => InstanceState::Stopped,
        DomainState::NoState | DomainState::Paused(_) | DomainState::PmSuspended => InstanceState::Provisioning,
        DomainState::Running | DomainState::Blocked if has_ip => InstanceState::Running,
        DomainState::Running | DomainState::Blocked => InstanceState::Provisioning,
        _ => InstanceState::Stopped,
    }
}

/// The interfaces of the VM's own NIC (by its MAC, review M14), so a guest running Docker, say,
/// is not reached at `docker0`'s address; all of them when none carries that MAC (a domain
/// defined before the provider set one).
fn own_interfaces<'a>(interfaces: &'a [Interface], mac: &str) -> &'a [Interface] {
    match interfaces.iter().position(|i| i.hwaddr.eq_ignore_ascii_case(mac)) {
        Some(at) => &interfaces[at..=at],
        None => interfaces,
    }
}

/// The address of running domain `name` (H3):
///
/// 1. each source in order; the first usable IPv4 wins;
/// 2. a source that fails because the connection failed, or the caller gave up, fails the read
///    at once (a running proxy must not read as "no address" because a link died);
/// 3. "the agent is not connected" counts as an answer with no address (a booting guest);
///    another failure (ARP unsupported) is remembered and the next source asked;
/// 4. every source failed: an error (Transient); at least one answered: `None` (Provisioning).
///
/// A domain gone meanwhile (libvirt's "no domain") is reported as such, so get says NotFound
/// (review L6).
///
/// # Errors
/// Transient, explicitly (the joined errors could hold a code the table calls Permanent); or
/// the domain vanished.
pub async fn discover(
    cx: &OpCtx,
    host: &dyn Host,
    generation: Generation,
    name: &str,
) -> Result<Option<IpAddr>, OpFailure> {
    let mut answered = false;
    let mut failures = Vec::new();
    let mac = names::mac(name);
    for source in generation.sources() {
        match host.interface_addresses(cx, name, source).await {
            Ok(interfaces) => match first_ipv4(own_interfaces(&interfaces, &mac)) {
                Some(ip) => return Ok(Some(ip)),
                // Answered, with nothing usable yet: not a failure.
                None => answered = true,
            },
            // "The agent is not connected" is an answer, not a failed read: a booting guest
            // has no agent yet. Counted as one, a host whose ARP source always errors (some
            // kernels) still lets a booting VM rest in Provisioning instead of failing every
            // poll until its agent starts.
            Err(e) if e.is(code::AGENT_UNRESPONSIVE) => {
                tracing::trace!(source = source.name(), error = %e, "no addresses from source");
                answered = true;
            }
            Err(e) if e.is(code::NO_DOMAIN) => {
                return Err(OpFailure::call(format!("reading addresses of domain {name}"), e));
            }
            Err(e) if e.transport || cx.interrupted().is_some() => {
                return Err(OpFailure::transient(format!(
                    "reading addresses of domain {name} from the {} source: {e}",
                    source.name()
                )));
            }
            Err(e) => {
                tracing::trace!(source = source.name(), error = %e, "no addresses from source");
                failures.push(format!("{}: {e}", source.name()));
            }
        }
    }
    if answered || failures.is_empty() {
        return Ok(None);
    }
    Err(OpFailure::transient(format!(
        "reading addresses of domain {name}: every source failed: {}",
        failures.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use crate::Mark;
    use crate::fake::FakeHost;
    use crate::host::{Address, AddressSource, Interface, LibvirtError, PauseReason};
    use egress_provider::{ErrorClass, Op};

    use super::*;

    #[test]
    fn states_map_as_the_table_says() {
        use DomainState as S;
        use InstanceState as I;
        for (state, ip, want) in [
            (S::NoState, true, I::Provisioning),
            (S::Running, false, I::Provisioning),
            (S::Running, true, I::Running),
            (S::Blocked, true, I::Running),
            (S::Blocked, false, I::Provisioning),
            (S::Paused(PauseReason::USER), true, I::Provisioning),
            (S::Paused(PauseReason::IO_ERROR), false, I::Provisioning),
            (S::Paused(PauseReason::UNKNOWN), false, I::Provisioning),
            (S::Paused(PauseReason(99)), false, I::Provisioning),
            (S::Paused(PauseReason::CRASHED), false, I::Stopped),
            (S::Paused(PauseReason::SHUTTING_DOWN), true, I::Stopped),
            (S::Paused(PauseReason::POSTCOPY_FAILED), false, I::Stopped),
            (S::PmSuspended, true, I::Provisioning),
            (S::Shutdown, false, I::Stopped),
            (S::Shutoff, false, I::Stopped),
            (S::Crashed, false, I::Stopped),
            (S::Other(99), true, I::Stopped),
        ] {
            assert_eq!(map_state(state, ip), want, "{state:?} ip={ip}");
        }
    }

    fn eth0(ip: &str) -> Vec<Interface> {
        vec![Interface {
            name: "eth0".into(),
            hwaddr: "52:54:00:00:00:01".into(),
            addresses: vec![Address {
                kind: 0,
                text: ip.into(),
            }],
        }]
    }

    async fn running(fake: &FakeHost, name: &str) {
        let xml = crate::engine::test_domain_xml(name, Mark::new("u", std::time::SystemTime::now()));
        fake.define_domain(&OpCtx::background(), &xml).await.unwrap();
        fake.start_domain(&OpCtx::background(), name).await.unwrap();
    }

    #[tokio::test]
    async fn the_agent_first_then_arp() {
        let fake = FakeHost::new("hv", "default", 1 << 30);
        running(&fake, "vm").await;
        let cx = OpCtx::background();
        fake.set_addresses("vm", AddressSource::Agent, Ok(eth0("192.168.1.10")));
        fake.set_addresses("vm", AddressSource::Arp, Ok(eth0("192.168.1.99")));
        assert_eq!(
            discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap(),
            Some("192.168.1.10".parse().unwrap())
        );
        // The agent not up yet (86): ARP answers.
        fake.set_addresses(
            "vm",
            AddressSource::Agent,
            Err(LibvirtError::daemon(
                code::AGENT_UNRESPONSIVE,
                "Guest agent is not responding",
            )),
        );
        assert_eq!(
            discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap(),
            Some("192.168.1.99".parse().unwrap())
        );
    }

    #[tokio::test]
    async fn m14_the_address_is_the_vms_own_nics() {
        let fake = FakeHost::new("hv", "default", 1 << 30);
        running(&fake, "vm").await;
        let cx = OpCtx::background();
        let nic = |name: &str, hwaddr: &str, ip: &str| Interface {
            name: name.into(),
            hwaddr: hwaddr.into(),
            addresses: vec![Address {
                kind: 0,
                text: ip.into(),
            }],
        };
        fake.set_addresses(
            "vm",
            AddressSource::Agent,
            Ok(vec![
                nic("docker0", "02:42:ac:11:00:01", "172.17.0.1"),
                nic("eth0", &names::mac("vm").to_uppercase(), "192.168.1.42"),
            ]),
        );
        assert_eq!(
            discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap(),
            Some("192.168.1.42".parse().unwrap())
        );
        // Without an interface of that MAC, the first usable address of any.
        fake.set_addresses(
            "vm",
            AddressSource::Agent,
            Ok(vec![nic("docker0", "02:42:ac:11:00:01", "172.17.0.1")]),
        );
        assert_eq!(
            discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap(),
            Some("172.17.0.1".parse().unwrap())
        );
    }

    #[tokio::test]
    async fn booting_reads_as_no_address_and_only_total_failure_is_an_error() {
        let fake = FakeHost::new("hv", "default", 1 << 30);
        running(&fake, "vm").await;
        let cx = OpCtx::background();
        let agent_down = || {
            Err(LibvirtError::daemon(
                code::AGENT_UNRESPONSIVE,
                "Guest agent is not responding",
            ))
        };
        // The boot case: the agent errors, ARP answers nothing: Provisioning, not an error.
        fake.set_addresses("vm", AddressSource::Agent, agent_down());
        fake.set_addresses("vm", AddressSource::Arp, Ok(Vec::new()));
        assert_eq!(discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap(), None);
        // The agent not up and ARP failing (as on kernels where it always does): still "no
        // address yet".
        fake.set_addresses(
            "vm",
            AddressSource::Arp,
            Err(LibvirtError::daemon(1, "internal error: wrong nlmsg len")),
        );
        assert_eq!(discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap(), None);
        // Every source failed: an error, naming both.
        fake.set_addresses(
            "vm",
            AddressSource::Agent,
            Err(LibvirtError::daemon(code::OPERATION_INVALID, "domain is not running")),
        );
        let e = discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap_err();
        assert_eq!(e.class(Op::Get), ErrorClass::Transient);
        let text = e.to_string();
        assert!(
            text.starts_with("reading addresses of domain vm: every source failed: agent: "),
            "{text}"
        );
        assert!(text.contains("arp: internal error: wrong nlmsg len"), "{text}");
        // Even when a source's code is one the table calls Permanent (H3).
        fake.set_addresses(
            "vm",
            AddressSource::Arp,
            Err(LibvirtError::daemon(8, "invalid argument")),
        );
        let e = discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap_err();
        assert_eq!(e.class(Op::Get), ErrorClass::Transient);
        // A dead connection is not "no address": the read fails at once.
        fake.set_addresses(
            "vm",
            AddressSource::Agent,
            Err(LibvirtError::transport("connection is closed: keepalive: no reply")),
        );
        let e = discover(&cx, &fake, Generation::Kvm2, "vm").await.unwrap_err();
        assert_eq!(e.class(Op::Get), ErrorClass::Transient);
        assert!(
            e.to_string()
                .starts_with("reading addresses of domain vm from the agent source: "),
            "{e}"
        );
        // The domain vanished before its addresses were read: NotFound (review L6).
        fake.set_addresses(
            "vm",
            AddressSource::Agent,
            Err(LibvirtError::daemon(code::NO_DOMAIN, "Domain not found")),
        );
        assert_eq!(
            discover(&cx, &fake, Generation::Kvm2, "vm")
                .await
                .unwrap_err()
                .class(Op::Get),
            ErrorClass::NotFound
        );
    }
}
