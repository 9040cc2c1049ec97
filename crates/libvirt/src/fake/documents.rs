//! What the fake reads from the documents it is given, refusing what libvirt would refuse: a
//! metadata element, a domain's name and metadata, a volume's name, capacity, format and backing.

use std::collections::BTreeMap;

use quick_xml::events::Event;

use crate::host::{LibvirtError, LvResult, code};

/// A metadata element as `virDomainSetMetadata` takes it: well-formed XML, one root element.
pub(super) fn check_element(element: &str) -> LvResult<()> {
    let invalid = |why: &str| LibvirtError::daemon(code::INVALID_ARG, format!("XML error: {why}"));
    let mut reader = quick_xml::Reader::from_str(element);
    let (mut depth, mut roots) = (0usize, 0usize);
    loop {
        match reader.read_event().map_err(|e| invalid(&e.to_string()))? {
            Event::Start(_) => {
                roots += usize::from(depth == 0);
                depth += 1;
            }
            Event::Empty(_) => roots += usize::from(depth == 0),
            Event::End(_) => depth = depth.saturating_sub(1),
            Event::Text(t) if depth == 0 && !t.trim().is_empty() => {
                return Err(invalid("text outside the element"));
            }
            Event::Eof if depth == 0 && roots == 1 => return Ok(()),
            Event::Eof => return Err(invalid("want exactly one element")),
            _ => {}
        }
    }
}

/// The name and the metadata elements (by namespace) of a domain document.
pub(super) fn read_domain(xml: &str) -> LvResult<(String, BTreeMap<String, String>)> {
    let invalid = |why: String| LibvirtError::daemon(code::INVALID_ARG, format!("XML error: {why}"));
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut name = String::new();
    let mut metadata = BTreeMap::new();
    loop {
        let before = usize::try_from(reader.buffer_position()).unwrap_or(0);
        match reader.read_event().map_err(|e| invalid(e.to_string()))? {
            Event::Start(e) => {
                let local = e.local_name().into_inner().to_owned();
                if path == ["domain", "metadata"] {
                    // The whole element, as written, up to its end tag.
                    let ns = e
                        .attributes()
                        .flatten()
                        .find(|a| a.key.as_ref() == "xmlns" || a.key.as_ref().starts_with("xmlns:"))
                        .map(|a| a.value.to_string())
                        .unwrap_or_default();
                    let end = e.to_end().into_owned();
                    reader.read_to_end(end.name()).map_err(|e| invalid(e.to_string()))?;
                    let after = usize::try_from(reader.buffer_position()).unwrap_or(0);
                    metadata.insert(ns, xml[before..after].trim().to_owned());
                    continue;
                }
                path.push(local);
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Text(t) if path == ["domain", "name"] => {
                name.push_str(&t.into_inner());
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if name.trim().is_empty() {
        return Err(invalid("missing domain name".to_owned()));
    }
    Ok((name.trim().to_owned(), metadata))
}

/// The `type` attribute of an element.
fn type_of(e: &quick_xml::events::BytesStart<'_>) -> String {
    e.attributes()
        .flatten()
        .find(|a| a.key.as_ref() == "type")
        .map(|a| a.value.to_string())
        .unwrap_or_default()
}

/// Name, capacity, format and backing path of a volume document.
pub(super) fn read_volume(xml: &str) -> LvResult<(String, u64, String, Option<String>)> {
    let invalid = |why: String| LibvirtError::daemon(code::INVALID_ARG, format!("XML error: {why}"));
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let (mut name, mut capacity, mut format, mut backing) = (String::new(), String::new(), String::new(), None);
    loop {
        match reader.read_event().map_err(|e| invalid(e.to_string()))? {
            // `<format type="qcow2"/>`, or `<format type="qcow2"></format>` as Go's encoder wrote it.
            Event::Empty(e) if e.local_name().into_inner() == "format" && path == ["volume", "target"] => {
                format = type_of(&e);
            }
            Event::Start(e) if e.local_name().into_inner() == "format" && path == ["volume", "target"] => {
                format = type_of(&e);
                path.push("format".to_owned());
            }
            Event::Start(e) => path.push(e.local_name().into_inner().to_owned()),
            Event::End(_) => {
                path.pop();
            }
            Event::Text(t) => {
                let text = t.into_inner().into_owned();
                match path.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                    ["volume", "name"] => name.push_str(&text),
                    ["volume", "capacity"] => capacity.push_str(&text),
                    ["volume", "backingStore", "path"] => backing = Some(text),
                    _ => {}
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    let capacity = capacity
        .trim()
        .parse()
        .map_err(|_| invalid(format!("capacity {capacity:?}")))?;
    if name.is_empty() {
        return Err(invalid("missing volume name".to_owned()));
    }
    Ok((
        name,
        capacity,
        if format.is_empty() { "raw".to_owned() } else { format },
        backing,
    ))
}
