//! Which pool members hold an exit they share with other Proxies (docs/pools.md#decisions): a
//! pure function of the members and every Proxy the operator sees.

use std::collections::{HashMap, HashSet};

use egress_api::{ConditionStatus, Proxy, conditions, reasons};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// The pool's `members` that hold their shared exit, and so are not replaced for sharing it. Of
/// the Proxies found Shared at one address, the one seen there first (then by namespace and
/// name) holds it, looked for among `everyone` the operator sees and not the pool's members
/// alone. Replacing every one of them would leave the exit to nobody, and a newcomer landing on
/// a member's exit would take out the member it lands on, again and again. A member whose exit
/// another Proxy held first (an External one, another pool's) is not a holder: it could never
/// be Verified while that one stays, so it is replaced like any refused member rather than
/// kept, unleased, for good. (A holder still gets no lease under enforce while another shares
/// its exit; it does again once the newcomers are replaced.)
pub fn holders<'p>(members: &[&Proxy], everyone: impl IntoIterator<Item = &'p Proxy>) -> HashSet<String> {
    let addresses: HashSet<&str> = members.iter().filter_map(|p| shared_exit(p)).map(|(a, _)| a).collect();
    let mut first: HashMap<&str, (Timestamp, String, String)> = HashMap::new();
    for p in everyone.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let Some((address, seen)) = shared_exit(p).filter(|(a, _)| addresses.contains(a)) else {
            continue;
        };
        let candidate = (seen, p.namespace().unwrap_or_default(), p.name_any());
        first
            .entry(address)
            .and_modify(|held| *held = std::cmp::min(held.clone(), candidate.clone()))
            .or_insert(candidate);
    }
    let holds = |p: &Proxy| {
        shared_exit(p)
            .and_then(|(address, _)| first.get(address))
            .is_some_and(|(_, ns, name)| p.namespace().unwrap_or_default() == *ns && p.name_any() == *name)
    };
    members.iter().filter(|p| holds(p)).map(|p| p.name_any()).collect()
}

/// A Proxy's exit address and when it was first seen there, when it is found Shared.
fn shared_exit(p: &Proxy) -> Option<(&str, Timestamp)> {
    let shared = p
        .condition(conditions::EXIT_VERIFIED)
        .is_some_and(|c| c.status == ConditionStatus::False && c.reason == reasons::EXIT_SHARED);
    let exit = p.status.as_ref().and_then(|s| s.exit.as_deref()).filter(|_| shared)?;
    let seen = exit.observed_at.parse::<Timestamp>().unwrap_or(Timestamp::MAX);
    Some((exit.address.as_str(), seen))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use egress_api::{Phase, PoolRole, ProxySpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::exit_policy::ExitPolicy;
    use crate::pool::view::{Look, member};

    #[test]
    fn of_proxies_sharing_an_exit_the_first_seen_holds_it_and_a_member_holding_it_is_kept() {
        let t = Time(Timestamp::from_second(1000).unwrap());
        let proxy = |name: &str, address: &str, seen: &str, reason: &str| {
            let mut p = Proxy::new(name, ProxySpec::default());
            let status = p.status.get_or_insert_with(Default::default);
            status.phase = Some(Phase::Ready);
            status.exit = Some(Box::new(egress_api::ExitStatus {
                address: address.into(),
                observed_at: seen.into(),
                ..Default::default()
            }));
            let s = if reason == reasons::EXIT_VERIFIED {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            };
            crate::conditions::set_condition(
                &mut status.conditions,
                conditions::EXIT_VERIFIED,
                s,
                reason,
                "",
                None,
                &t,
            );
            p
        };
        let (shared, other) = (reasons::EXIT_SHARED, reasons::EXIT_UNEXPECTED);
        let members = [
            proxy("old", "203.0.113.1", "2026-12-01T10:00:00Z", shared),
            proxy("new", "203.0.113.1", "2026-12-07T10:00:00Z", shared),
            proxy("b", "203.0.113.2", "2026-12-07T10:00:00Z", shared),
            proxy("a", "203.0.113.2", "2026-12-07T10:00:00Z", shared),
            proxy("abroad", "203.0.113.3", "2026-12-01T10:00:00Z", other),
            proxy("alone", "203.0.113.4", "2026-12-01T10:00:00Z", reasons::EXIT_VERIFIED),
        ];
        // Proxies that are not the pool's: one in another namespace seen at "old"'s exit after
        // it; one seen at "behind"'s exit before it (an External Proxy, say); one seen first at
        // "a"'s exit but being deleted.
        let mut later = proxy("later", "203.0.113.1", "2026-12-07T11:00:00Z", shared);
        later.metadata.namespace = Some("other".into());
        let earlier = proxy("earlier", "203.0.113.5", "2026-11-01T10:00:00Z", shared);
        let mut dying = proxy("dying", "203.0.113.2", "2026-11-01T10:00:00Z", shared);
        dying.metadata.deletion_timestamp = Some(t.clone());
        let behind = proxy("behind", "203.0.113.5", "2026-12-01T10:00:00Z", shared);
        let members: Vec<Proxy> = members.into_iter().chain([behind]).collect();
        let refs: Vec<&Proxy> = members.iter().collect();
        let everyone = refs.iter().copied().chain([&later, &earlier, &dying]);
        let holders = holders(&refs, everyone);
        assert_eq!(
            holders,
            HashSet::from(["old".to_owned(), "a".to_owned()]),
            "first seen, then by name; never a member another Proxy was seen at first"
        );
        let look = Look {
            hash: "h",
            now: t.0,
            grace: Duration::from_secs(300),
            exit_policy: ExitPolicy::Enforce,
            exit_holders: &holders,
        };
        let failed: Vec<(String, bool)> = members
            .iter()
            .map(|p| (p.name_any(), member(p, PoolRole::Active, 0, true, &look).failed))
            .collect();
        let want = [
            ("old", false),
            ("new", true),
            ("b", true),
            ("a", false),
            ("abroad", true),
            ("alone", false),
            ("behind", true),
        ];
        assert_eq!(failed, want.map(|(n, f)| (n.to_owned(), f)));
    }
}
