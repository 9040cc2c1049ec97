//! Label and field selectors, parsed as the API server parses them and matched against objects.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::views::SelectableField;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<Requirement>);

/// Splits on commas that are not inside parentheses.
fn split_top(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(_, n)| n);
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn valid_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

fn set_values(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    values.iter().all(|v| valid_value(v)).then_some(values)
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`. The error is the server's message.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        let text = text.trim();
        if text.is_empty() {
            return Ok(Self(reqs));
        }
        let bad = |why: &str| format!("unable to parse requirement: {why}");
        for part in split_top(text) {
            let part = part.trim();
            let req = if let Some(key) = part.strip_prefix('!') {
                Requirement::DoesNotExist(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Requirement::NotIn(
                    k.trim().into(),
                    set_values(v).ok_or_else(|| bad("values must be a list in parentheses"))?,
                )
            } else if let Some((k, v)) = part.split_once(" in ") {
                Requirement::In(
                    k.trim().into(),
                    set_values(v).ok_or_else(|| bad("values must be a list in parentheses"))?,
                )
            } else {
                Requirement::Exists(part.to_string())
            };
            let (key, value) = match &req {
                Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, Some(v)),
                Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::DoesNotExist(k) => (k, None),
            };
            if !valid_key(key) {
                return Err(bad(&format!("invalid label key \"{key}\"")));
            }
            if let Some(v) = value
                && !valid_value(v)
            {
                return Err(bad(&format!("invalid label value: \"{v}\"")));
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

/// The labels of an object, as a map.
pub(crate) fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A field selector: `metadata.name` and `metadata.namespace` (which every resource supports)
/// and the labels a resource adds, each term read from the stored object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<FieldTerm>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    /// The stored fields the label reads, the first set one winning.
    pointers: &'static [&'static str],
    unset: &'static str,
    equal: bool,
    value: String,
}

impl FieldSelector {
    /// Parses `text`; `supported` lists the resource's own labels. Any other label is refused,
    /// as the API server refuses it.
    pub(crate) fn parse(text: &str, supported: &[SelectableField]) -> Result<Self, String> {
        const NAME: &[&str] = &["/metadata/name"];
        const NAMESPACE: &[&str] = &["/metadata/namespace"];
        let mut terms = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!("invalid selector: '{text}'; can't understand '{part}'"));
            };
            let field = field.trim();
            let (pointers, unset) = match field {
                "metadata.name" => (NAME, ""),
                "metadata.namespace" => (NAMESPACE, ""),
                other => supported
                    .iter()
                    .find(|f| f.label == other)
                    .map(|f| (f.pointers, f.unset))
                    .ok_or_else(|| format!("field label not supported: {field}"))?,
            };
            terms.push(FieldTerm {
                pointers,
                unset,
                equal,
                value: value.trim().to_string(),
            });
        }
        Ok(Self(terms))
    }

    /// Whether the stored object is selected. A term's value is its first stored field that is
    /// set (numbers and booleans as their text, as the API server's field sets hold them), else
    /// the label's unset value.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|term| {
            let actual = term
                .pointers
                .iter()
                .find_map(|p| match object.pointer(p) {
                    Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
                    Some(Value::Null | Value::String(_)) | None => None,
                    Some(other) => Some(other.to_string()),
                })
                .unwrap_or_else(|| term.unset.to_owned());
            (actual == term.value) == term.equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_operator() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("example.com/zone", "a")]);
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "tier in (front, back)",
            "tier notin (back)",
            "app",
            "!missing",
            "example.com/zone=a,app",
            "missing notin (x)",
            "",
        ];
        let no = [
            "app=db",
            "app!=web",
            "tier in (back)",
            "tier notin (front)",
            "missing",
            "!app",
            "app=web,missing",
            "missing in (x)",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&l), "{s} should match");
        }
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&l), "{s} should not match");
        }
    }

    #[test]
    fn malformed_selectors_are_refused() {
        for s in ["app in web", "=x", "a b=c", "app=-bad", "tier in (a,-b)"] {
            assert!(LabelSelector::parse(s).is_err(), "{s} should be refused");
        }
        assert_eq!(
            FieldSelector::parse("spec.x=1", &[]).unwrap_err(),
            "field label not supported: spec.x"
        );
        assert!(FieldSelector::parse("metadata.name", &[]).is_err());
    }

    #[test]
    fn field_selectors() {
        let o = serde_json::json!({"metadata": {"name": "a", "namespace": "n"}});
        assert!(
            FieldSelector::parse("metadata.name=a,metadata.namespace==n", &[])
                .unwrap()
                .matches(&o)
        );
        assert!(!FieldSelector::parse("metadata.name!=a", &[]).unwrap().matches(&o));
    }

    #[test]
    fn a_resource_s_own_labels_read_their_stored_fields() {
        let fields = crate::views::selectable_fields("", "events");
        let e = serde_json::json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Proxy", "name": "p", "uid": "u1"}, "count": 3});
        let s = FieldSelector::parse(
            "involvedObject.kind=Proxy,involvedObject.name=p,involvedObject.uid=u1",
            fields,
        )
        .unwrap();
        assert!(s.matches(&e));
        let s = FieldSelector::parse("involvedObject.name=q", fields).unwrap();
        assert!(!s.matches(&e));
        // A label of the other Events API is not this one's.
        assert_eq!(
            FieldSelector::parse("regarding.name=p", fields).unwrap_err(),
            "field label not supported: regarding.name"
        );
        let v1 = crate::views::selectable_fields("events.k8s.io", "events");
        assert!(FieldSelector::parse("regarding.name=p", v1).unwrap().matches(&e));
        // A field the object lacks reads as empty.
        assert!(
            FieldSelector::parse("involvedObject.namespace=", fields)
                .unwrap()
                .matches(&e)
        );
    }
}
