//! The scale subresource of a custom resource whose CRD declares one
//! (`subresources.scale`): an `autoscaling/v1` Scale read from, and written to, the paths the
//! CRD names, as the API server serves it to `kubectl scale`, the HPA and KEDA.
//!
//! A write of the Scale becomes a merge patch of the object's replicas path, so it passes the
//! object's schema and CEL rules and moves its generation as any spec change does. Only
//! `spec.replicas` of a Scale can be written; `status` is read-only, as on the real server.

use serde_json::{Value, json};

use crate::status::ApiError;

/// The paths a CRD's `subresources.scale` names, as JSON pointers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScalePaths {
    spec_replicas: String,
    status_replicas: String,
    label_selector: Option<String>,
}

/// `.spec.replicas` as the pointer `/spec/replicas`.
fn pointer(path: &str) -> String {
    path.strip_prefix('.')
        .unwrap_or(path)
        .split('.')
        .fold(String::new(), |mut p, part| {
            p.push('/');
            p.push_str(part);
            p
        })
}

impl ScalePaths {
    /// The paths of a CRD version's `subresources.scale`, if it declares one.
    pub(crate) fn of(version: &Value) -> Option<Self> {
        let scale = version.pointer("/subresources/scale")?;
        let text = |key: &str| scale.get(key).and_then(Value::as_str).map(pointer);
        Some(Self {
            spec_replicas: text("specReplicasPath")?,
            status_replicas: text("statusReplicasPath")?,
            label_selector: text("labelSelectorPath"),
        })
    }

    /// The Scale of `object`: its spec and status replicas (0 when unset) and selector.
    pub(crate) fn scale_of(&self, object: &Value) -> Value {
        let meta = &object["metadata"];
        let mut metadata = json!({});
        for key in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
            if let Some(v) = meta.get(key) {
                metadata[key] = v.clone();
            }
        }
        let replicas = |at: &str| object.pointer(at).and_then(Value::as_i64).unwrap_or(0);
        let mut status = json!({"replicas": replicas(&self.status_replicas)});
        if let Some(selector) = self
            .label_selector
            .as_deref()
            .and_then(|at| object.pointer(at))
            .and_then(Value::as_str)
        {
            status["selector"] = json!(selector);
        }
        json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": metadata,
            "spec": {"replicas": replicas(&self.spec_replicas)}, "status": status})
    }

    /// The merge patch of the object that writes `scale`'s `spec.replicas`.
    ///
    /// # Errors
    ///
    /// 422 when the Scale's `spec.replicas` is not a whole, non-negative number.
    pub(crate) fn object_patch(&self, scale: &Value) -> Result<Value, ApiError> {
        // Go leaves a zero out of a Scale it sends (`omitempty`): absent is 0.
        let replicas = match scale.pointer("/spec/replicas") {
            None | Some(Value::Null) => Some(0),
            Some(v) => v.as_i64(),
        }
        .filter(|n| (0..=i64::from(i32::MAX)).contains(n))
        .ok_or_else(|| {
            ApiError::new(
                422,
                "Invalid",
                "Scale.autoscaling \"\" is invalid: spec.replicas: Invalid value: must be greater than or equal to 0",
            )
        })?;
        let mut patch = json!(replicas);
        for part in self.spec_replicas.rsplit('/').filter(|p| !p.is_empty()) {
            patch = json!({ part: patch });
        }
        if let Some(rv) = scale.pointer("/metadata/resourceVersion") {
            patch["metadata"] = json!({"resourceVersion": rv});
        }
        Ok(patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> ScalePaths {
        ScalePaths::of(&json!({"subresources": {"scale": {"specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}}}))
        .unwrap()
    }

    #[test]
    fn a_scale_reads_the_named_paths() {
        let object = json!({"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7", "labels": {"a": "b"}},
            "spec": {"replicas": 3}, "status": {"replicas": 2, "selector": "pool=p"}});
        assert_eq!(
            paths().scale_of(&object),
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7"},
                "spec": {"replicas": 3}, "status": {"replicas": 2, "selector": "pool=p"}})
        );
        let fresh = json!({"metadata": {"name": "p"}, "spec": {}});
        assert_eq!(paths().scale_of(&fresh)["status"], json!({"replicas": 0}));
        assert_eq!(ScalePaths::of(&json!({"subresources": {"status": {}}})), None);
    }

    #[test]
    fn a_write_patches_the_replicas_path_only() {
        let patch = paths()
            .object_patch(&json!({"spec": {"replicas": 5}, "status": {"replicas": 99}}))
            .unwrap();
        assert_eq!(patch, json!({"spec": {"replicas": 5}}));
        let with_rv = paths()
            .object_patch(&json!({"metadata": {"resourceVersion": "4"}, "spec": {"replicas": 0}}))
            .unwrap();
        assert_eq!(
            with_rv,
            json!({"spec": {"replicas": 0}, "metadata": {"resourceVersion": "4"}})
        );
        assert_eq!(
            paths().object_patch(&json!({"spec": {}})).unwrap(),
            json!({"spec": {"replicas": 0}})
        );
        for bad in [json!({"spec": {"replicas": -1}}), json!({"spec": {"replicas": "3"}})] {
            assert_eq!(paths().object_patch(&bad).unwrap_err().code, 422, "{bad}");
        }
    }
}
