//! The GC mark in a domain's `<metadata>`: an `<instance>` element in the provider's namespace
//! holding `managed`, `uid` and `createdAt`, written inside the define document (so a domain never
//! exists unmarked) and read back with `virDomainGetMetadata`.

use std::time::SystemTime;

use quick_xml::events::Event;

use crate::xml::{Element, XmlError};

/// The kvm provider's metadata namespace (kept for domains the Go operator made).
pub const KVM_NAMESPACE: &str = "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm";
/// The kvm2 provider's metadata namespace.
pub const KVM2_NAMESPACE: &str = "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm2";

/// The mark as read from, or written to, a domain.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Mark {
    /// Whether `managed` is exactly `true`.
    pub managed: bool,
    /// The owning Proxy's UID (trimmed and lowercased when read).
    pub uid: String,
    /// When the domain was defined; `None` when missing or unparsable ("very old" for GC).
    pub created_at: Option<SystemTime>,
    /// The operator installation that made the domain, when it runs with one: an optional
    /// `<installation>` child after the three the Go operator wrote (which ignores it).
    pub installation: Option<String>,
}

impl Mark {
    /// A mark for a domain of Proxy `uid` defined `at`.
    pub fn new(uid: impl Into<String>, at: SystemTime) -> Self {
        Self {
            managed: true,
            uid: uid.into(),
            created_at: Some(at),
            installation: None,
        }
    }

    /// The `<instance xmlns="namespace">` element as it goes inside `<metadata>`.
    pub(crate) fn element(&self, namespace: &str) -> Element {
        self.body(Element::new("instance").attr("xmlns", namespace))
    }

    /// `instance` with the mark's children.
    fn body(&self, instance: Element) -> Element {
        let element = instance
            .child(Element::new("managed").text(if self.managed { "true" } else { "false" }))
            .child(Element::new("uid").text(&self.uid))
            .child(Element::new("createdAt").text(self.created_at.map(rfc3339).unwrap_or_default()));
        match &self.installation {
            Some(installation) => element.child(Element::new("installation").text(installation)),
            None => element,
        }
    }

    /// The element alone, with its namespace declared, as a domain document holds it.
    ///
    /// # Errors
    /// Never in practice (writing to memory).
    pub fn to_xml(&self, namespace: &str) -> Result<String, XmlError> {
        self.element(namespace).to_string_compact()
    }

    /// The element without a namespace declaration, as `virDomainSetMetadata` takes it (the
    /// call names the namespace, and libvirt puts the element and its children in it).
    ///
    /// # Errors
    /// Never in practice (writing to memory).
    pub fn to_metadata_xml(&self) -> Result<String, XmlError> {
        self.body(Element::new("instance")).to_string_compact()
    }

