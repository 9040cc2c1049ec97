//! The domain document passed to `virDomainDefineXML`, for both libvirt providers.
//!
//! kvm2 writes it indented and validates its inputs; kvm (the first generation, kept for domains
//! the Go operator made) writes it on one line, in its own element order, with a UTC clock and
//! `<boot dev="hd"/>`, and treats any firmware but `uefi` as BIOS. Both write the disks as
//! `type="file"` with the volumes' paths (never `type="volume"`: AppArmor only lets QEMU open
//! sources that carry a path), a bridge NIC, a serial console, the guest-agent channel and a
//! virtio RNG, and the GC mark inside `<metadata>`.

use crate::generation::Generation;
use crate::mark::Mark;
use crate::xml::{Element, XmlError};

/// Everything a domain is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainSpec {
    /// The domain name (`name_from_uid`).
    pub name: String,
    /// Memory in MiB, from the machine type.
    pub memory_mib: i64,
    /// Virtual CPUs, from the machine type.
    pub vcpus: i32,
    /// The GC mark.
    pub mark: Mark,
    /// `uefi` or `bios` (kvm2 refuses anything else; kvm reads anything but `uefi` as BIOS).
    pub firmware: String,
    /// `kvm`, or `qemu` for software emulation where KVM is missing.
    pub domain_type: String,
    /// The CPU mode (`host-passthrough`...), or none (QEMU's default model).
    pub cpu_mode: Option<String>,
    /// Path of the overlay volume.
    pub disk_path: String,
    /// Format of the overlay (`qcow2` or `raw`; empty means qcow2).
    pub disk_format: String,
    /// Path of the seed ISO volume.
    pub seed_path: String,
    /// The bridge the NIC attaches to.
    pub bridge: String,
    /// The NIC's MAC address; `None` lets libvirt choose one.
    pub mac: Option<String>,
}

/// An input kvm2 refuses (Permanent for the provider).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    /// A field that cannot work.
    #[error("domain XML: {0}")]
    Invalid(String),
    /// Writing failed.
    #[error(transparent)]
    Xml(#[from] XmlError),
}

impl DomainSpec {
    /// The document for `flavour`.
    ///
    /// # Errors
    /// kvm2 only: an empty name, disk path or seed path; a disk format other than qcow2/raw; a
    /// firmware other than exactly `uefi` or `bios`.
    pub fn to_xml(&self, flavour: Generation) -> Result<String, DomainError> {
        let invalid = |why: String| Err(DomainError::Invalid(why));
        let disk_format = if self.disk_format.is_empty() {
            "qcow2"
        } else {
            self.disk_format.as_str()
        };
        if flavour == Generation::Kvm2 {
            if self.name.is_empty() {
                return invalid("name is empty".to_owned());
            }
            if self.disk_path.is_empty() {
                return invalid("disk path is empty".to_owned());
            }
            if self.seed_path.is_empty() {
                return invalid("seed path is empty".to_owned());
            }
            // Review L11.
            if self.vcpus <= 0 {
                return invalid(format!("vcpus must be positive, got {}", self.vcpus));
            }
            if self.memory_mib <= 0 {
                return invalid(format!("memory must be positive, got {} MiB", self.memory_mib));
            }
            if !matches!(disk_format, "qcow2" | "raw") {
                return invalid(format!("disk format must be qcow2 or raw, got {disk_format:?}"));
            }
            if !matches!(self.firmware.as_str(), "uefi" | "bios") {
                return invalid(format!("firmware must be uefi or bios, got {:?}", self.firmware));
            }
        }
        let uefi = self.firmware == "uefi";
        let disk_format = if flavour == Generation::Kvm {
            "qcow2"
        } else {
            disk_format
        };

        let mut os = Element::new("os");
        if uefi {
            os = os.attr("firmware", "efi");
        }
        os = os
            .child(
                Element::new("type")
                    .attr("arch", "x86_64")
                    .attr("machine", "q35")
                    .text("hvm"),
            )
            .child_if(uefi.then(|| {
                Element::new("firmware").child(
                    Element::new("feature")
                        .attr("enabled", "no")
                        .attr("name", "secure-boot"),
                )
            }))
            .child_if((flavour == Generation::Kvm).then(|| Element::new("boot").attr("dev", "hd")));

        let name = Element::new("name").text(&self.name);
        let memory = Element::new("memory")
            .attr("unit", "MiB")
            .text(self.memory_mib.to_string());
        let vcpu = Element::new("vcpu").text(self.vcpus.to_string());
        let metadata = Element::new("metadata").child(self.mark.element(flavour.namespace()));
        let features = Element::new("features")
            .child(Element::new("acpi"))
            .child(Element::new("apic"));
        let cpu = self
            .cpu_mode
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| Element::new("cpu").attr("mode", m));

