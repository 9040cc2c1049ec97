//! Field ownership (`metadata.managedFields`, FieldsV1) and server-side apply.
//!
//! A field is a path of FieldsV1 elements: `f:<name>` for an object key, `k:{<keys>}` for an
//! item of a list of type `map`, `v:<value>` for an item of a list of type `set`. Lists of any
//! other type are atomic: one field, owned as a whole. Which lists are maps or sets comes from
//! the CRD schema (`x-kubernetes-list-type`), from the metadata rules (finalizers are a set,
//! ownerReferences a map by uid) and, for built-in kinds, from their well-known keyed lists.
//!
//! Server-side apply is one algorithm (field sets, merge, ownership and conflicts) whose parts
//! only make sense together, so they stay in one file; its tests are in `fields/tests.rs`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// A field: the FieldsV1 elements from the root, `["f:spec", "f:port"]`.
pub(crate) type FieldPath = Vec<String>;

/// How a list merges and is owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListType {
    Atomic,
    Set,
    Map(Vec<String>),
}

/// Which part of the object a write may own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The whole object (a kind without a status subresource).
    Everything,
    /// All but `status` (the main resource of a kind with a status subresource).
    NotStatus,
    /// Only `status` (the status subresource).
    OnlyStatus,
}

/// Who writes and by which rules, for `managedFields`.
pub(crate) struct Writer<'a> {
    pub(crate) manager: &'a str,
    pub(crate) subresource: &'a str,
    pub(crate) api_version: String,
    pub(crate) now: &'a str,
    pub(crate) scope: Scope,
    /// The list type at a path (the path of the list itself).
    pub(crate) lists: &'a dyn Fn(&[String]) -> ListType,
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("manager", &self.manager)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Metadata fields a manager can own; the rest of `metadata` belongs to the server.
const OWNABLE_METADATA: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

/// List types that hold whatever the schema says: the metadata rules.
pub(crate) fn metadata_list_type(path: &[String]) -> Option<ListType> {
    match path {
        [m, f] if m == "f:metadata" && f == "f:finalizers" => Some(ListType::Set),
        [m, f] if m == "f:metadata" && f == "f:ownerReferences" => Some(ListType::Map(vec!["uid".into()])),
        _ => None,
    }
}

/// The keyed lists of built-in kinds (they have no schema here), by the list's field name.
pub(crate) fn builtin_list_type(path: &[String]) -> ListType {
    let keys: &[&str] = match path.last().map(String::as_str) {
        Some("f:containers" | "f:initContainers" | "f:ephemeralContainers" | "f:volumes" | "f:env")
        | Some("f:imagePullSecrets") => &["name"],
        Some("f:volumeMounts") => &["mountPath"],
        Some("f:ports") => &["containerPort", "protocol"],
        Some("f:conditions") => &["type"],
        _ => return ListType::Atomic,
    };
    ListType::Map(keys.iter().map(|k| k.to_string()).collect())
}

/// The element naming `item` in a list of this type, or `None` when it cannot be keyed (the
/// list is then treated as atomic).
fn item_element(list_type: &ListType, item: &Value) -> Option<String> {
    match list_type {
        ListType::Atomic => None,
        ListType::Set => Some(format!("v:{item}")),
        ListType::Map(keys) => {
            let mut key = Map::new();
            for k in keys {
                match item.get(k) {
                    Some(v) => key.insert(k.clone(), v.clone()),
                    // Optional key fields (a port's protocol) may be absent.
                    None if keys.len() > 1 => continue,
                    None => return None,
                };
            }
            Some(format!("k:{}", Value::Object(key)))
        }
    }
}

fn keyable(list_type: &ListType, items: &[Value]) -> bool {
    !items.is_empty() && items.iter().all(|i| item_element(list_type, i).is_some())
}

