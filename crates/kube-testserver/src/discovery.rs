//! What clients read before they talk to a resource: `/version`, the discovery documents, the
//! OpenAPI v3 index kubectl consults (for `fieldValidation` support and patch types), and the
//! `Table` form `kubectl get` asks for.

use serde_json::{Value, json};

use crate::resources::{ResourceType, Types};

pub(crate) const SERVER_VERSION: (&str, &str) = ("1", "33");

pub(crate) fn version() -> Value {
    json!({
        "major": SERVER_VERSION.0, "minor": SERVER_VERSION.1,
        "gitVersion": format!("v{}.{}.0-egress-kube-testserver", SERVER_VERSION.0, SERVER_VERSION.1),
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "none (egress-kube-testserver, Rust)", "compiler": "rustc", "platform": "linux/amd64",
    })
}

pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
}

pub(crate) fn group_list(types: &Types) -> Value {
    let groups: Vec<Value> = types
        .groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(crate) fn group(types: &Types, name: &str) -> Option<Value> {
    let groups = types.groups();
    let versions = groups.get(name).filter(|_| !name.is_empty())?;
    let mut g = group_json(name, versions);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub(crate) fn resource_list(types: &Types, group: &str, version: &str) -> Option<Value> {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    for rt in types.all().filter(|t| t.group == group && t.version == version) {
        resources.push(json!({
            "name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced, "kind": rt.kind,
            "verbs": VERBS, "shortNames": rt.short_names, "categories": rt.categories,
        }));
        if rt.status_subresource {
            resources.push(json!({"name": format!("{}/status", rt.plural), "singularName": "",
                "namespaced": rt.namespaced, "kind": rt.kind, "verbs": ["get", "patch", "update"]}));
        }
        if rt.scale.is_some() {
            resources.push(json!({"name": format!("{}/scale", rt.plural), "singularName": "",
                "namespaced": rt.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale",
                "verbs": ["get", "patch", "update"]}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

/// The OpenAPI v3 index: one document per group-version.
pub(crate) fn openapi_v3_root(types: &Types) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, versions) in types.groups() {
        for v in versions {
            let key = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            paths.insert(key.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{key}")}));
        }
    }
    json!({"paths": paths})
}

/// One group-version's OpenAPI v3 document: the item paths with their PATCH operation (the
/// media types it takes and its `fieldValidation` parameter) and each kind's identity.
pub(crate) fn openapi_v3_group_version(types: &Types, group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut any = false;
    for rt in types.all().filter(|t| t.group == group && t.version == version) {
        any = true;
        let item = if rt.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
        } else {
            format!("{prefix}/{}/{{name}}", rt.plural)
        };
        // Strategic merge is accepted for built-in kinds but not advertised: this server has no
        // field schemas for them, and kubectl then computes the patch from its compiled-in types.
        let media = [
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ];
        let content: serde_json::Map<String, Value> = media
            .iter()
            .map(|m| (m.to_string(), json!({"schema": {"type": "object"}})))
            .collect();
        let gvk = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
        let params: Vec<Value> = ["dryRun", "fieldManager", "fieldValidation", "force"]
            .iter()
            .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
            .collect();
        paths.insert(
            item,
            json!({"patch": {
                "operationId": format!("patch{}", rt.kind),
                "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "patch",
                "parameters": params, "requestBody": {"content": content, "required": true},
                "responses": {"200": {"description": "OK"}},
            }}),
        );
        let schema_name = format!("{}.{}.{}", reverse_domain(&rt.group), rt.version, rt.kind);
        // Only the kind's identity is published, not its field schema: kubectl needs the former
        // (to find the PATCH operation) and leaves field checks to the server.
        let mut schema = json!({"type": "object"});
        schema["x-kubernetes-group-version-kind"] = json!([gvk]);
        schemas.insert(schema_name, schema);
    }
    any.then(|| {
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": paths, "components": {"schemas": schemas}})
    })
}

fn reverse_domain(group: &str) -> String {
    if group.is_empty() {
        "io.k8s.api.core".into()
    } else {
        group.split('.').rev().collect::<Vec<_>>().join(".")
    }
}

/// The value at a printer column's JSONPath: fields (`.status.phase`), indexes
/// (`.spec.hosts[0]`) and equality filters (`.status.conditions[?(@.type=="Ready")].status`),
/// the forms CRDs use. A filter picks the first matching item.
fn json_path<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    let mut cur = object;
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            if end > 0 {
                cur = cur.get(&after[..end])?;
            }
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            let inner = &after[..end];
            cur = match inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                Some(filter) => {
                    let (field, wanted) = filter.split_once("==")?;
                    let wanted = wanted.trim().trim_matches(|c| c == '"' || c == '\'');
                    cur.as_array()?
                        .iter()
                        .find(|item| item.get(field.trim()).and_then(Value::as_str) == Some(wanted))?
                }
                None => cur.get(inner.trim().parse::<usize>().ok()?)?,
            };
            rest = &after[end + 1..];
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            cur = cur.get(&rest[..end])?;
            rest = &rest[end..];
        }
    }
    Some(cur)
}

/// `meta.k8s.io/v1 Table` for a list of objects, with the kind's printer columns.
pub(crate) fn table(rt: &ResourceType, items: &[Value], resource_version: &str) -> Value {
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."}),
    ];
    let mut paths = Vec::new();
    let printer = if rt.printer_columns.is_empty() {
        vec![crate::resources::PrinterColumn {
            name: "Age".into(),
            type_: "date".into(),
            format: String::new(),
            description: "Time since the object was created.".into(),
            json_path: ".metadata.creationTimestamp".into(),
            priority: 0,
        }]
    } else {
        rt.printer_columns.clone()
    };
    for c in &printer {
        columns.push(
            json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description,
            "priority": c.priority}),
        );
        paths.push(c.json_path.clone());
    }
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut cells = vec![o.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
            cells.extend(printer.iter().zip(&paths).map(|(c, p)| {
                let value = json_path(o, p).cloned().unwrap_or(Value::Null);
                match (
                    c.type_.as_str(),
                    value.as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()),
                ) {
                    ("date", Some(t)) => json!(human_age(jiff::Timestamp::now().duration_since(t).as_secs())),
                    _ => value,
                }
            }));
            let metadata = o.get("metadata").cloned().unwrap_or(json!({}));
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns, "rows": rows})
}

