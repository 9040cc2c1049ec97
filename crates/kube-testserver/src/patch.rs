//! The patch formats: JSON merge (RFC 7386), JSON patch (RFC 6902, `test` included) and
//! strategic merge (built-in kinds only, as on the real server). Server-side apply and field
//! ownership are in `fields`.

use serde_json::{Map, Value};

pub(crate) fn json_merge(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

/// Applies an RFC 6902 patch, all or nothing; the error is what the server reports.
///
/// One rule follows the Go library the API server uses rather than the RFC: a `test` for `null`
/// passes when the path is absent (kube's finalizer helper relies on it).
pub(crate) fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchFailure> {
    let ops: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| PatchFailure::Malformed(e.to_string()))?;
    let mut work = doc.clone();
    for (i, op) in ops.0.iter().enumerate() {
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && work.pointer(t.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(&mut work, std::slice::from_ref(op))
            .map_err(|e| PatchFailure::DoesNotApply(e.to_string().replacen("'/0'", &format!("'/{i}'"), 1)))?;
    }
    *doc = work;
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PatchFailure {
    /// The patch document itself is not valid: 400.
    Malformed(String),
    /// The patch is valid but cannot be applied to this object: 422.
    DoesNotApply(String),
}

/// How a list field of a built-in kind merges under strategic merge (its `patchStrategy` and
/// `patchMergeKey` in the Kubernetes types); lists not named here are replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListMerge {
    ByKey(&'static str),
    /// A list of scalars merged as a set (`finalizers`).
    Union,
}

fn list_merge(field: &str) -> Option<ListMerge> {
    Some(match field {
        "containers" | "initContainers" | "ephemeralContainers" | "env" | "volumes" | "imagePullSecrets" => {
            ListMerge::ByKey("name")
        }
        "ports" => ListMerge::ByKey("containerPort"),
        "volumeMounts" => ListMerge::ByKey("mountPath"),
        "volumeDevices" => ListMerge::ByKey("devicePath"),
        "hostAliases" => ListMerge::ByKey("ip"),
        "conditions" => ListMerge::ByKey("type"),
        "ownerReferences" => ListMerge::ByKey("uid"),
        "topologySpreadConstraints" => ListMerge::ByKey("topologyKey"),
        "readinessGates" => ListMerge::ByKey("conditionType"),
        "finalizers" => ListMerge::Union,
        _ => return None,
    })
}

/// Strategic merge for built-in kinds: objects merge, lists of keyed objects merge by key, and the
/// `$patch`, `$setElementOrder` and `$deleteFromPrimitiveList` directives kubectl sends are honoured.
pub(crate) fn strategic_merge(doc: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *doc = patch.clone();
        return;
    };
    if patch_map.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch_map.clone();
        replaced.remove("$patch");
        *doc = Value::Object(replaced);
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let target = doc.as_object_mut().expect("an object");
    let retain: Option<Vec<String>> = patch_map
        .get("$retainKeys")
        .and_then(Value::as_array)
        .map(|keys| keys.iter().filter_map(|k| k.as_str().map(str::to_string)).collect());
    for (key, value) in patch_map {
        if key.starts_with("$setElementOrder/") || key == "$retainKeys" || key == "$patch" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(gone)) = (target.get_mut(field), value) {
                list.retain(|v| !gone.contains(v));
            }
            continue;
        }
        // `null` and `{"$patch": "delete"}` both remove the field.
        if value.is_null() || directive(value) == Some("delete") {
            target.remove(key);
            continue;
        }
        match (target.get_mut(key), value) {
            (Some(Value::Array(existing)), Value::Array(incoming)) => merge_field_list(key, existing, incoming),
            (Some(existing @ Value::Object(_)), Value::Object(_)) => strategic_merge(existing, value),
            (_, Value::Array(incoming)) => {
                target.insert(key.clone(), Value::Array(without_directives(incoming)));
            }
            _ => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, value);
                target.insert(key.clone(), if value.is_object() { fresh } else { value.clone() });
            }
        }
    }
    // `$setElementOrder/<list>`: the items named come first, in that order; others keep theirs.
    for (key, order) in patch_map
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("$setElementOrder/").zip(v.as_array()))
    {
        if let Some(Value::Array(list)) = target.get_mut(key) {
            set_element_order(key, list, order);
        }
    }
    // `$retainKeys`: the fields not listed go (a union type switching its member).
    if let Some(keys) = retain {
        target.retain(|k, _| keys.contains(k));
    }
}

