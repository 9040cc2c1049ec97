//! The NoCloud seed: an ISO 9660 image labelled `cidata` with three files at its root, and a
//! fourth for a Proxy with credentials.
//!
//! - `user-data`: the Proxy's cloud-init, byte for byte (never parsed, never logged);
//! - `meta-data`: `instance-id: <name>\nlocal-hostname: <name>\n`;
//! - `vendor-data`: the provider's extra document and/or the guest-agent script (see
//!   [`vendor_data`]); always present, possibly empty;
//! - [`HTPASSWD_FILE`] (`egress-proxy-htpasswd`), only when the Proxy has credentials: one
//!   htpasswd line, the user name and a salted SHA-512-crypt hash (never the password), for the
//!   user's cloud-init to give Squid (`basic_ncsa_auth`). The seed stays on the hypervisor's
//!   pool; no Kubernetes object holds it.
//!
//! The image is built in memory (tens of KiB), so cloud-init never touches the node's disk.

use std::io::Cursor;
use std::sync::Arc;

use hadris_iso::read::PathSeparator;
use hadris_iso::write::options::{CreationFeatures, IsoFormatOptions};
use hadris_iso::write::{File, InputFiles, IsoImageWriter};
use rand::RngExt;

/// The volume label cloud-init's NoCloud datasource looks for.
pub const LABEL: &str = "cidata";

/// The seed file with the Proxy's htpasswd line (mount `/dev/disk/by-label/cidata` to read it).
pub const HTPASSWD_FILE: &str = "egress-proxy-htpasswd";

/// The script vendor-data carries so the guest runs the QEMU guest agent (the providers read
/// the VM's address through it). A script, not a cloud-config: cloud-init would fold a
/// cloud-config vendor-data under the user's own, and a Proxy with its own `packages:` would
/// silently lose the agent.
pub const GUEST_AGENT_SCRIPT: &str = r#"#!/bin/sh
# Added by egress-proxies-operator: installs and starts the QEMU guest agent, through which the
# operator learns this VM's address. Set `installGuestAgent: false` in the provider's config to
# leave this script out.
set -e
if command -v qemu-ga >/dev/null 2>&1 || [ -x /usr/sbin/qemu-ga ]; then
    echo "qemu-guest-agent is already installed"
elif command -v apt-get >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-guest-agent
elif command -v dnf >/dev/null 2>&1; then
    dnf install -y qemu-guest-agent
elif command -v yum >/dev/null 2>&1; then
    yum install -y qemu-guest-agent
elif command -v zypper >/dev/null 2>&1; then
    zypper --non-interactive install qemu-guest-agent
elif command -v apk >/dev/null 2>&1; then
    apk add qemu-guest-agent
else
    echo "no known package manager: cannot install qemu-guest-agent" >&2
    exit 1
fi
if command -v systemctl >/dev/null 2>&1; then
    systemctl enable --now qemu-guest-agent
elif command -v rc-update >/dev/null 2>&1; then
    rc-update add qemu-guest-agent default
    rc-service qemu-guest-agent start
fi
"#;

/// What vendor-data holds:
///
/// | `install_guest_agent` | `extra` (trimmed) | vendor-data |
/// |---|---|---|
/// | false | any | `extra` verbatim (possibly empty) |
/// | true | empty | the guest-agent script |
/// | true | not empty | MIME multipart: `extra` as `text/plain`, then the script as `text/x-shellscript` |
///
/// `MIME-Version` comes first (cloud-init only treats a payload as multipart when it sees that
/// header early). The boundary is random per call. `extra` is declared `text/plain` so that
/// cloud-init, not the operator, recognises what it is from its first line.
pub fn vendor_data(extra: &[u8], install_guest_agent: bool) -> Vec<u8> {
    if !install_guest_agent {
        return extra.to_vec();
    }
    if extra.trim_ascii().is_empty() {
        return GUEST_AGENT_SCRIPT.as_bytes().to_vec();
    }
    let boundary: String = (0..30).map(|_| format!("{:02x}", rand::rng().random::<u8>())).collect();
    let mut out = Vec::with_capacity(extra.len() + GUEST_AGENT_SCRIPT.len() + 512);
    out.extend_from_slice(
        format!(
            "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"{boundary}\"\r\n\r\n\
             --{boundary}\r\nContent-Type: text/plain\r\n\r\n"
        )
        .as_bytes(),
    );
    out.extend_from_slice(extra);
    out.extend_from_slice(format!("\r\n--{boundary}\r\nContent-Type: text/x-shellscript\r\n\r\n").as_bytes());
    out.extend_from_slice(GUEST_AGENT_SCRIPT.as_bytes());
    out.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    out
}

