//! A Pod read back, as the reconciler sees it (spec/providers.md §4.7).

use std::net::IpAddr;

use egress_provider::InstanceState;

/// The state and address of a Pod in `phase` with `pod_ip`, `deleting` when it has a deletion
/// timestamp. A Pod being deleted is Stopped, never Running: it may still answer for its grace
/// period, and leasing it then would hand out a proxy about to vanish (the reconciler deletes
/// again and waits for NotFound, which the contract allows). An unset phase is Provisioning
/// (the kubelet has not reported yet); a phase this provider does not know is Stopped.
pub fn map(phase: Option<&str>, pod_ip: Option<&str>, deleting: bool) -> (InstanceState, Option<IpAddr>) {
    if deleting {
        return (InstanceState::Stopped, None);
    }
    let ip = pod_ip.and_then(|ip| ip.parse::<IpAddr>().ok());
    match phase.unwrap_or_default() {
        "" | "Pending" => (InstanceState::Provisioning, None),
        "Running" => match ip {
            Some(ip) => (InstanceState::Running, Some(ip)),
            None => (InstanceState::Provisioning, None),
        },
        "Succeeded" | "Failed" | "Unknown" => (InstanceState::Terminated, None),
        _ => (InstanceState::Stopped, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_map_as_the_table_says() {
        use InstanceState as S;
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        for (phase, pod_ip, deleting, want) in [
            (Some("Pending"), Some("10.1.2.3"), false, (S::Provisioning, None)),
            (Some("Running"), None, false, (S::Provisioning, None)),
            (Some("Running"), Some(""), false, (S::Provisioning, None)),
            (Some("Running"), Some("not an ip"), false, (S::Provisioning, None)),
            (Some("Running"), Some("10.1.2.3"), false, (S::Running, Some(ip))),
            (Some("Succeeded"), Some("10.1.2.3"), false, (S::Terminated, None)),
            (Some("Failed"), None, false, (S::Terminated, None)),
            (Some("Unknown"), None, false, (S::Terminated, None)),
            (None, None, false, (S::Provisioning, None)),
            (Some(""), None, false, (S::Provisioning, None)),
            (Some("Evicted"), Some("10.1.2.3"), false, (S::Stopped, None)),
            // Being deleted: never Running.
            (Some("Running"), Some("10.1.2.3"), true, (S::Stopped, None)),
        ] {
            assert_eq!(map(phase, pod_ip, deleting), want, "{phase:?} {pod_ip:?} {deleting}");
        }
    }
}