/// The fields an object sets: every path to a scalar, an atomic list, an empty object, a set
/// item or a map item's field.
pub(crate) fn leaves(object: &Value, who: &Writer<'_>) -> BTreeSet<FieldPath> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>, who: &Writer<'_>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    path.push(format!("f:{k}"));
                    walk(child, path, out, who);
                    path.pop();
                }
            }
            Value::Array(items) => {
                let list_type = (who.lists)(path);
                if items.is_empty() && list_type != ListType::Atomic {
                    // An empty granular list sets no item: nothing to own.
                    return;
                }
                if !keyable(&list_type, items) {
                    out.insert(path.clone());
                    return;
                }
                for item in items {
                    let element = item_element(&list_type, item).expect("checked keyable");
                    path.push(element);
                    match list_type {
                        ListType::Set => {
                            out.insert(path.clone());
                        }
                        _ => walk(item, path, out, who),
                    }
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        }
    }
    let mut out = BTreeSet::new();
    let Value::Object(root) = object else { return out };
    for (k, v) in root {
        let in_scope = match (k.as_str(), who.scope) {
            ("apiVersion" | "kind", _) => false,
            ("status", Scope::NotStatus) => false,
            ("status", Scope::OnlyStatus) => true,
            (_, Scope::OnlyStatus) => false,
            _ => true,
        };
        if !in_scope {
            continue;
        }
        if k == "metadata" {
            for field in OWNABLE_METADATA {
                if let Some(child) = v.get(field) {
                    walk(
                        child,
                        &mut vec!["f:metadata".into(), format!("f:{field}")],
                        &mut out,
                        who,
                    );
                }
            }
        } else {
            walk(v, &mut vec![format!("f:{k}")], &mut out, who);
        }
    }
    out
}

/// Whether a list item is the one an element names.
fn item_matches(element: &str, item: &Value) -> bool {
    if let Some(value) = element.strip_prefix("v:") {
        return serde_json::from_str::<Value>(value).is_ok_and(|v| v == *item);
    }
    if let Some(key) = element.strip_prefix("k:") {
        let Ok(Value::Object(key)) = serde_json::from_str::<Value>(key) else {
            return false;
        };
        return key.iter().all(|(k, v)| item.get(k) == Some(v));
    }
    false
}

/// The key field names of a `k:` element (none for other elements).
fn key_names(element: &str) -> Vec<String> {
    match element.strip_prefix("k:").map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Object(key))) => key.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

fn child<'a>(cur: &'a Value, element: &str) -> Option<&'a Value> {
    match element.strip_prefix("f:") {
        Some(name) => cur.get(name),
        None => cur.as_array()?.iter().find(|i| item_matches(element, i)),
    }
}

fn value_at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(object, |cur, e| child(cur, e))
}

/// Removes a field; a map item left with no fields, or a set item, goes from its list.
fn remove_at(object: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    fn go(cur: &mut Value, path: &[String], last: &str) {
        match path.split_first() {
            None => match last.strip_prefix("f:") {
                Some(name) => {
                    if let Value::Object(m) = cur {
                        m.remove(name);
                    }
                }
                None => {
                    if let Value::Array(items) = cur {
                        items.retain(|i| !item_matches(last, i));
                    }
                }
            },
            Some((element, rest)) => {
                let item_keys = key_names(element);
                let next = match element.strip_prefix("f:") {
                    Some(name) => cur.get_mut(name),
                    None => cur
                        .as_array_mut()
                        .and_then(|a| a.iter_mut().find(|i| item_matches(element, i))),
                };
                let Some(next) = next else { return };
                // A map item's key fields stay while the item does: they name it.
                let removing_a_key = rest.is_empty()
                    && last
                        .strip_prefix("f:")
                        .is_some_and(|f| item_keys.iter().any(|k| k == f));
                if !removing_a_key {
                    go(next, rest, last);
                }
                let only_keys_left = next
                    .as_object()
                    .is_some_and(|m| m.keys().all(|k| item_keys.contains(k)));
                if !element.starts_with("f:")
                    && only_keys_left
                    && let Value::Array(items) = cur
                {
                    items.retain(|i| !item_matches(element, i));
                }
            }
        }
    }
    go(object, parents, last);
}

