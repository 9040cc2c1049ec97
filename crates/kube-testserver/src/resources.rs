//! The kinds the server serves: the built-in ones it knows and custom ones read from a
//! CustomResourceDefinition.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::schema::Schema;
use crate::views::{SelectableField, View, selectable_fields};

/// Where objects of one resource live, whatever version they are read in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StoreKey {
    pub(crate) group: String,
    pub(crate) plural: String,
}

/// A column `kubectl get` prints, from a CRD's `additionalPrinterColumns`.
#[derive(Debug, Clone)]
pub(crate) struct PrinterColumn {
    pub(crate) name: String,
    pub(crate) type_: String,
    pub(crate) format: String,
    pub(crate) description: String,
    pub(crate) json_path: String,
    pub(crate) priority: i64,
}

/// One served (group, version, resource).
#[derive(Debug, Clone)]
pub(crate) struct ResourceType {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) kind: String,
    pub(crate) list_kind: String,
    pub(crate) plural: String,
    pub(crate) singular: String,
    pub(crate) short_names: Vec<String>,
    pub(crate) categories: Vec<String>,
    pub(crate) namespaced: bool,
    pub(crate) status_subresource: bool,
    /// The scale subresource's paths, when the CRD declares one.
    pub(crate) scale: Option<crate::scale::ScalePaths>,
    /// A custom resource: strategic merge patch is refused, as the real server refuses it.
    pub(crate) custom: bool,
    /// Delete answers with the object rather than a `Status` (pods do this).
    pub(crate) returns_deleted_object: bool,
    /// Names must be DNS-1123 labels rather than subdomains (namespaces).
    pub(crate) label_names: bool,
    pub(crate) schema: Option<Arc<Schema>>,
    pub(crate) printer_columns: Vec<PrinterColumn>,
    /// How this version shows the stored objects.
    pub(crate) view: View,
    /// The store of another resource this one serves (events.k8s.io Events are core Events).
    pub(crate) shares_store_of: Option<StoreKey>,
    /// Field selector labels beyond `metadata.name` and `metadata.namespace`.
    pub(crate) selectable_fields: &'static [SelectableField],
}

impl ResourceType {
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Where its objects are kept.
    pub(crate) fn key(&self) -> StoreKey {
        self.shares_store_of.clone().unwrap_or_else(|| StoreKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        })
    }

    /// A stored object as this version shows it, with its apiVersion and kind.
    pub(crate) fn show(&self, stored: &Value) -> Value {
        let mut o = self.view.show(stored);
        o["apiVersion"] = Value::String(self.api_version());
        o["kind"] = Value::String(self.kind.clone());
        o
    }
    /// A PUT without a resourceVersion is allowed for built-in kinds; custom resources and CRDs
    /// require one (their strategies refuse unconditional updates).
    pub(crate) fn allows_unconditional_update(&self) -> bool {
        !self.custom && self.group != "apiextensions.k8s.io"
    }

    /// `proxies.crawl.example.com` or `pods`.
    pub(crate) fn qualified(&self) -> String {
        crate::status::qualified(&self.group, &self.plural)
    }

    fn builtin(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            short_names: Vec::new(),
            categories: Vec::new(),
            namespaced,
            status_subresource: false,
            scale: None,
            custom: false,
            returns_deleted_object: false,
            label_names: false,
            schema: None,
            printer_columns: Vec::new(),
            view: View::Stored,
            shares_store_of: None,
            selectable_fields: selectable_fields(group, plural),
        }
    }
}

/// The built-in kinds this server serves.
pub(crate) fn builtins() -> Vec<ResourceType> {
    let mut pods = ResourceType::builtin("", "v1", "Pod", "pods", true);
    pods.status_subresource = true;
    pods.returns_deleted_object = true;
    pods.short_names = vec!["po".into()];
    pods.categories = vec!["all".into()];
    let secrets = ResourceType::builtin("", "v1", "Secret", "secrets", true);
    let mut config_maps = ResourceType::builtin("", "v1", "ConfigMap", "configmaps", true);
    config_maps.short_names = vec!["cm".into()];
    let mut namespaces = ResourceType::builtin("", "v1", "Namespace", "namespaces", false);
    namespaces.status_subresource = true;
    namespaces.short_names = vec!["ns".into()];
    namespaces.label_names = true;
    let mut core_events = ResourceType::builtin("", "v1", "Event", "events", true);
    core_events.short_names = vec!["ev".into()];
    // One set of Events, served through both APIs as a real server serves them.
    let mut events = ResourceType::builtin("events.k8s.io", "v1", "Event", "events", true);
    events.short_names = vec!["ev".into()];
    events.view = View::EventsV1;
    events.shares_store_of = Some(core_events.key());
    let leases = ResourceType::builtin("coordination.k8s.io", "v1", "Lease", "leases", true);
    let crds = ResourceType::builtin(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    );
    let mut crds = crds;
    crds.status_subresource = true;
    crds.short_names = vec!["crd".into(), "crds".into()];
    vec![
        pods,
        secrets,
        config_maps,
        namespaces,
        core_events,
        events,
        leases,
        crds,
    ]
}

