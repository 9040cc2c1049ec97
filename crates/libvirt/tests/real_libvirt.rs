//! The builders against the real libvirtd of `cargo xtask hypervisor up`, driven with `virsh` as
//! the local administrator, an independent client (the providers' own path, over SSH, is
//! egress-libvirt-ssh's tests, which also boot the test guest from our documents): our volume
//! documents create the base, overlay and seed volumes; our domain documents (both flavours)
//! define and undefine; the mark round-trips through libvirt's metadata, scoped by namespace.
//!
//! Without the hypervisor the test skips, and under `cargo xtask test` (which brings it up) it
//! fails.

use std::process::Command;
use std::time::SystemTime;

use egress_libvirt::seed::{seed_iso, vendor_data};
use egress_libvirt::{DomainSpec, Generation, HypervisorEnv, Mark, VolumeSpec};

fn virsh(args: &[&str]) -> Result<String, String> {
    let out = Command::new("virsh")
        .args(["-q", "-c", "qemu:///system"])
        .args(args)
        .output()
        .map_err(|e| format!("virsh: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "virsh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(args: &[&str]) -> String {
    virsh(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Everything the test made, removed on drop whatever happened.
struct Made {
    pool: String,
    dir: std::path::PathBuf,
    domains: Vec<String>,
    volumes: Vec<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for d in &self.domains {
            let _ = virsh(&["destroy", d]);
            let _ = virsh(&["undefine", d, "--nvram"]);
        }
        for v in self.volumes.iter().rev() {
            let _ = virsh(&["vol-delete", v, &self.pool]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Made {
    /// Creates a volume from our document, and uploads `content` into it when given.
    fn volume(&mut self, spec: &VolumeSpec, content: Option<&std::path::Path>) -> String {
        let xml = self.dir.join(format!("{}.xml", spec.name));
        std::fs::write(&xml, spec.to_xml(Generation::Kvm2).unwrap()).unwrap();
        must(&["vol-create", &self.pool, xml.to_str().unwrap()]);
        self.volumes.push(spec.name.clone());
        if let Some(file) = content {
            must(&["vol-upload", &spec.name, file.to_str().unwrap(), "--pool", &self.pool]);
        }
        must(&["vol-path", &spec.name, "--pool", &self.pool])
    }

    fn define(&mut self, name: &str, xml: &str) {
        let file = self.dir.join(format!("{name}.domain.xml"));
        std::fs::write(&file, xml).unwrap();
        must(&["define", file.to_str().unwrap()]);
        self.domains.push(name.to_owned());
    }
}

#[test]
fn our_volumes_domains_and_mark_work_on_the_real_libvirtd() {
    let Some(env) = HypervisorEnv::for_test() else { return };
    let pool = env.pool.clone();
    let tag = format!("egress-test-{}", std::process::id());
    let mut made = Made {
        pool: pool.clone(),
        dir: std::env::temp_dir().join(&tag),
        domains: Vec::new(),
        volumes: Vec::new(),
    };
    std::fs::create_dir_all(&made.dir).unwrap();

    // The base image, uploaded as the providers upload a download: created with the image's
    // format and its byte length, then filled verbatim.
    let image = env.guest_image.clone();
    let image_len = i64::try_from(std::fs::metadata(&image).unwrap().len()).unwrap();
    let base = made.volume(
        &VolumeSpec {
            name: format!("{tag}-base.qcow2"),
            capacity_bytes: image_len,
            format: "qcow2".into(),
            backing: None,
        },
        Some(&image),
    );
    must(&["pool-refresh", &pool]);
    let overlay = made.volume(
        &VolumeSpec {
            name: format!("{tag}.qcow2"),
            capacity_bytes: 1 << 30,
            format: "qcow2".into(),
            backing: Some((base, "qcow2".into())),
        },
        None,
    );
    let info = must(&["vol-info", &format!("{tag}.qcow2"), "--pool", &pool, "--bytes"]);
    assert!(info.contains("1073741824 bytes"), "the overlay's capacity: {info}");

    // The seed: user-data with bytes a text round trip would damage.
    let name = format!("{tag}-vm");
    let user_data = b"#cloud-config\r\n# \xff\xfe not UTF-8, no final newline".to_vec();
    let iso = seed_iso(&name, &user_data, &vendor_data(b"", true)).unwrap();
    let iso_file = made.dir.join("seed.iso");
    std::fs::write(&iso_file, &iso).unwrap();
    let seed = made.volume(
        &VolumeSpec {
            name: format!("{tag}-seed.iso"),
            capacity_bytes: i64::try_from(iso.len()).unwrap(),
            format: "raw".into(),
            backing: None,
        },
        Some(&iso_file),
    );

    let created = SystemTime::now();
    let mark = Mark::new("0b5e1c2a-u-test", created);
    let spec = DomainSpec {
        name: name.clone(),
        memory_mib: 256,
        vcpus: 1,
        mark: mark.clone(),
        firmware: "uefi".into(),
        domain_type: env.domain_type.clone(),
        cpu_mode: None,
        disk_path: overlay,
        disk_format: "qcow2".into(),
        seed_path: seed,
        bridge: env.bridge.clone(),
        mac: None,
    };

    // The first-generation document defines and undefines too.
    let kvm_name = format!("{tag}-kvm");
    let kvm_doc = DomainSpec {
        name: kvm_name.clone(),
        ..spec.clone()
    }
    .to_xml(Generation::Kvm)
    .unwrap();
    made.define(&kvm_name, &kvm_doc);
    let kvm_mark = must(&["metadata", &kvm_name, "--uri", egress_libvirt::KVM_NAMESPACE]);
    assert_eq!(Mark::parse(&kvm_mark).unwrap().uid, mark.uid);
    // libvirt scopes metadata by namespace: nothing under the other provider's.
    assert!(virsh(&["metadata", &kvm_name, "--uri", egress_libvirt::KVM2_NAMESPACE]).is_err());
    must(&["undefine", &kvm_name, "--nvram"]);
    made.domains.retain(|d| d != &kvm_name);
    assert!(virsh(&["dominfo", &kvm_name]).is_err(), "undefined, yet still there");

    made.define(&name, &spec.to_xml(Generation::Kvm2).unwrap());
    let read_back = Mark::parse(&must(&["metadata", &name, "--uri", egress_libvirt::KVM2_NAMESPACE])).unwrap();
    assert_eq!(read_back.uid, mark.uid);
    assert!(read_back.managed);
    let written = jiff::Timestamp::try_from(created).unwrap().as_second();
    let read = jiff::Timestamp::try_from(read_back.created_at.expect("a creation time")).unwrap();
    assert_eq!(read.as_second(), written, "createdAt keeps whole seconds");
    let live = must(&["dumpxml", &name]);
    assert!(!live.contains("type='volume'") && !live.contains("type=\"volume\""));
}
