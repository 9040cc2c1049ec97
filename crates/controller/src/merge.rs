//! RFC 7386 merge patches computed from two documents: how the status flush sends only what
//! changed, and how a field that went away is removed (`null`), not left behind.

use serde_json::{Map, Value};

/// The merge patch that turns `base` into `new`. Objects are compared key by key; anything
/// else (lists included, as merge patches replace lists whole) is replaced when it differs.
pub fn diff(base: &Value, new: &Value) -> Value {
    match (base, new) {
        (Value::Object(b), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, bv) in b {
                match n.get(k) {
                    None => {
                        patch.insert(k.clone(), Value::Null);
                    }
                    Some(nv) if nv != bv => {
                        patch.insert(k.clone(), diff(bv, nv));
                    }
                    Some(_) => {}
                }
            }
            for (k, nv) in n {
                if !b.contains_key(k) {
                    patch.insert(k.clone(), nv.clone());
                }
            }
            Value::Object(patch)
        }
        (_, new) => new.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_diff_applied_gives_the_new_document() {
        let base =
            json!({"phase": "Ready", "ip": "10.0.0.1", "conditions": [{"type": "A"}], "nested": {"a": 1, "b": 2}});
        let new =
            json!({"phase": "Provisioning", "conditions": [{"type": "A"}, {"type": "B"}], "nested": {"a": 1, "c": 3}});
        let patch = diff(&base, &new);
        assert_eq!(
            patch,
            json!({"phase": "Provisioning", "ip": null, "conditions": [{"type": "A"}, {"type": "B"}],
            "nested": {"b": null, "c": 3}})
        );
        let mut applied = base.clone();
        json_merge(&mut applied, &patch);
        assert_eq!(applied, new);
        assert_eq!(diff(&new, &new), json!({}));
    }

    fn json_merge(doc: &mut Value, patch: &Value) {
        if let Value::Object(p) = patch {
            if !doc.is_object() {
                *doc = Value::Object(Map::new());
            }
            let d = doc.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    d.remove(k);
                } else {
                    json_merge(d.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        } else {
            *doc = patch.clone();
        }
    }
}
