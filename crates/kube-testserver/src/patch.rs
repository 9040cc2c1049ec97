//! The four patch formats: JSON merge (RFC 7386), JSON patch (RFC 6902, `test` included),
//! strategic merge (built-in kinds only, as on the real server) and server-side apply, plus
//! the field ownership (`metadata.managedFields`) apply depends on.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// A field, as the path of keys from the root: `["spec", "port"]`.
pub(crate) type FieldPath = Vec<String>;

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

/// Keys on which the built-in kinds merge their lists of objects (containers, ports, env...).
const MERGE_KEYS: [&str; 6] = ["name", "containerPort", "mountPath", "devicePath", "ip", "type"];

fn merge_key(a: &[Value], b: &[Value]) -> Option<&'static str> {
    let all: Vec<&Value> = a.iter().chain(b.iter()).collect();
    if all.is_empty() || !all.iter().all(|v| v.is_object()) {
        return None;
    }
    MERGE_KEYS.into_iter().find(|k| all.iter().all(|v| v.get(*k).is_some()))
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
        if value.is_null() {
            target.remove(key);
            continue;
        }
        match (target.get_mut(key), value) {
            (Some(Value::Array(existing)), Value::Array(incoming)) => match merge_key(existing, incoming) {
                Some(k) => merge_list(existing, incoming, k),
                None => *existing = incoming.clone(),
            },
            (Some(existing @ Value::Object(_)), Value::Object(_)) => strategic_merge(existing, value),
            _ => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, value);
                target.insert(key.clone(), if value.is_object() { fresh } else { value.clone() });
            }
        }
    }
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

/// Objects merge recursively; anything else in `applied` replaces what is there.
fn deep_merge(doc: &mut Value, applied: &Value) {
    match (doc, applied) {
        (Value::Object(d), Value::Object(a)) => {
            for (k, v) in a {
                match d.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => deep_merge(existing, v),
                    _ => {
                        d.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (doc, applied) => *doc = applied.clone(),
    }
}

// ---- field ownership -------------------------------------------------------------------------

/// Metadata fields a manager can own; the rest of `metadata` belongs to the server.
const OWNABLE_METADATA: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

/// The fields an object sets: every path to a scalar, a list or an empty object.
pub(crate) fn leaves(object: &Value) -> BTreeSet<FieldPath> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        }
    }
    let mut out = BTreeSet::new();
    if let Value::Object(root) = object {
        for (k, v) in root {
            match k.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => {
                    for field in OWNABLE_METADATA {
                        if let Some(child) = v.get(field) {
                            let mut path = vec!["metadata".to_string(), field.to_string()];
                            walk(child, &mut path, &mut out);
                        }
                    }
                }
                _ => walk(v, &mut vec![k.clone()], &mut out),
            }
        }
    }
    out
}

fn value_at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(object, |cur, k| cur.get(k))
}

fn remove_at(object: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = object;
    for k in parents {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Value::Object(m) = cur {
        m.remove(last);
    }
}

fn fields_v1(set: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for k in path {
            cur = cur
                .entry(format!("f:{k}"))
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("fieldsV1 nodes are objects");
        }
    }
    Value::Object(root)
}

fn from_fields_v1(v: &Value) -> BTreeSet<FieldPath> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .map(|m| m.iter().filter(|(k, _)| k.starts_with("f:")).collect())
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, child) in children {
            path.push(k[2..].to_string());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// One `managedFields` entry, keyed by manager, operation and subresource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Owner {
    manager: String,
    operation: String,
    subresource: String,
}

fn owners(object: &Value) -> BTreeMap<Owner, (String, BTreeSet<FieldPath>)> {
    let mut out = BTreeMap::new();
    for e in object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let owner = Owner {
            manager: s("manager"),
            operation: s("operation"),
            subresource: s("subresource"),
        };
        let fields = e.get("fieldsV1").map(from_fields_v1).unwrap_or_default();
        out.insert(owner, (s("apiVersion"), fields));
    }
    out
}

fn write_owners(object: &mut Value, owners: &BTreeMap<Owner, (String, BTreeSet<FieldPath>)>, now: &str) {
    let entries: Vec<Value> = owners
        .iter()
        .filter(|(_, (_, set))| !set.is_empty())
        .map(|(o, (api_version, set))| {
            let mut e = json!({
                "manager": o.manager, "operation": o.operation, "apiVersion": api_version, "time": now,
                "fieldsType": "FieldsV1", "fieldsV1": fields_v1(set),
            });
            if !o.subresource.is_empty() {
                e["subresource"] = json!(o.subresource);
            }
            e
        })
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(entries));
        }
    }
}

/// Who wrote, for `managedFields`.
#[derive(Debug, Clone)]
pub(crate) struct Writer<'a> {
    pub(crate) manager: &'a str,
    pub(crate) subresource: &'a str,
    pub(crate) api_version: &'a str,
    pub(crate) now: &'a str,
}

