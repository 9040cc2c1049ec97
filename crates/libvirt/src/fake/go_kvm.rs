//! The domain document the Go operator's kvm provider wrote, for tests of what a Go fleet left.

/// A domain document as the Go operator's kvm provider wrote it, for tests that lay down what a
/// Go fleet left on a host: its `.../kvm` metadata namespace with the managed mark, the UID and
/// the creation time, and the compact form of Go's encoder (empty elements as start and end
/// tags, `<clock>` and `<boot>`). Written out literally rather than by this workspace's
/// builders, so a change to those cannot hide a difference from Go.
#[derive(Clone, Copy, Debug)]
pub struct GoKvmDomain<'a> {
    /// The domain's name (`proxy-<uid prefix>`).
    pub name: &'a str,
    /// The owning Proxy's UID.
    pub uid: &'a str,
    /// The creation time Go wrote (RFC 3339).
    pub created_at: &'a str,
    /// The overlay's path.
    pub disk: &'a str,
    /// The seed ISO's path.
    pub seed: &'a str,
    /// The bridge of its one interface.
    pub bridge: &'a str,
    /// `kvm` (with a host-passthrough CPU) or `qemu`.
    pub domain_type: &'a str,
}

impl GoKvmDomain<'_> {
    /// The document.
    pub fn xml(&self) -> String {
        let Self {
            name,
            uid,
            created_at,
            disk,
            seed,
            bridge,
            domain_type,
        } = *self;
        // Go left the CPU element out on a host without KVM.
        let cpu = if domain_type == "kvm" {
            "<cpu mode=\"host-passthrough\"></cpu>"
        } else {
            ""
        };
        format!(
            "<domain type=\"{domain_type}\"><name>{name}</name><metadata><instance xmlns=\"https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm\"><managed>true</managed><uid>{uid}</uid><createdAt>{created_at}</createdAt></instance></metadata><memory unit=\"MiB\">256</memory><vcpu>1</vcpu><os firmware=\"efi\"><type arch=\"x86_64\" machine=\"q35\">hvm</type><firmware><feature enabled=\"no\" name=\"secure-boot\"></feature></firmware><boot dev=\"hd\"></boot></os><features><acpi></acpi><apic></apic></features>{cpu}<clock offset=\"utc\"></clock><on_poweroff>destroy</on_poweroff><on_reboot>restart</on_reboot><on_crash>destroy</on_crash><devices><disk type=\"file\" device=\"disk\"><driver name=\"qemu\" type=\"qcow2\"></driver><source file=\"{disk}\"></source><target dev=\"vda\" bus=\"virtio\"></target></disk><disk type=\"file\" device=\"cdrom\"><driver name=\"qemu\" type=\"raw\"></driver><source file=\"{seed}\"></source><target dev=\"sda\" bus=\"sata\"></target><readonly></readonly></disk><interface type=\"bridge\"><source bridge=\"{bridge}\"></source><model type=\"virtio\"></model></interface><serial type=\"pty\"><target port=\"0\"></target></serial><console type=\"pty\"><target type=\"serial\" port=\"0\"></target></console><channel type=\"unix\"><target type=\"virtio\" name=\"org.qemu.guest_agent.0\"></target></channel><rng model=\"virtio\"><backend model=\"random\">/dev/urandom</backend></rng></devices></domain>"
        )
    }
}
