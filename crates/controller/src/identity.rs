//! How the operator shows itself to the API server, the same for every controller: the field
//! manager of its writes (also the reporting controller of its Events), the reporting instance
//! of its Events, and the id of each reconcile.

/// The field manager of the operator's writes.
pub const FIELD_MANAGER: &str = "egress-proxies-operator";

/// The reporting instance of the Events this replica publishes: its Pod's name, or the field
/// manager outside a Pod.
pub(crate) fn reporting_instance() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| FIELD_MANAGER.into())
}

/// A random (version 4) UUID, as controller-runtime gives each reconcile.
pub fn reconcile_id() -> String {
    egress_provider::uuid_text(rand::random(), 4)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_reconcile_id_is_a_random_version_4_uuid() {
        let id = super::reconcile_id();
        let groups: Vec<&str> = id.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12],
            "{id}"
        );
        assert!(
            id.bytes()
                .all(|b| b == b'-' || b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert!(groups[2].starts_with('4'), "version 4: {id}");
        assert!("89ab".contains(&groups[3][..1]), "RFC 4122 variant: {id}");
        assert_ne!(super::reconcile_id(), id);
    }
}