/// An age as `kubectl get` shows it (`45s`, `3m12s`, `5h`, `2d3h`), the server's rounding rules.
pub(crate) fn human_age(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    let (m, h, d, y) = (s / 60, s / 3600, s / 86_400, s / (86_400 * 365));
    match s {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => {
            if s % 60 == 0 {
                format!("{m}m")
            } else {
                format!("{m}m{}s", s % 60)
            }
        }
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => {
            if m % 60 == 0 {
                format!("{h}h")
            } else {
                format!("{h}h{}m", m % 60)
            }
        }
        _ if h < 48 => format!("{h}h"),
        _ if h < 24 * 8 => {
            if h % 24 == 0 {
                format!("{d}d")
            } else {
                format!("{d}d{}h", h % 24)
            }
        }
        _ if y < 2 => format!("{d}d"),
        _ if y < 8 => {
            if d % 365 == 0 {
                format!("{y}y")
            } else {
                format!("{y}y{}d", d % 365)
            }
        }
        _ => format!("{y}y"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(human_age(0), "0s");
        assert_eq!(human_age(119), "119s");
        assert_eq!(human_age(192), "3m12s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(4 * 3600 + 60), "4h1m");
        assert_eq!(human_age(30 * 3600), "30h");
        assert_eq!(human_age(3 * 86_400 + 3600), "3d1h");
        assert_eq!(human_age(-5), "<invalid>");
    }

    #[test]
    fn json_paths() {
        let o = json!({"status": {"phase": "Ready", "hosts": ["a", "b"]}});
        assert_eq!(json_path(&o, ".status.phase"), Some(&json!("Ready")));
        assert_eq!(json_path(&o, ".status.hosts[1]"), Some(&json!("b")));
        assert_eq!(json_path(&o, ".status.none"), None);
        let c = json!({"status": {"conditions": [{"type": "Provisioned", "status": "True"},
            {"type": "Healthy", "status": "False"}]}});
        assert_eq!(
            json_path(&c, r#".status.conditions[?(@.type=="Healthy")].status"#),
            Some(&json!("False"))
        );
        assert_eq!(
            json_path(&c, ".status.conditions[?(@.type=='Provisioned')].status"),
            Some(&json!("True"))
        );
        assert_eq!(json_path(&c, r#".status.conditions[?(@.type=="Gone")].status"#), None);
        assert_eq!(json_path(&c, ".status.conditions[9]"), None);
        assert_eq!(
            json_path(&c, ".status.conditions[?(@.type"),
            None,
            "a broken filter is no value, not a panic"
        );
    }
}
