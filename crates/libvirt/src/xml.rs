//! A small element tree written through quick-xml, so every name, attribute and text is escaped
//! by a serializer and never pasted into markup.

use quick_xml::Writer;
use quick_xml::events::{BytesEnd, BytesStart, BytesText, Event};

/// Writing XML failed (in memory, so only on a writer bug).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("writing XML: {0}")]
pub struct XmlError(pub String);

/// One element: a name, attributes in order, optional text, then children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Element {
    name: String,
    attributes: Vec<(String, String)>,
    text: Option<String>,
    children: Vec<Element>,
}

impl Element {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            attributes: Vec::new(),
            text: None,
            children: Vec::new(),
        }
    }

    pub(crate) fn attr(mut self, key: &str, value: impl Into<String>) -> Self {
        self.attributes.push((key.to_owned(), value.into()));
        self
    }

    pub(crate) fn text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    pub(crate) fn child(mut self, child: Element) -> Self {
        self.children.push(child);
        self
    }

    /// Adds `child` when it is `Some`.
    pub(crate) fn child_if(self, child: Option<Element>) -> Self {
        match child {
            Some(c) => self.child(c),
            None => self,
        }
    }

    fn write<W: std::io::Write>(&self, w: &mut Writer<W>) -> Result<(), XmlError> {
        let fail = |e: std::io::Error| XmlError(e.to_string());
        let mut start = BytesStart::new(self.name.as_str());
        for (k, v) in &self.attributes {
            start.push_attribute((k.as_str(), v.as_str()));
        }
        if self.text.is_none() && self.children.is_empty() {
            return w.write_event(Event::Empty(start)).map_err(fail);
        }
        w.write_event(Event::Start(start)).map_err(fail)?;
        if let Some(text) = &self.text {
            w.write_event(Event::Text(BytesText::new(text))).map_err(fail)?;
        }
        for c in &self.children {
            c.write(w)?;
        }
        w.write_event(Event::End(BytesEnd::new(self.name.as_str())))
            .map_err(fail)
    }

    /// Indented by two spaces, one element per line, with a final newline.
    pub(crate) fn to_string_pretty(&self) -> Result<String, XmlError> {
        let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
        self.write(&mut w)?;
        let mut text = String::from_utf8(w.into_inner()).map_err(|e| XmlError(e.to_string()))?;
        text.push('\n');
        Ok(text)
    }

    /// On one line.
    pub(crate) fn to_string_compact(&self) -> Result<String, XmlError> {
        let mut w = Writer::new(Vec::new());
        self.write(&mut w)?;
        String::from_utf8(w.into_inner()).map_err(|e| XmlError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_attributes_are_escaped() {
        let e = Element::new("a")
            .attr("x", "1\"<&>'")
            .child(Element::new("b").text("</b><evil attr='x'>&amp;"))
            .child(Element::new("c"));
        let compact = e.to_string_compact().unwrap();
        assert!(!compact.contains("<evil"), "{compact}");
        assert!(compact.starts_with("<a x=\"1&quot;&lt;&amp;&gt;&apos;\">"), "{compact}");
        assert!(compact.ends_with("<c/></a>"), "{compact}");
        let pretty = e.to_string_pretty().unwrap();
        assert_eq!(pretty.lines().count(), 4, "{pretty}");
        assert!(pretty.lines().nth(1).unwrap().starts_with("  <b>"), "{pretty}");
    }
}
