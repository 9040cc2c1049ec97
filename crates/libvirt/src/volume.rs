//! The volume document passed to `virStorageVolCreateXML`: capacity always in bytes (so libvirt's
//! `G` versus `GB` cannot bite), a format, and for an overlay the base volume it is backed by.

use crate::generation::Generation;
use crate::xml::{Element, XmlError};

/// One volume to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    /// The volume name in the pool.
    pub name: String,
    /// Capacity in bytes.
    pub capacity_bytes: i64,
    /// `qcow2` or `raw`.
    pub format: String,
    /// For an overlay: the base volume's path and format.
    pub backing: Option<(String, String)>,
}

/// An input kvm2 refuses (Permanent for the provider).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// A field that cannot work.
    #[error("volume XML: {0}")]
    Invalid(String),
    /// Writing failed.
    #[error(transparent)]
    Xml(#[from] XmlError),
}

impl VolumeSpec {
    /// The document (indented for kvm2, one line for kvm).
    ///
    /// # Errors
    /// kvm2 only: an empty name, a capacity that is not positive, a format (or backing format)
    /// other than qcow2/raw.
    pub fn to_xml(&self, flavour: Generation) -> Result<String, VolumeError> {
        let invalid = |why: String| Err(VolumeError::Invalid(why));
        if flavour == Generation::Kvm2 {
            if self.name.is_empty() {
                return invalid("name is empty".to_owned());
            }
            if self.capacity_bytes <= 0 {
                return invalid(format!("capacity must be positive, got {}", self.capacity_bytes));
            }
            if !matches!(self.format.as_str(), "qcow2" | "raw") {
                return invalid(format!("format must be qcow2 or raw, got {:?}", self.format));
            }
            if let Some((_, format)) = &self.backing
                && !matches!(format.as_str(), "qcow2" | "raw")
            {
                return invalid(format!("backing format must be qcow2 or raw, got {format:?}"));
            }
        }
        let volume = Element::new("volume")
            .attr("type", "file")
            .child(Element::new("name").text(&self.name))
            .child(
                Element::new("capacity")
                    .attr("unit", "bytes")
                    .text(self.capacity_bytes.to_string()),
            )
            .child(Element::new("target").child(Element::new("format").attr("type", &self.format)))
            .child_if(self.backing.as_ref().map(|(path, format)| {
                Element::new("backingStore")
                    .child(Element::new("path").text(path))
                    .child(Element::new("format").attr("type", format))
            }));
        Ok(match flavour {
            Generation::Kvm2 => volume.to_string_pretty()?,
            Generation::Kvm => volume.to_string_compact()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay() -> VolumeSpec {
        VolumeSpec {
            name: "proxy-abc.qcow2".into(),
            capacity_bytes: 10 << 30,
            format: "qcow2".into(),
            backing: Some(("/pool/base-x.qcow2".into(), "qcow2".into())),
        }
    }

    #[test]
    fn an_overlay_names_its_base() {
        let xml = overlay().to_xml(Generation::Kvm2).unwrap();
        assert_eq!(
            xml,
            "<volume type=\"file\">\n  <name>proxy-abc.qcow2</name>\n  <capacity unit=\"bytes\">10737418240</capacity>\n  \
             <target>\n    <format type=\"qcow2\"/>\n  </target>\n  <backingStore>\n    <path>/pool/base-x.qcow2</path>\n    \
             <format type=\"qcow2\"/>\n  </backingStore>\n</volume>\n"
        );
        let seed = VolumeSpec {
            name: "proxy-abc-seed.iso".into(),
            capacity_bytes: 57_344,
            format: "raw".into(),
            backing: None,
        };
        let xml = seed.to_xml(Generation::Kvm).unwrap();
        assert_eq!(xml.lines().count(), 1);
        assert!(!xml.contains("backingStore") && !xml.contains("allocation") && !xml.contains("permissions"));
    }

    #[test]
    fn kvm2_refuses_what_cannot_work_and_kvm_does_not_check() {
        type Edit = dyn Fn(&mut VolumeSpec);
        let cases: [(&Edit, &str); 5] = [
            (&|v| v.name.clear(), "volume XML: name is empty"),
            (
                &|v| v.capacity_bytes = 0,
                "volume XML: capacity must be positive, got 0",
            ),
            (
                &|v| v.format = "vmdk".into(),
                "volume XML: format must be qcow2 or raw, got \"vmdk\"",
            ),
            (
                &|v| v.format.clear(),
                "volume XML: format must be qcow2 or raw, got \"\"",
            ),
            (
                &|v| v.backing = Some(("/b".into(), String::new())),
                "volume XML: backing format must be qcow2 or raw, got \"\"",
            ),
        ];
        for (edit, want) in cases {
            let mut v = overlay();
            edit(&mut v);
            assert_eq!(v.to_xml(Generation::Kvm2).unwrap_err().to_string(), want);
            assert!(v.to_xml(Generation::Kvm).is_ok());
        }
    }
}