/// The seed could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SeedError {
    /// No instance name (Permanent for the provider).
    #[error("building seed ISO: the instance name is empty")]
    EmptyName,
    /// The ISO writer failed.
    #[error("building seed ISO for {name}: {reason}")]
    Write {
        /// The instance.
        name: String,
        /// The writer's error (it never quotes file contents).
        reason: String,
    },
}

/// The seed ISO of instance `name`.
///
/// # Errors
/// An empty name, or the writer failing.
pub fn seed_iso(name: &str, user_data: &[u8], vendor_data: &[u8]) -> Result<Vec<u8>, SeedError> {
    seed_iso_with(name, user_data, vendor_data, None)
}

/// The seed ISO of instance `name`, with [`HTPASSWD_FILE`] holding `htpasswd` (one line) when
/// the Proxy has credentials.
///
/// # Errors
/// An empty name, or the writer failing.
pub fn seed_iso_with(
    name: &str,
    user_data: &[u8],
    vendor_data: &[u8],
    htpasswd: Option<&str>,
) -> Result<Vec<u8>, SeedError> {
    if name.is_empty() {
        return Err(SeedError::EmptyName);
    }
    let file = |file_name: &str, contents: Vec<u8>| File::File {
        name: Arc::new(file_name.to_owned()),
        contents,
    };
    let files = InputFiles {
        path_separator: PathSeparator::ForwardSlash,
        files: [
            file("meta-data", meta_data(name).into_bytes()),
            file("user-data", user_data.to_vec()),
            file("vendor-data", vendor_data.to_vec()),
        ]
        .into_iter()
        .chain(htpasswd.map(|line| file(HTPASSWD_FILE, format!("{}\n", line.trim_end()).into_bytes())))
        .collect(),
    };
    let options = IsoFormatOptions {
        volume_name: LABEL.to_owned(),
        system_id: None,
        volume_set_id: None,
        publisher_id: None,
        preparer_id: None,
        application_id: None,
        sector_size: 2048,
        path_separator: PathSeparator::ForwardSlash,
        // Joliet and Rock Ridge, so Linux shows the names as written (lowercase, with dashes).
        features: CreationFeatures::extensions(),
        strict_charset: false,
    };
    IsoImageWriter::create(Cursor::new(Vec::new()), files, options)
        .map(Cursor::into_inner)
        .map_err(|e| SeedError::Write {
            name: name.to_owned(),
            reason: e.to_string(),
        })
}

/// The meta-data file of instance `name`: the name is the instance-id too, so a reboot is not
/// taken for a first boot.
pub fn meta_data(name: &str) -> String {
    format!("instance-id: {name}\nlocal-hostname: {name}\n")
}

/// The contents of file `name` in the root directory of an ISO 9660 image, as Linux would show
/// it: by its Rock Ridge name when it has one, else by its ISO name without the `;1` version.
/// `None` when the image has no such file or cannot be read (every offset is bounds-checked).
/// For reading a seed back: tests, and the in-memory fake's inventory.
pub fn read_seed_file(iso: &[u8], name: &str) -> Option<Vec<u8>> {
    const SECTOR: usize = 2048;
    let le32 = |b: &[u8], at: usize| -> Option<usize> {
        let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(bytes)).ok()
    };
    let pvd = iso.get(16 * SECTOR..17 * SECTOR)?;
    if pvd.get(1..6)? != b"CD001" {
        return None;
    }
    let root = pvd.get(156..190)?;
    let (dir_at, dir_len) = (le32(root, 2)?.checked_mul(SECTOR)?, le32(root, 10)?);
    let dir = iso.get(dir_at..dir_at.checked_add(dir_len)?)?;
    let mut at = 0;
    while at < dir.len() {
        let len = usize::from(dir[at]);
        if len == 0 {
            // Records do not cross sectors: skip to the next one.
            at = (at / SECTOR + 1) * SECTOR;
            continue;
        }
        let record = dir.get(at..at + len)?;
        at += len;
        let name_len = usize::from(*record.get(32)?);
        let iso_name = record.get(33..33 + name_len)?;
        let system_use = record.get((33 + name_len + (1 - name_len % 2))..).unwrap_or_default();
        let shown = rock_ridge_name(system_use).unwrap_or_else(|| {
            let plain = iso_name.split(|b| *b == b';').next().unwrap_or_default();
            String::from_utf8_lossy(plain)
                .trim_end_matches('.')
                .to_ascii_lowercase()
        });
        if shown == name && record.get(25).is_some_and(|flags| flags & 2 == 0) {
            let (extent, size) = (le32(record, 2)?.checked_mul(SECTOR)?, le32(record, 10)?);
            return iso.get(extent..extent.checked_add(size)?).map(<[u8]>::to_vec);
        }
    }
    None
}