/// How Kubernetes ranks versions: GA above beta above alpha, then higher numbers first;
/// names that do not look like versions rank last.
fn version_priority(version: &str) -> (u8, u64, u64) {
    let Some(rest) = version.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Ok(major) = digits.parse::<u64>() else {
        return (0, 0, 0);
    };
    let tail = &rest[digits.len()..];
    let (tier, minor) = if tail.is_empty() {
        (3, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n.parse().unwrap_or(0))
    } else {
        return (0, 0, 0);
    };
    (tier, major, minor)
}

/// A CRD the server cannot serve, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct CrdError(pub(crate) String);

fn text<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn strings(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// The resource types one CustomResourceDefinition (as JSON) defines: one per served version.
pub(crate) fn from_crd(crd: &Value) -> Result<Vec<ResourceType>, CrdError> {
    let missing = |what: &str| CrdError(format!("spec.{what}: Required value"));
    let group = text(crd, "/spec/group").ok_or_else(|| missing("group"))?;
    let plural = text(crd, "/spec/names/plural").ok_or_else(|| missing("names.plural"))?;
    let kind = text(crd, "/spec/names/kind").ok_or_else(|| missing("names.kind"))?;
    let expected = format!("{plural}.{group}");
    let name = text(crd, "/metadata/name").unwrap_or_default();
    if name != expected {
        return Err(CrdError(format!(
            "metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"
        )));
    }
    let namespaced = match text(crd, "/spec/scope") {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        _ => {
            return Err(CrdError(
                "spec.scope: Unsupported value: must be Namespaced or Cluster".into(),
            ));
        }
    };
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .ok_or_else(|| missing("versions"))?;
    let mut out = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let version = text(v, "/name").ok_or_else(|| missing("versions[].name"))?;
        let schema = match v.pointer("/schema/openAPIV3Schema") {
            Some(s) => Some(Arc::new(Schema::compile(s).map_err(|e| {
                CrdError(format!(
                    "spec.versions[{version}].schema.openAPIV3Schema: Invalid value: {e}"
                ))
            })?)),
            None => None,
        };
        let printer_columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: text(c, "/name").unwrap_or_default().into(),
                        type_: text(c, "/type").unwrap_or("string").into(),
                        format: text(c, "/format").unwrap_or_default().into(),
                        description: text(c, "/description").unwrap_or_default().into(),
                        json_path: text(c, "/jsonPath").unwrap_or_default().into(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ResourceType {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            list_kind: text(crd, "/spec/names/listKind")
                .map(str::to_string)
                .unwrap_or_else(|| format!("{kind}List")),
            plural: plural.into(),
            singular: text(crd, "/spec/names/singular")
                .map(str::to_string)
                .unwrap_or_else(|| kind.to_lowercase()),
            short_names: strings(crd, "/spec/names/shortNames"),
            categories: strings(crd, "/spec/names/categories"),
            namespaced,
            status_subresource: v.pointer("/subresources/status").is_some(),
            scale: crate::scale::ScalePaths::of(v),
            custom: true,
            returns_deleted_object: false,
            label_names: false,
            schema,
            printer_columns,
            view: View::Stored,
            shares_store_of: None,
            selectable_fields: &[],
        });
    }
    if out.is_empty() {
        return Err(CrdError(
            "spec.versions: Invalid value: must have at least one served version".into(),
        ));
    }
    Ok(out)
}

/// Every served resource, by group, version and plural.
#[derive(Debug, Clone, Default)]
pub(crate) struct Types {
    by_path: BTreeMap<(String, String, String), ResourceType>,
    /// Which CRD (by name) registered which entries, so deleting it unregisters them.
    by_crd: BTreeMap<String, Vec<(String, String, String)>>,
}

impl Types {
    pub(crate) fn with_builtins() -> Self {
        let mut types = Self::default();
        for t in builtins() {
            types.insert(t);
        }
        types
    }

    fn insert(&mut self, t: ResourceType) -> (String, String, String) {
        let key = (t.group.clone(), t.version.clone(), t.plural.clone());
        self.by_path.insert(key.clone(), t);
        key
    }

    pub(crate) fn register_crd(&mut self, crd_name: &str, types: Vec<ResourceType>) {
        self.unregister_crd(crd_name);
        let keys = types.into_iter().map(|t| self.insert(t)).collect();
        self.by_crd.insert(crd_name.to_string(), keys);
    }

    pub(crate) fn unregister_crd(&mut self, crd_name: &str) {
        for key in self.by_crd.remove(crd_name).unwrap_or_default() {
            self.by_path.remove(&key);
        }
    }

    pub(crate) fn get(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.by_path
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &ResourceType> {
        self.by_path.values()
    }
    /// Versions served per group (groups sorted, core first), each group's versions in
    /// Kubernetes priority order, so the first is the preferred one.
    pub(crate) fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (g, v, _) in self.by_path.keys() {
            let versions = groups.entry(g.clone()).or_default();
            if !versions.contains(v) {
                versions.push(v.clone());
            }
        }
        for versions in groups.values_mut() {
            versions.sort_by(|a, b| version_priority(b).cmp(&version_priority(a)).then_with(|| a.cmp(b)));
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_rank_as_kubernetes_ranks_them() {
        let mut v = vec!["v1alpha1", "v1", "v2beta1", "v1beta2", "v2", "foo", "v1beta1", "v10"];
        v.sort_by(|a, b| version_priority(b).cmp(&version_priority(a)).then_with(|| a.cmp(b)));
        assert_eq!(
            v,
            vec!["v10", "v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }
}