/// Merges an applied configuration: objects merge, map lists merge by key, set lists unite,
/// anything else is replaced.
fn merge_applied(doc: &mut Value, applied: &Value, path: &mut FieldPath, who: &Writer<'_>) {
    match (doc, applied) {
        (Value::Object(d), Value::Object(a)) => {
            for (k, v) in a {
                path.push(format!("f:{k}"));
                match d.get_mut(k) {
                    Some(existing)
                        if (existing.is_object() && v.is_object()) || (existing.is_array() && v.is_array()) =>
                    {
                        merge_applied(existing, v, path, who)
                    }
                    _ => {
                        d.insert(k.clone(), v.clone());
                    }
                }
                path.pop();
            }
        }
        (Value::Array(d), Value::Array(a)) => {
            let list_type = (who.lists)(path);
            let granular = |items: &[Value]| items.is_empty() || keyable(&list_type, items);
            if list_type == ListType::Atomic || !granular(a) || !granular(d) {
                *d = a.clone();
                return;
            }
            for item in a {
                let element = item_element(&list_type, item).expect("checked keyable");
                match d.iter_mut().find(|i| item_matches(&element, i)) {
                    Some(existing) if list_type != ListType::Set => {
                        path.push(element);
                        merge_applied(existing, item, path, who);
                        path.pop();
                    }
                    Some(_) => {}
                    None => d.push(item.clone()),
                }
            }
        }
        (doc, applied) => *doc = applied.clone(),
    }
}

fn fields_v1(set: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for element in path {
            cur = cur
                .entry(element.clone())
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
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.starts_with("f:") || k.starts_with("k:") || k.starts_with("v:"))
                    .collect()
            })
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, child) in children {
            path.push(k.clone());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// A field path as the real server prints it in conflicts: `.spec.port`,
/// `.status.conditions[type="Ready"].status`, `.metadata.finalizers[="a"]`.
fn printable(path: &[String]) -> String {
    let mut out = String::new();
    for element in path {
        if let Some(name) = element.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(value) = element.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        } else if let Some(Ok(Value::Object(key))) = element.strip_prefix("k:").map(serde_json::from_str::<Value>) {
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        }
    }
    out
}

/// One `managedFields` entry, keyed by manager, operation and subresource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Owner {
    manager: String,
    operation: String,
    subresource: String,
    /// Part of an Update owner's identity (a manager writing through two API versions owns
    /// through two entries), as in the API server's manager identifiers; empty for appliers,
    /// whose one entry follows the version they last applied.
    update_api_version: String,
}

impl Owner {
    /// The owner an entry of `managedFields` names.
    fn of_entry(e: &Value) -> Self {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let operation = s("operation");
        let update_api_version = if operation == "Update" {
            s("apiVersion")
        } else {
            String::new()
        };
        Self {
            manager: s("manager"),
            operation,
            subresource: s("subresource"),
            update_api_version,
        }
    }
}

type Table = BTreeMap<Owner, (String, BTreeSet<FieldPath>)>;

fn owners(object: &Value) -> Table {
    let mut out = BTreeMap::new();
    for e in object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let owner = Owner::of_entry(e);
        let fields = e.get("fieldsV1").map(from_fields_v1).unwrap_or_default();
        out.insert(owner, (s("apiVersion"), fields));
    }
    out
}

/// The `time` of each entry as stored.
fn owner_times(object: Option<&Value>) -> BTreeMap<Owner, (BTreeSet<FieldPath>, Value)> {
    let mut out = BTreeMap::new();
    for e in object
        .and_then(|o| o.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let owner = Owner::of_entry(e);
        let fields = e.get("fieldsV1").map(from_fields_v1).unwrap_or_default();
        out.insert(owner, (fields, e.get("time").cloned().unwrap_or(Value::Null)));
    }
    out
}