        let mut domain = Element::new("domain").attr("type", &self.domain_type);
        domain = match flavour {
            Generation::Kvm2 => domain.child(name).child(memory).child(vcpu).child(metadata),
            Generation::Kvm => domain.child(name).child(metadata).child(memory).child(vcpu),
        };
        domain = domain
            .child(os)
            .child(features)
            .child_if(cpu)
            .child_if((flavour == Generation::Kvm).then(|| Element::new("clock").attr("offset", "utc")))
            .child(Element::new("on_poweroff").text("destroy"))
            .child(Element::new("on_reboot").text("restart"))
            .child(Element::new("on_crash").text("destroy"))
            .child(self.devices(disk_format));
        Ok(match flavour {
            Generation::Kvm2 => domain.to_string_pretty()?,
            Generation::Kvm => domain.to_string_compact()?,
        })
    }

    fn devices(&self, disk_format: &str) -> Element {
        let disk = Element::new("disk")
            .attr("type", "file")
            .attr("device", "disk")
            .child(Element::new("driver").attr("name", "qemu").attr("type", disk_format))
            .child(Element::new("source").attr("file", &self.disk_path))
            .child(Element::new("target").attr("dev", "vda").attr("bus", "virtio"));
        let seed = Element::new("disk")
            .attr("type", "file")
            .attr("device", "cdrom")
            .child(Element::new("driver").attr("name", "qemu").attr("type", "raw"))
            .child(Element::new("source").attr("file", &self.seed_path))
            .child(Element::new("target").attr("dev", "sda").attr("bus", "sata"))
            .child(Element::new("readonly"));
        let nic = Element::new("interface")
            .attr("type", "bridge")
            .child_if(self.mac.as_ref().map(|m| Element::new("mac").attr("address", m)))
            .child(Element::new("source").attr("bridge", &self.bridge))
            .child(Element::new("model").attr("type", "virtio"));
        Element::new("devices")
            .child(disk)
            .child(seed)
            .child(nic)
            .child(
                Element::new("serial")
                    .attr("type", "pty")
                    .child(Element::new("target").attr("port", "0")),
            )
            .child(
                Element::new("console")
                    .attr("type", "pty")
                    .child(Element::new("target").attr("type", "serial").attr("port", "0")),
            )
            .child(
                Element::new("channel").attr("type", "unix").child(
                    Element::new("target")
                        .attr("type", "virtio")
                        .attr("name", "org.qemu.guest_agent.0"),
                ),
            )
            .child(
                Element::new("rng")
                    .attr("model", "virtio")
                    .child(Element::new("backend").attr("model", "random").text("/dev/urandom")),
            )
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::mark::{KVM_NAMESPACE, KVM2_NAMESPACE};

    fn spec() -> DomainSpec {
        DomainSpec {
            name: "proxy-abc".into(),
            memory_mib: 1024,
            vcpus: 2,
            mark: Mark::new(
                "u-1",
                SystemTime::from("2026-09-16T12:00:00Z".parse::<jiff::Timestamp>().unwrap()),
            ),
            firmware: "uefi".into(),
            domain_type: "kvm".into(),
            cpu_mode: Some("host-passthrough".into()),
            disk_path: "/var/lib/libvirt/images/proxy-abc.qcow2".into(),
            disk_format: "qcow2".into(),
            seed_path: "/var/lib/libvirt/images/proxy-abc-seed.iso".into(),
            bridge: "br0".into(),
            mac: None,
        }
    }

    #[test]
    fn kvm2_document_has_every_element_of_the_template() {
        let xml = spec().to_xml(Generation::Kvm2).unwrap();
        for part in [
            "<domain type=\"kvm\">",
            "  <name>proxy-abc</name>",
            "  <memory unit=\"MiB\">1024</memory>",
            "  <vcpu>2</vcpu>",
            &format!("    <instance xmlns=\"{KVM2_NAMESPACE}\">"),
            "      <managed>true</managed>",
            "      <uid>u-1</uid>",
            "      <createdAt>2026-09-16T12:00:00Z</createdAt>",
            "  <os firmware=\"efi\">",
            "    <type arch=\"x86_64\" machine=\"q35\">hvm</type>",
            "      <feature enabled=\"no\" name=\"secure-boot\"/>",
            "    <acpi/>",
            "    <apic/>",
            "  <cpu mode=\"host-passthrough\"/>",
            "  <on_poweroff>destroy</on_poweroff>",
            "  <on_reboot>restart</on_reboot>",
            "  <on_crash>destroy</on_crash>",
            "      <driver name=\"qemu\" type=\"qcow2\"/>",
            "      <source file=\"/var/lib/libvirt/images/proxy-abc.qcow2\"/>",
            "      <target dev=\"vda\" bus=\"virtio\"/>",
            "    <disk type=\"file\" device=\"cdrom\">",
            "      <target dev=\"sda\" bus=\"sata\"/>",
            "      <readonly/>",
            "    <interface type=\"bridge\">",
            "      <source bridge=\"br0\"/>",
            "      <model type=\"virtio\"/>",
            "    <serial type=\"pty\">",
            "      <target type=\"serial\" port=\"0\"/>",
            "      <target type=\"virtio\" name=\"org.qemu.guest_agent.0\"/>",
            "      <backend model=\"random\">/dev/urandom</backend>",
        ] {
            assert!(xml.lines().any(|l| l == part), "missing {part:?} in\n{xml}");
        }
        for absent in [
            "type=\"volume\"",
            "pool=",
            "<uuid",
            "<mac",
            "<graphics",
            "<video",
            "<boot",
            "<clock",
        ] {
            assert!(!xml.contains(absent), "{absent} in\n{xml}");
        }
    }

    #[test]
    fn bios_and_software_emulation_without_a_cpu_mode() {
        let mut s = spec();
        s.firmware = "bios".into();
        s.domain_type = "qemu".into();
        s.cpu_mode = None;
        let xml = s.to_xml(Generation::Kvm2).unwrap();
        assert!(xml.starts_with("<domain type=\"qemu\">"), "{xml}");
        assert!(!xml.contains("firmware"), "{xml}");
        assert!(!xml.contains("<cpu"), "{xml}");
    }

    #[test]
    fn kvm_document_is_compact_in_its_own_order_with_clock_and_boot() {
        let mut s = spec();
        s.firmware = "UEFI".into();
        let xml = s.to_xml(Generation::Kvm).unwrap();
        assert_eq!(xml.lines().count(), 1);
        let order: Vec<usize> = [
            "<name>",
            "<metadata>",
            "<memory",
            "<vcpu>",
            "<os",
            "<features>",
            "<cpu",
            "<clock offset=\"utc\"/>",
            "<on_poweroff>",
            "<devices>",
        ]
        .iter()
        .map(|p| xml.find(p).unwrap_or_else(|| panic!("no {p} in {xml}")))
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{xml}");
        assert!(xml.contains(&format!("<instance xmlns=\"{KVM_NAMESPACE}\">")));
        // Anything but exactly `uefi` is BIOS for kvm, and nothing is refused.
        assert!(!xml.contains("firmware"), "{xml}");
        assert!(xml.contains("<boot dev=\"hd\"/>"));
        s.name.clear();
        s.disk_format = "vmdk".into();
        let xml = s.to_xml(Generation::Kvm).unwrap();
        assert!(xml.contains("<driver name=\"qemu\" type=\"qcow2\"/>"), "{xml}");
    }

    #[test]
    fn kvm2_refuses_what_cannot_work() {
        type Edit = dyn Fn(&mut DomainSpec);
        let cases: [(&Edit, &str); 8] = [
            (&|s| s.name.clear(), "domain XML: name is empty"),
            (&|s| s.disk_path.clear(), "domain XML: disk path is empty"),
            (&|s| s.seed_path.clear(), "domain XML: seed path is empty"),
            (
                &|s| s.disk_format = "vmdk".into(),
                "domain XML: disk format must be qcow2 or raw, got \"vmdk\"",
            ),
            (
                &|s| s.firmware.clear(),
                "domain XML: firmware must be uefi or bios, got \"\"",
            ),
            (
                &|s| s.firmware = "UEFI".into(),
                "domain XML: firmware must be uefi or bios, got \"UEFI\"",
            ),
            (&|s| s.vcpus = 0, "domain XML: vcpus must be positive, got 0"),
            (
                &|s| s.memory_mib = -1,
                "domain XML: memory must be positive, got -1 MiB",
            ),
        ];
        for (edit, want) in cases {
            let mut s = spec();
            edit(&mut s);
            assert_eq!(s.to_xml(Generation::Kvm2).unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn a_mac_address_goes_on_the_nic_when_given() {
        let mut s = spec();
        assert!(!s.to_xml(Generation::Kvm2).unwrap().contains("<mac"));
        s.mac = Some("52:54:00:ab:cd:ef".into());
        let xml = s.to_xml(Generation::Kvm2).unwrap();
        assert!(
            xml.contains("<interface type=\"bridge\">\n      <mac address=\"52:54:00:ab:cd:ef\"/>\n      <source bridge=\"br0\"/>"),
            "{xml}"
        );
    }

    #[test]
    fn hostile_values_stay_values() {
        let mut s = spec();
        s.bridge = "br0\"/><disk type=\"volume".into();
        s.mark.uid = "</uid><managed>true".into();
        let xml = s.to_xml(Generation::Kvm2).unwrap();
        assert!(!xml.contains("type=\"volume\""), "{xml}");
        assert_eq!(xml.matches("<managed>").count(), 1, "{xml}");
        assert_eq!(xml.matches("<disk").count(), 2, "{xml}");
    }
}