/// Records an ordinary write (create, update, patch): the writer owns what it changed, and
/// nobody keeps fields that are gone.
pub(crate) fn record_update(old: Option<&Value>, new: &mut Value, who: &Writer<'_>) {
    let mut table = old.map(owners).unwrap_or_default();
    let before = old.map(leaves).unwrap_or_default();
    let after = leaves(new);
    let changed: BTreeSet<FieldPath> = after
        .iter()
        .filter(|p| old.and_then(|o| value_at(o, p)) != value_at(new, p))
        .cloned()
        .collect();
    let gone: BTreeSet<FieldPath> = before.difference(&after).cloned().collect();
    for (_, set) in table.values_mut() {
        set.retain(|p| !changed.contains(p) && !gone.contains(p));
    }
    let me = Owner {
        manager: who.manager.into(),
        operation: "Update".into(),
        subresource: who.subresource.into(),
    };
    let entry = table
        .entry(me)
        .or_insert_with(|| (who.api_version.to_string(), BTreeSet::new()));
    entry.0 = who.api_version.to_string();
    entry.1.extend(changed);
    write_owners(new, &table, who.now);
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApplyConflict {
    pub(crate) manager: String,
    pub(crate) field: String,
}

/// Server-side apply of `applied` onto `current` (an empty shell when creating). Without `force`,
/// a field owned by another manager with a different value is a conflict.
pub(crate) fn apply(
    current: &Value,
    applied: &Value,
    force: bool,
    who: &Writer<'_>,
) -> Result<Value, Vec<ApplyConflict>> {
    let mut table = owners(current);
    let wanted = leaves(applied);
    let me = Owner {
        manager: who.manager.into(),
        operation: "Apply".into(),
        subresource: who.subresource.into(),
    };
    let mut conflicts = Vec::new();
    for (owner, (_, set)) in table.iter_mut() {
        if owner.manager == who.manager {
            continue;
        }
        let clashing: Vec<FieldPath> = set
            .iter()
            .filter(|p| wanted.contains(*p) && value_at(current, p) != value_at(applied, p))
            .cloned()
            .collect();
        if force {
            set.retain(|p| !clashing.contains(p));
        } else {
            conflicts.extend(clashing.iter().map(|p| ApplyConflict {
                manager: owner.manager.clone(),
                field: format!(".{}", p.join(".")),
            }));
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let mut merged = current.clone();
    let previously: BTreeSet<FieldPath> = table.get(&me).map(|(_, s)| s.clone()).unwrap_or_default();
    for dropped in previously.difference(&wanted) {
        let shared = table.iter().any(|(o, (_, s))| *o != me && s.contains(dropped));
        if !shared {
            remove_at(&mut merged, dropped);
        }
    }
    deep_merge(&mut merged, applied);
    table.insert(me, (who.api_version.to_string(), wanted));
    write_owners(&mut merged, &table, who.now);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(manager: &str) -> Writer<'_> {
        Writer {
            manager,
            subresource: "",
            api_version: "v1",
            now: "2026-01-01T00:00:00Z",
        }
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

    #[test]
    fn apply_conflicts_with_another_owner_unless_forced() {
        let mut obj = json!({"metadata": {"name": "a"}, "spec": {"port": 1}});
        record_update(None, &mut obj, &who("kubectl"));
        let err = apply(&obj, &json!({"spec": {"port": 2}}), false, &who("op")).unwrap_err();
        assert_eq!(
            err,
            vec![ApplyConflict {
                manager: "kubectl".into(),
                field: ".spec.port".into()
            }]
        );
        // The same value is shared ownership, not a conflict.
        assert!(apply(&obj, &json!({"spec": {"port": 1}}), false, &who("op")).is_ok());
        let forced = apply(&obj, &json!({"spec": {"port": 2}}), true, &who("op")).unwrap();
        assert_eq!(forced["spec"]["port"], 2);
        let managers: Vec<&str> = forced["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, vec!["op"]);
    }

    #[test]
    fn apply_removes_fields_the_manager_stops_applying() {
        let shell = json!({"metadata": {"name": "a"}});
        let first = apply(&shell, &json!({"spec": {"a": 1, "b": 2}}), false, &who("op")).unwrap();
        let second = apply(&first, &json!({"spec": {"a": 1}}), false, &who("op")).unwrap();
        assert_eq!(second["spec"], json!({"a": 1}));
    }

    #[test]
    fn fields_v1_round_trips() {
        let set: BTreeSet<FieldPath> = [
            vec!["spec".to_string(), "port".to_string()],
            vec!["metadata".into(), "labels".into(), "x".into()],
        ]
        .into();
        assert_eq!(from_fields_v1(&fields_v1(&set)), set);
    }
}