/// Writes the ownership table. The writer's entry, and any entry whose fields changed, get
/// `now`; the others keep their time, as on the real server.
fn write_owners(object: &mut Value, owners: &Table, now: &str, previous: Option<&Value>, writer: &Owner) {
    let before = owner_times(previous);
    let entries: Vec<Value> = owners
        .iter()
        .filter(|(_, (_, set))| !set.is_empty())
        .map(|(o, (api_version, set))| {
            let time = match before.get(o) {
                Some((old_set, old_time)) if o != writer && old_set == set && !old_time.is_null() => old_time.clone(),
                _ => json!(now),
            };
            let mut e = json!({
                "manager": o.manager, "operation": o.operation, "apiVersion": api_version, "time": time,
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

/// Records an ordinary write (create, update, patch): the writer owns what it changed, and
/// nobody keeps fields that are gone.
pub(crate) fn record_update(old: Option<&Value>, new: &mut Value, who: &Writer<'_>) {
    let mut table = old.map(owners).unwrap_or_default();
    let before = old.map(|o| leaves(o, who)).unwrap_or_default();
    let after = leaves(new, who);
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
        update_api_version: who.api_version.clone(),
    };
    let entry = table
        .entry(me.clone())
        .or_insert_with(|| (who.api_version.to_string(), BTreeSet::new()));
    entry.0 = who.api_version.to_string();
    entry.1.extend(changed);
    write_owners(new, &table, who.now, old, &me);
}

/// Fields other managers own with a different value, grouped by manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApplyConflict {
    pub(crate) manager: String,
    /// `Update` owners are named with their apiVersion in messages.
    pub(crate) operation: String,
    pub(crate) api_version: String,
    pub(crate) field: String,
}

/// The real server's message for apply conflicts.
pub(crate) fn conflict_message(conflicts: &[ApplyConflict]) -> String {
    let who = |c: &ApplyConflict| {
        if c.operation == "Update" {
            format!("\"{}\" using {}", c.manager, c.api_version)
        } else {
            format!("\"{}\"", c.manager)
        }
    };
    if let [only] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            who(only),
            only.field
        );
    }
    let mut by_owner: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_owner.entry(who(c)).or_default().push(&c.field);
    }
    let mut message = format!("Apply failed with {} conflicts:", conflicts.len());
    for (owner, fields) in by_owner {
        message.push_str(&format!("\nconflicts with {owner}:"));
        for f in fields {
            message.push_str(&format!("\n- {f}"));
        }
    }
    message
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
    let wanted = leaves(applied, who);
    let me = Owner {
        manager: who.manager.into(),
        operation: "Apply".into(),
        subresource: who.subresource.into(),
        update_api_version: String::new(),
    };
    let mut conflicts = Vec::new();
    for (owner, (api_version, set)) in table.iter_mut() {
        // A manager's own Apply entry never conflicts with itself; its Update entries do.
        if *owner == me {
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
                operation: owner.operation.clone(),
                api_version: api_version.clone(),
                field: printable(p),
            }));
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let mut merged = current.clone();
    let previously: BTreeSet<FieldPath> = table.get(&me).map(|(_, s)| s.clone()).unwrap_or_default();
    // Deepest first, so a map item is left empty (and removed) only after its fields went.
    let dropped: Vec<&FieldPath> = previously.difference(&wanted).collect();
    for dropped in dropped.into_iter().rev() {
        let shared = table.iter().any(|(o, (_, s))| *o != me && s.contains(dropped));
        if !shared {
            remove_at(&mut merged, dropped);
        }
    }
    let mut in_scope = applied.clone();
    if let Value::Object(m) = &mut in_scope {
        match who.scope {
            Scope::Everything => {}
            Scope::NotStatus => {
                m.remove("status");
            }
            Scope::OnlyStatus => m.retain(|k, _| matches!(k.as_str(), "status" | "apiVersion" | "kind" | "metadata")),
        }
    }
    merge_applied(&mut merged, &in_scope, &mut Vec::new(), who);
    table.insert(me.clone(), (who.api_version.to_string(), wanted));
    write_owners(&mut merged, &table, who.now, Some(current), &me);
    Ok(merged)
}

#[cfg(test)]
mod tests;