    /// Parses what `virDomainGetMetadata` returns: the `<instance>` element, with a default
    /// namespace, a prefix, or none (libvirt drops the declaration). Children are found by local
    /// name; their text is trimmed, and the UID lowercased, so a padded or re-cased UID still
    /// matches its Proxy.
    ///
    /// # Errors
    /// An empty document, text that is not XML, or a root element other than `instance`.
    pub fn parse(document: &str) -> Result<Self, MarkError> {
        if document.trim().is_empty() {
            return Err(MarkError("empty document".to_owned()));
        }
        let mut reader = quick_xml::Reader::from_str(document);
        // Depth 1 is inside <instance>; the child being read is `current` at depth 2.
        let mut depth = 0usize;
        let mut current: Option<String> = None;
        let mut children = Children::default();
        let local = |name: quick_xml::name::LocalName<'_>| name.into_inner().to_owned();
        let root_is_instance = |name: String| {
            if name == "instance" {
                Ok(())
            } else {
                Err(MarkError(format!("root element is <{name}>, want <instance>")))
            }
        };
        loop {
            match reader.read_event().map_err(|e| MarkError(format!("not XML: {e}")))? {
                Event::Empty(e) if depth == 0 => {
                    root_is_instance(local(e.local_name()))?;
                    break;
                }
                Event::Start(e) => {
                    if depth == 0 {
                        root_is_instance(local(e.local_name()))?;
                    } else if depth == 1 {
                        current = Some(local(e.local_name()));
                    }
                    depth += 1;
                }
                Event::End(_) => {
                    depth = depth.saturating_sub(1);
                    current = None;
                    if depth == 0 {
                        break;
                    }
                }
                Event::Text(t) if depth == 2 => {
                    let raw = t.into_inner();
                    let text = quick_xml::escape::unescape(&raw).map_err(|e| MarkError(format!("not XML: {e}")))?;
                    if let Some(f) = children.field(current.as_deref()) {
                        f.push_str(&text);
                    }
                }
                // An entity reference between text pieces (`&amp;`, `&#x41;`).
                Event::GeneralRef(r) if depth == 2 => {
                    let resolved = match r.resolve_char_ref() {
                        Ok(Some(c)) => c.to_string(),
                        Ok(None) => quick_xml::escape::resolve_predefined_entity(&r.into_inner())
                            .map(str::to_owned)
                            .ok_or_else(|| MarkError("not XML: unknown entity".to_owned()))?,
                        Err(e) => return Err(MarkError(format!("not XML: {e}"))),
                    };
                    if let Some(f) = children.field(current.as_deref()) {
                        f.push_str(&resolved);
                    }
                }
                Event::Eof if depth == 0 => return Err(MarkError("no <instance> element".to_owned())),
                Event::Eof => return Err(MarkError("not XML: the document ends inside an element".to_owned())),
                _ => {}
            }
        }
        let installation = children.installation.trim();
        Ok(Self {
            managed: children.managed.trim() == "true",
            uid: children.uid.trim().to_lowercase(),
            created_at: children
                .created
                .trim()
                .parse::<jiff::Timestamp>()
                .ok()
                .map(SystemTime::from),
            installation: (!installation.is_empty()).then(|| installation.to_owned()),
        })
    }
}

/// The text of the children a mark has.
#[derive(Default)]
struct Children {
    managed: String,
    uid: String,
    created: String,
    installation: String,
}

impl Children {
    /// The string a child's text goes to; `None` for a child the mark does not have.
    fn field(&mut self, child: Option<&str>) -> Option<&mut String> {
        match child {
            Some("managed") => Some(&mut self.managed),
            Some("uid") => Some(&mut self.uid),
            Some("createdAt") => Some(&mut self.created),
            Some("installation") => Some(&mut self.installation),
            _ => None,
        }
    }
}

/// A mark that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("parsing instance metadata: {0}")]
pub struct MarkError(pub String);