/// The name in a Rock Ridge `NM` entry of a record's system-use area.
fn rock_ridge_name(mut area: &[u8]) -> Option<String> {
    while area.len() >= 4 {
        let len = usize::from(area[2]);
        if len < 4 || len > area.len() {
            return None;
        }
        if &area[..2] == b"NM" && len >= 5 {
            return Some(String::from_utf8_lossy(&area[5..len]).into_owned());
        }
        area = &area[len..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(haystack: &[u8], needle: &[u8]) -> bool {
        needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn the_image_is_labelled_cidata_and_holds_each_file_verbatim() {
        // Bytes a text round trip would damage: CRLF, no final newline, invalid UTF-8.
        let user_data =
            b"Content-Type: multipart/mixed\r\n\r\n## template: jinja\r\n\xff\xfe\x80 tail  \n\n\nend".to_vec();
        let vendor = vendor_data(b"#cloud-config\n", true);
        let iso = seed_iso("proxy-abc", &user_data, &vendor).unwrap();
        assert_eq!(iso.len() % 2048, 0);
        // The primary volume descriptor (sector 16) carries the label at byte 40.
        let pvd = &iso[16 * 2048..17 * 2048];
        assert_eq!(&pvd[1..6], b"CD001");
        assert_eq!(std::str::from_utf8(&pvd[40..72]).unwrap().trim_end(), LABEL);
        for contents in [&user_data[..], &vendor[..], meta_data("proxy-abc").as_bytes()] {
            assert!(find(&iso, contents), "a file's bytes are not in the image verbatim");
        }
        // Rock Ridge names, as Linux will show them, each holding its file byte for byte.
        for name in ["user-data", "meta-data", "vendor-data"] {
            assert!(find(&iso, name.as_bytes()), "{name} is not named in the image");
        }
        assert_eq!(read_seed_file(&iso, "user-data").as_deref(), Some(&user_data[..]));
        assert_eq!(read_seed_file(&iso, "vendor-data").as_deref(), Some(&vendor[..]));
        assert_eq!(
            read_seed_file(&iso, "meta-data").as_deref(),
            Some(meta_data("proxy-abc").as_bytes())
        );
        assert_eq!(read_seed_file(&iso, "network-config"), None);
        assert_eq!(read_seed_file(&iso[..20_000], "user-data"), None);
        assert_eq!(read_seed_file(b"not an image", "user-data"), None);
    }

    #[test]
    fn credentials_add_the_htpasswd_file_and_nothing_else_changes() {
        let line = "u1:$6$rounds=5000$salt$hash";
        let iso = seed_iso_with("proxy-abc", b"#cloud-config\n", b"", Some(line)).unwrap();
        assert_eq!(
            read_seed_file(&iso, HTPASSWD_FILE).as_deref(),
            Some(format!("{line}\n").as_bytes())
        );
        assert_eq!(
            read_seed_file(&iso, "user-data").as_deref(),
            Some(&b"#cloud-config\n"[..])
        );
        let without = seed_iso("proxy-abc", b"#cloud-config\n", b"").unwrap();
        assert_eq!(read_seed_file(&without, HTPASSWD_FILE), None);
    }

    #[test]
    fn an_empty_user_data_and_vendor_data_still_make_files() {
        let iso = seed_iso("proxy-abc", b"", b"").unwrap();
        assert!(find(&iso, b"vendor-data") && find(&iso, b"user-data"));
        assert_eq!(seed_iso("", b"x", b""), Err(SeedError::EmptyName));
    }

    #[test]
    fn vendor_data_follows_the_table() {
        assert_eq!(vendor_data(b"  #cloud-config\n", false), b"  #cloud-config\n");
        assert_eq!(vendor_data(b"", false), b"");
        assert_eq!(vendor_data(b" \n\t", true), GUEST_AGENT_SCRIPT.as_bytes());
        let both = String::from_utf8(vendor_data(b"#cloud-config\nruncmd: [x]", true)).unwrap();
        assert!(
            both.starts_with("MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\""),
            "{both}"
        );
        let boundary = both.split('"').nth(1).unwrap().to_owned();
        assert_eq!(boundary.len(), 60);
        assert!(boundary.chars().all(|c| c.is_ascii_hexdigit()));
        let parts: Vec<&str> = both.split(&format!("--{boundary}")).collect();
        assert_eq!(parts.len(), 4, "{both}");
        assert_eq!(
            parts[1],
            "\r\nContent-Type: text/plain\r\n\r\n#cloud-config\nruncmd: [x]\r\n"
        );
        assert_eq!(
            parts[2],
            format!("\r\nContent-Type: text/x-shellscript\r\n\r\n{GUEST_AGENT_SCRIPT}\r\n")
        );
        assert_eq!(parts[3], "--\r\n");
        // A new boundary each time.
        assert_ne!(vendor_data(b"x", true), vendor_data(b"x", true));
    }

    #[test]
    fn the_guest_agent_script_covers_every_package_manager_and_init() {
        let s = GUEST_AGENT_SCRIPT;
        assert!(s.starts_with("#!/bin/sh\n") && !s.starts_with("#cloud-config"));
        for part in [
            "qemu-guest-agent",
            "set -e",
            "apt-get",
            "DEBIAN_FRONTEND=noninteractive",
            "dnf",
            "yum",
            "zypper",
            "apk",
            "systemctl enable --now qemu-guest-agent",
            "rc-update",
            "installGuestAgent: false",
        ] {
            assert!(s.contains(part), "{part}");
        }
        assert!(!s.contains("MIME-Version"));
        // Neither init system: the script must not fail after installing (guarded OpenRC branch).
        assert!(s.contains("elif command -v rc-update"));
    }

    /// Runs the guest-agent script under `/bin/sh` on a PATH of stubs named `commands` (each
    /// logs its name and arguments and succeeds), with `agent_present` saying whether the
    /// agent's binary exists. Returns the exit code, the log and stderr.
    fn run_guest_agent_script(commands: &[&str], agent_present: bool) -> (i32, String, String) {
        use std::os::unix::fs::PermissionsExt;
        static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("egress-agent-script-{}-{n}", std::process::id()));
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let log = dir.join("log");
        for command in commands {
            let stub = bin.join(command);
            std::fs::write(&stub, "#!/bin/sh\necho \"${0##*/} $*\" >> \"$STUB_LOG\"\n").unwrap();
            std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // The script also looks for the agent at an absolute path; here it is one of ours, so
        // what this machine has installed does not matter.
        let agent = dir.join("qemu-ga");
        if agent_present {
            std::fs::write(&agent, "").unwrap();
            std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let script = GUEST_AGENT_SCRIPT.replace("/usr/sbin/qemu-ga", &agent.display().to_string());
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&script)
            .env_clear()
            .env("PATH", &bin)
            .env("STUB_LOG", &log)
            .output()
            .expect("/bin/sh runs");
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        std::fs::remove_dir_all(&dir).unwrap();
        (
            out.status.code().unwrap_or(-1),
            logged,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Review L10, run rather than read: each package manager and init system takes its branch,
    /// and a guest with neither systemd nor OpenRC still succeeds after installing.
    #[test]
    fn the_guest_agent_script_takes_the_branch_of_what_the_guest_has() {
        let agent = "qemu-guest-agent";
        for (commands, want) in [
            (
                &["apt-get", "systemctl"][..],
                format!("apt-get update\napt-get install -y {agent}\nsystemctl enable --now {agent}\n"),
            ),
            (
                &["dnf", "yum", "systemctl"][..],
                format!("dnf install -y {agent}\nsystemctl enable --now {agent}\n"),
            ),
            (&["yum"][..], format!("yum install -y {agent}\n")),
            (&["zypper"][..], format!("zypper --non-interactive install {agent}\n")),
            (
                &["apk", "rc-update", "rc-service"][..],
                format!("apk add {agent}\nrc-update add {agent} default\nrc-service {agent} start\n"),
            ),
            // Neither init system (L10): installed, nothing started, and no failure.
            (&["apk"][..], format!("apk add {agent}\n")),
        ] {
            let (code, logged, stderr) = run_guest_agent_script(commands, false);
            assert_eq!((code, logged.as_str()), (0, want.as_str()), "{commands:?}: {stderr}");
        }
        let (code, logged, _) = run_guest_agent_script(&["apt-get", "systemctl"], true);
        assert_eq!(code, 0);
        assert_eq!(
            logged,
            format!("systemctl enable --now {agent}\n"),
            "no install when present"
        );
        let (code, logged, stderr) = run_guest_agent_script(&[], false);
        assert_eq!((code, logged.as_str()), (1, ""));
        assert!(stderr.contains("no known package manager"), "{stderr}");
    }
}