/// The list field `key` of a strategic merge: a `{"$patch": "replace"}` item makes it the
/// patch's list; a keyed list merges by its key, a union list gains what it lacks; any other
/// list is replaced (directives left out).
fn merge_field_list(key: &str, existing: &mut Vec<Value>, incoming: &[Value]) {
    if incoming.iter().any(|i| directive(i) == Some("replace")) {
        *existing = without_directives(incoming);
        return;
    }
    match list_merge(key) {
        Some(ListMerge::ByKey(k)) if incoming.iter().all(|i| directive(i).is_some() || i.get(k).is_some()) => {
            merge_list(existing, incoming, k)
        }
        Some(ListMerge::Union) => {
            for item in incoming {
                if !existing.contains(item) {
                    existing.push(item.clone());
                }
            }
        }
        _ => *existing = without_directives(incoming),
    }
}

/// `$setElementOrder/<key>`: the items of `list` that `order` names come first, in its order
/// (a keyed list's items named by their key); the others keep theirs after them.
fn set_element_order(key: &str, list: &mut Vec<Value>, order: &[Value]) {
    let merge_key = match list_merge(key) {
        Some(ListMerge::ByKey(k)) => Some(k),
        _ => None,
    };
    let id = |v: &Value| match merge_key {
        Some(k) => v.get(k).cloned(),
        None => Some(v.clone()),
    };
    let mut ordered = Vec::with_capacity(list.len());
    for wanted in order {
        if let Some(pos) = list
            .iter()
            .position(|item| id(item).is_some() && id(item) == id(wanted))
        {
            ordered.push(list.remove(pos));
        }
    }
    ordered.append(list);
    *list = ordered;
}

/// The `$patch` directive of an object in a patch, if it has one.
fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

/// A list as stored: directive items dropped, `$patch` keys removed from the rest.
fn without_directives(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .filter(|i| match directive(i) {
            // Deleting an item that is not there, or the bare "replace the list" marker.
            Some("delete") => false,
            Some("replace") => i.as_object().is_some_and(|m| m.len() > 1),
            _ => true,
        })
        .map(|i| {
            let mut i = i.clone();
            if let Some(m) = i.as_object_mut() {
                m.remove("$patch");
            }
            i
        })
        .collect()
}

fn merge_list(existing: &mut Vec<Value>, incoming: &[Value], key: &str) {
    for item in incoming {
        let id = item.get(key).cloned();
        let position = existing.iter().position(|e| e.get(key) == id.as_ref());
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                existing.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut existing[i], item),
            (None, false) => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, item);
                existing.push(fresh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_directives() {
        let mut doc = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "volumes": [{"name": "v1"}], "extra": {"x": 1}, "finalizers": ["p", "q"]}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}],
            "containers": [{"name": "a", "image": "i"}],
            "volumes": [{"$patch": "replace"}, {"name": "v2"}],
            "extra": {"$patch": "delete"},
            "$setElementOrder/finalizers": ["q", "p"],
            "newlist": [{"name": "n", "$patch": "delete"}, {"name": "m"}]}});
        strategic_merge(&mut doc, &patch);
        assert_eq!(
            doc,
            json!({"spec": {"containers": [{"name": "c"}, {"name": "a", "image": "i"}, {"name": "b"}],
            "volumes": [{"name": "v2"}], "finalizers": ["q", "p"], "newlist": [{"name": "m"}]}})
        );
    }

    #[test]
    fn strategic_merge_unites_finalizers_keys_ports_by_port_and_retains_keys() {
        let mut doc = json!({"metadata": {"finalizers": ["a"]}, "spec": {
            "ports": [{"name": "web", "containerPort": 80}], "strategy": {"type": "X", "old": 1}}});
        let patch = json!({"metadata": {"finalizers": ["b", "a"]}, "spec": {
            "ports": [{"name": "web", "containerPort": 8080}],
            "strategy": {"$retainKeys": ["type", "new"], "type": "Y", "new": 2}}});
        strategic_merge(&mut doc, &patch);
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            doc["spec"]["ports"].as_array().unwrap().len(),
            2,
            "ports merge by containerPort"
        );
        assert_eq!(doc["spec"]["strategy"], json!({"type": "Y", "new": 2}));
    }

    #[test]
    fn strategic_merge_merges_containers_by_name_and_honours_directives() {
        let mut doc = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
            "finalizers": ["p", "q"]}});
        let patch = json!({"$setElementOrder/containers": [{"name": "a"}], "spec": {
            "containers": [{"name": "a", "image": "z"}, {"name": "b", "$patch": "delete"}],
            "$deleteFromPrimitiveList/finalizers": ["p"]}});
        strategic_merge(&mut doc, &patch);
        assert_eq!(
            doc,
            json!({"spec": {"containers": [{"name": "a", "image": "z"}], "finalizers": ["q"]}})
        );
    }
}