/// RFC 3339 in UTC with whole seconds, as marks store it (`2026-09-16T12:00:00Z`).
pub fn rfc3339(at: SystemTime) -> String {
    jiff::Timestamp::try_from(at)
        .ok()
        .and_then(|t| jiff::Timestamp::from_second(t.as_second()).ok())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        SystemTime::from(text.parse::<jiff::Timestamp>().unwrap())
    }

    #[test]
    fn the_element_is_in_the_namespace_with_three_children_in_order() {
        let xml = Mark::new("u-1", at("2026-09-16T12:00:00.750Z"))
            .to_xml(KVM2_NAMESPACE)
            .unwrap();
        assert_eq!(
            xml,
            format!(
                "<instance xmlns=\"{KVM2_NAMESPACE}\"><managed>true</managed><uid>u-1</uid>\
                 <createdAt>2026-09-16T12:00:00Z</createdAt></instance>"
            )
        );
    }

    #[test]
    fn what_libvirt_returns_parses_in_every_namespace_form() {
        let want = Mark::new("u-1", at("2026-09-16T12:00:00Z"));
        for doc in [
            // As libvirt returns it: no declaration, re-indented.
            "<instance>\n  <managed>true</managed>\n  <uid>u-1</uid>\n  <createdAt>2026-09-16T12:00:00Z</createdAt>\n</instance>\n",
            &format!(
                "<instance xmlns=\"{KVM_NAMESPACE}\"><managed>true</managed><uid>u-1</uid><createdAt>2026-09-16T12:00:00Z</createdAt></instance>"
            ),
            &format!(
                "<k:instance xmlns:k=\"{KVM2_NAMESPACE}\"><k:managed>true</k:managed><k:uid>u-1</k:uid><k:createdAt>2026-09-16T12:00:00Z</k:createdAt></k:instance>"
            ),
        ] {
            assert_eq!(Mark::parse(doc), Ok(want.clone()), "{doc}");
        }
    }

    #[test]
    fn children_are_trimmed_and_the_uid_lowercased() {
        let m = Mark::parse("<instance><managed> true </managed><uid>\n  U-ABC \n</uid><createdAt> 2026-09-16T12:00:00Z </createdAt></instance>").unwrap();
        assert_eq!(m, Mark::new("u-abc", at("2026-09-16T12:00:00Z")));
        // Entities are text like any other.
        let m = Mark::parse("<instance><uid>a&amp;b&#x41;</uid><extra>x</extra></instance>").unwrap();
        assert_eq!(m.uid, "a&ba");
        // A UID of whitespace alone is no UID: GC never deletes such an instance.
        let m = Mark::parse("<instance><managed>true</managed><uid> \n\t </uid></instance>").unwrap();
        assert_eq!(m.uid, "");
    }

    #[test]
    fn the_installation_is_an_optional_fourth_child() {
        let mut mark = Mark::new("u-1", at("2026-09-16T12:00:00Z"));
        assert!(!mark.to_xml(KVM2_NAMESPACE).unwrap().contains("installation"));
        mark.installation = Some("prod-eu".into());
        let xml = mark.to_xml(KVM2_NAMESPACE).unwrap();
        assert!(
            xml.ends_with("<installation>prod-eu</installation></instance>"),
            "{xml}"
        );
        assert_eq!(Mark::parse(&xml).unwrap(), mark);
    }

    #[test]
    fn the_metadata_form_has_no_namespace_and_parses_to_the_same_mark() {
        let mut mark = Mark::new("u-1", at("2026-09-16T12:00:00Z"));
        mark.installation = Some("prod-eu".into());
        let xml = mark.to_metadata_xml().unwrap();
        assert!(xml.starts_with("<instance><managed>true</managed>"), "{xml}");
        assert!(!xml.contains("xmlns"), "{xml}");
        assert_eq!(Mark::parse(&xml).unwrap(), mark);
    }

    #[test]
    fn odd_values_mean_unmanaged_or_very_old() {
        let m = Mark::parse("<instance><managed>TRUE</managed><createdAt>yesterday</createdAt></instance>").unwrap();
        assert_eq!(m, Mark::default());
        let m = Mark::parse("<instance><createdAt>2026-09-16</createdAt></instance>").unwrap();
        assert_eq!(m.created_at, None);
        assert_eq!(Mark::parse("<instance/>"), Ok(Mark::default()));
    }

    #[test]
    fn broken_documents_are_refused_with_the_reason() {
        for (doc, why) in [
            ("", "empty document"),
            ("  \n ", "empty document"),
            ("not xml at all", "no <instance> element"),
            ("<vm><uid>u</uid></vm>", "root element is <vm>, want <instance>"),
            ("<instance><uid>u</instance>", "not XML"),
            ("<instance><uid>u</uid>", "not XML"),
        ] {
            let err = Mark::parse(doc).unwrap_err().to_string();
            assert!(
                err.starts_with("parsing instance metadata: ") && err.contains(why),
                "{doc:?}: {err}"
            );
        }
    }
}
