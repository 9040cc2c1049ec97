//! The operator's log lines inside a reconcile keep the keys controller-runtime gave them, so
//! log queries written for the Go operator keep matching.

use egress_runtime::logging::SpanKeys;

/// The keys of the lines inside a `Reconcile Proxy` span.
pub(crate) const RECONCILE: SpanKeys = SpanKeys {
    span: egress_controller::proxy::reconciler::RECONCILE_SPAN,
    keys: controller_runtime_keys,
};

/// The keys controller-runtime put on every line of a reconcile, from the fields of the
/// `Reconcile Proxy` span (whose OTel names stay on the exported span): `controller`,
/// `controllerGroup`, `controllerKind`, `Proxy` (`{"name","namespace"}`), `namespace`, `name`,
/// `reconcileID`. Log queries written for the Go operator keep matching.
fn controller_runtime_keys(
    mut span: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    let namespace = span.remove("k8s.namespace.name").unwrap_or_default();
    let name = span.remove("k8s.object.name").unwrap_or_default();
    let mut keys = serde_json::Map::new();
    keys.insert("controller".into(), "proxy".into());
    keys.insert("controllerGroup".into(), egress_api::GROUP.into());
    keys.insert("controllerKind".into(), "Proxy".into());
    keys.insert(
        "Proxy".into(),
        serde_json::json!({"name": name.clone(), "namespace": namespace.clone()}),
    );
    keys.insert("namespace".into(), namespace);
    keys.insert("name".into(), name);
    if let Some(id) = span.remove("reconcile.id") {
        keys.insert("reconcileID".into(), id);
    }
    keys.extend(span);
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_lines_carry_controller_runtimes_keys() {
        let span = serde_json::json!({"k8s.namespace.name": "crawl", "k8s.object.name": "p",
            "reconcile.id": "0b6b1c1e-8e0f-4f2a-9d3c-5a1f2e3d4c5b", "reconcile.requeue_after": 120.0});
        let serde_json::Value::Object(span) = span else {
            unreachable!()
        };
        let keys = controller_runtime_keys(span);
        assert_eq!(
            serde_json::Value::Object(keys),
            serde_json::json!({
                "controller": "proxy", "controllerGroup": "crawl.example.com", "controllerKind": "Proxy",
                "Proxy": {"name": "p", "namespace": "crawl"}, "namespace": "crawl", "name": "p",
                "reconcileID": "0b6b1c1e-8e0f-4f2a-9d3c-5a1f2e3d4c5b", "reconcile.requeue_after": 120.0,
            })
        );
    }
}
