//! Table tests of the providers config loader: every malformed file must fail
//! with a one-line message naming the file, the entry and the field, and
//! every valid file must load into the expected model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use egress_libvirt::KvmConfig;
use egress_provider::config::{ProviderConfig, ProvidersConfig};
use egress_provider::{BoxError, Provider, ProviderType, Registry};
use egress_provider_gcp::GcpConfig;
use egress_provider_kubernetes::KubernetesConfig;
use egress_provider_local::LocalConfig;
use serde::de::DeserializeOwned;

const FILE: &str = "providers.yaml";

/// The five types of the operator, in the order it registers them, with the
/// blocks and rules of their crates and a constructor that is never called here.
fn registry() -> Registry {
    fn unused(_: &ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> {
        Err("unused".into())
    }
    Registry::new()
        .with(ProviderType::with_block::<KubernetesConfig>("kubernetes", unused))
        .with(ProviderType::with_block::<GcpConfig>("gcp", unused))
        .with(
            ProviderType::with_block::<KvmConfig>("kvm", unused)
                .sharing("libvirt", egress_libvirt::config::shared_pools),
        )
        .with(
            ProviderType::with_block::<KvmConfig>("kvm2", unused)
                .sharing("libvirt", egress_libvirt::config::shared_pools),
        )
        .with(ProviderType::with_block::<LocalConfig>("local", unused))
}

/// An entry's blocks, decoded as their backends decode them (`None`: the block is not set).
trait Blocks {
    fn typed<B: DeserializeOwned>(&self, key: &str) -> Option<B>;
    fn kubernetes(&self) -> Option<KubernetesConfig> {
        self.typed("kubernetes")
    }
    fn gcp(&self) -> Option<GcpConfig> {
        self.typed("gcp")
    }
    fn kvm(&self) -> Option<KvmConfig> {
        self.typed("kvm")
    }
    fn kvm2(&self) -> Option<KvmConfig> {
        self.typed("kvm2")
    }
    fn local(&self) -> Option<LocalConfig> {
        self.typed("local")
    }
}

impl Blocks for ProviderConfig {
    fn typed<B: DeserializeOwned>(&self, key: &str) -> Option<B> {
        let as_type = ProviderConfig {
            type_name: key.to_owned(),
            ..self.clone()
        };
        as_type.block().expect("a loaded block decodes")
    }
}

/// Strips the indentation shared by every non-blank line (and a leading
/// line break), so YAML can be written indented inside the table.
fn dedent(text: &str) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let margin = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start_matches(' ').len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| l.get(margin..).unwrap_or("").to_owned() + "\n")
        .collect()
}

/// A valid kvm or kvm2 entry named `kvm-home`; rows edit it line by line.
fn kvm_yaml(block: &str) -> String {
    dedent(&format!(
        "
        providers:
          - name: kvm-home
            type: {block}
            {block}:
              sshKeyFile: /k/id
              knownHostsFile: /k/known_hosts
              images:
                debian-13:
                  url: https://example.com/debian-13.qcow2
              machineTypes:
                small: {{vcpus: 1, memoryMiB: 1024}}
              hosts:
                - {{name: beelink, address: beelink:22, user: novakj, bridge: br0}}
        "
    ))
}

const SSH_LINE: &str = "      sshKeyFile: /k/id\n";
const KNOWN_HOSTS_LINE: &str = "      knownHostsFile: /k/known_hosts\n";
const URL_LINE: &str = "          url: https://example.com/debian-13.qcow2\n";
const MACHINES: &str = "      machineTypes:\n        small: {vcpus: 1, memoryMiB: 1024}\n";
const HOST_LINE: &str = "        - {name: beelink, address: beelink:22, user: novakj, bridge: br0}\n";

/// The kvm template with `from` replaced by `to`; panics if `from` is not
/// in the template, so an edit can never silently do nothing.
fn kvm_edit(block: &str, from: &str, to: &str) -> String {
    let yaml = kvm_yaml(block);
    assert!(yaml.contains(from), "template has no {from:?}");
    yaml.replacen(from, to, 1)
}

/// One malformed file and the message it must produce.
struct Bad {
    what: String,
    yaml: String,
    want: String,
}

fn bad(what: impl Into<String>, yaml: impl AsRef<str>, want: impl Into<String>) -> Bad {
    Bad {
        what: what.into(),
        yaml: dedent(yaml.as_ref()),
        want: want.into(),
    }
}

/// The warning for an entry name that is not a DNS-1123 label, after its `providers[i] "name": `.
const NOT_DNS: &str = "name is not a lowercase DNS-1123 label (lowercase letters, digits and '-', \
                       starting and ending with a letter or digit, at most 63 characters), so no \
                       Proxy can name this provider and no ProviderHealth object is written for it; \
                       rename the entry";
/// The same for a dotted name, which can still name a ProviderHealth object.
const NOT_DNS_LABEL: &str = "name is not a lowercase DNS-1123 label (lowercase letters, digits and '-', \
                             starting and ending with a letter or digit, at most 63 characters), so no \
                             Proxy can name this provider; rename the entry";
/// Expands to about a million nodes if nothing stops it.
const ALIAS_BOMB: &str = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n";

/// Problems of the file's shape: YAML syntax, the top level, unknown keys,
/// wrong value types.
#[rustfmt::skip]
fn structural_rows() -> Vec<Bad> {
    let ke = r#"providers[0] "kvm-home": kvm"#;
    vec![
        bad("not YAML: braces", "{{{", "invalid YAML: unclosed bracket '{' at line 1, column 3"),
        bad("not YAML: tabs", "providers:\n\t- name: a\n\t  type: kubernetes\n", "invalid YAML: tabs disallowed within this context (block indentation) at line 2, column 2"),
        bad("not YAML: unclosed quote", "providers:\n  - name: \"a\n", "invalid YAML: unclosed quote at line 2, column 11"),
        bad("two documents", "providers: []\n---\nproviders: []\n", "invalid YAML: only single YAML document expected but multiple found at line 3, column 1"),
        // The alias budget stops it long before a million nodes are built.
        bad("alias bomb", ALIAS_BOMB, "invalid YAML: YAML document too large or too complex: limits breached"),
        bad("duplicate top-level key", "providers: []\nproviders: []\n", "invalid YAML: duplicate mapping key `providers` is not allowed here at line 2, column 1"),
        bad("duplicate key in an entry", "providers:\n  - name: a\n    type: kubernetes\n    name: b\n", "invalid YAML: duplicate mapping key `name` is not allowed here at line 4, column 5"),
        bad("duplicate image key", kvm_edit("kvm", URL_LINE, &format!("{URL_LINE}        debian-13:\n{URL_LINE}")), "invalid YAML: duplicate mapping key `debian-13` is not allowed here at line 10, column 9"),
        bad("top level is a list", "- name: a\n  type: kubernetes\n", "the top level must be a mapping with a `providers` list (got a list)"),
        bad("top level is a string", "kubernetes\n", "the top level must be a mapping with a `providers` list (got a string)"),
        bad("unknown top-level key", "providers: []\nextra: 1\n", r#"unknown top-level key "extra"; only `providers` is allowed"#),
        bad("misspelled providers", "provider:\n  - name: a\n", r#"unknown top-level key "provider"; only `providers` is allowed"#),
        bad("non-string top-level key", "1: x\nproviders: []\n", r#"unknown top-level key "1"; only `providers` is allowed"#),
        bad("providers is a mapping", "providers:\n  name: a\n", "`providers` must be a list of entries (got a mapping)"),
        bad("providers is a string", "providers: kubernetes\n", "`providers` must be a list of entries (got a string)"),
        bad("entry is a string", "providers:\n  - kubernetes\n", "providers[0]: an entry must be a mapping with `name` and `type` (got a string)"),
        bad("entry is null", "providers:\n  -\n", "providers[0]: an entry must be a mapping with `name` and `type` (got null)"),
        bad("unknown key in an entry", "providers:\n  - {name: a, type: kubernetes, region: eu}\n", r#"providers[0] "a": region: unknown field `region`, expected one of `name`, `type`, `createsPerMinute`, `kubernetes`, `gcp`, `kvm`, `kvm2`"#),
        bad("unknown key in an unnamed entry", "providers:\n  - {type: kubernetes, nmae: a}\n", "providers[0]: nmae: unknown field `nmae`, expected one of `name`"),
        bad("unknown key in a kubernetes block", "providers:\n  - {name: k, type: kubernetes, kubernetes: {img: squid}}\n", r#"providers[0] "k": kubernetes.img: unknown field `img`, expected one of `namespace`, `image`, `resources`"#),
        bad("a kubernetes namespace that is no name", "providers:\n  - {name: k, type: kubernetes, kubernetes: {namespace: Crawl_1}}\n", r#"providers[0] "k": kubernetes.namespace must be a namespace name (a DNS-1123 label), got "Crawl_1""#),
        bad("a resource Kubernetes has no quantity for", "providers:\n  - {name: k, type: kubernetes, kubernetes: {resources: {limits: {gpu: '1'}}}}\n", r#"providers[0] "k": kubernetes.resources.limits["gpu"]: the resource must be cpu, memory or ephemeral-storage"#),
        bad("a quantity that is not one", "providers:\n  - {name: k, type: kubernetes, kubernetes: {resources: {requests: {memory: lots}}}}\n", r#"providers[0] "k": kubernetes.resources.requests["memory"] must be a quantity such as 100m or 64Mi (got "lots")"#),
        bad("unknown key in a gcp block", "providers:\n  - {name: g, type: gcp, gcp: {project: my-project, zone: z}}\n", r#"providers[0] "g": gcp.zone: unknown field `zone`, expected one of `project`, `network`, `subnetwork`, `networkTag`, `diskSizeGb`"#),
        bad("unknown key in a kvm block", kvm_edit("kvm", SSH_LINE, &format!("{SSH_LINE}      sshPort: 22\n")), format!("{ke}.sshPort: unknown field `sshPort`, expected one of `sshKeyFile`, `knownHostsFile`")),
        bad("unknown key in a kvm image", kvm_edit("kvm", URL_LINE, &format!("{URL_LINE}          checksum: abc\n")), format!("{ke}.images.debian-13.checksum: unknown field `checksum`, expected one of `url`, `sha256`, `format`, `firmware`")),
        bad("unknown key in a kvm host", kvm_edit("kvm", "bridge: br0}", "bridge: br0, port: 22}"), format!("{ke}.hosts[0].port: unknown field `port`, expected one of `name`, `address`, `user`")),
        bad("unknown key in a machine type", kvm_edit("kvm", "memoryMiB: 1024}", "memoryMiB: 1024, gpus: 1}"), format!("{ke}.machineTypes.small.gpus: unknown field `gpus`, expected `vcpus` or `memoryMiB`")),
        bad("a block that is a string", "providers:\n  - {name: g, type: gcp, gcp: \"x\"}\n", r#"providers[0] "g": gcp: invalid type: string "x", expected a mapping"#),
        bad("a list where a string is expected", "providers:\n  - {name: g, type: gcp, gcp: {project: [a, b]}}\n", r#"providers[0] "g": gcp.project: invalid type: sequence, expected a string"#),
        bad("a string where a number is expected", kvm_edit("kvm", "{vcpus: 1,", "{vcpus: two,"), format!(r#"{ke}.machineTypes.small.vcpus: invalid type: string "two", expected i32"#)),
        bad("a word that is no YAML 1.1 boolean", kvm_edit("kvm", KNOWN_HOSTS_LINE, "      insecureIgnoreHostKey: maybe\n"), format!(r#"{ke}.insecureIgnoreHostKey: invalid type: string "maybe", expected a boolean"#)),
        // A key that differs from every field in more than case is still unknown (Go's
        // UnmarshalStrict refused it too).
        bad("providers twice, in two cases", "providers: []\nProviders: []\n", "`providers` is given more than once (in different cases); keep one"),
        // Go's YAML 1.1 read `0123` as octal and wrote "83" into the field; a different text would
        // be a silent change, so it is refused (quote it). docs/migrating-from-go.md says so.
        bad("a leading zero in a text field", "providers:\n  - {name: g, type: gcp, gcp: {project: 0123}}\n", r#"providers[0] "g": gcp.project: invalid type: floating point `123.0`, expected a string"#),
        bad("a fraction in a text field", "providers:\n  - {name: g, type: gcp, gcp: {project: 1.5}}\n", r#"providers[0] "g": gcp.project: invalid type: floating point `1.5`, expected a string"#),
        bad("a misspelt key in any case", "providers:\n  - {name: g, type: gcp, gcp: {PROJECTS: p}}\n", r#"providers[0] "g": gcp.PROJECTS: unknown field `PROJECTS`, expected one of `project`"#),
        bad("hosts is a mapping", kvm_edit("kvm", HOST_LINE, "        beelink: {}\n"), format!("{ke}.hosts: invalid type: map, expected a sequence")),
    ]
}

/// The entry-level rules of providers.md §3.3: name, type, set blocks, gcp.
#[rustfmt::skip]
fn entry_rows() -> Vec<Bad> {
    let mut rows = vec![
        bad("missing name", "providers:\n  - type: kubernetes\n", "providers.yaml: providers[0]: name is required"),
        bad("empty name", "providers:\n  - {name: \"\", type: kubernetes}\n", "providers[0]: name is required"),
        bad("duplicate entry name", "providers:\n  - {name: a, type: kubernetes}\n  - {name: b, type: kubernetes}\n  - {name: a, type: kubernetes}\n", r#"providers[2] "a": duplicate provider name"#),
        bad("missing type", "providers:\n  - name: a\n", r#"providers.yaml: providers[0] "a": type is required"#),
        bad("unknown type", "providers:\n  - {name: a, type: docker}\n", r#"providers[0] "a": unknown provider type "docker""#),
        bad("unknown type is %q-quoted", "providers:\n  - {name: a, type: 'we\"ird'}\n", r#"providers[0] "a": unknown provider type "we\"ird""#),
        bad("types are case-sensitive", "providers:\n  - {name: a, type: KVM}\n", r#"providers[0] "a": unknown provider type "KVM""#),
        bad("the first bad entry wins", "providers:\n  - {name: ok, type: kubernetes}\n  - {name: bad, type: gcp}\n  - {name: worse, type: nope}\n", r#"providers[1] "bad": gcp.project is required"#),
        bad("own and foreign block", "providers:\n  - {name: a, type: gcp, gcp: {project: my-project}, kvm: {}}\n", r#"providers[0] "a": type is gcp but a kvm block is set"#),
        bad("first foreign block in fixed order", "providers:\n  - {name: a, type: kvm, kvm2: {}, kubernetes: {}}\n", r#"providers[0] "a": type is kvm but a kubernetes block is set"#),
        bad("gcp without a block", "providers:\n  - {name: g, type: gcp}\n", r#"providers[0] "g": gcp.project is required"#),
        bad("gcp without a project", "providers:\n  - {name: g, type: gcp, gcp: {network: default}}\n", r#"providers[0] "g": gcp.project is required"#),
        bad("gcp with an empty project", "providers:\n  - {name: g, type: gcp, gcp: {project: \"\"}}\n", r#"providers[0] "g": gcp.project is required"#),
        bad("gcp with a negative disk", "providers:\n  - {name: g, type: gcp, gcp: {project: my-project, diskSizeGb: -5}}\n", r#"providers[0] "g": gcp.diskSizeGb must not be negative"#),
        bad("gcp with a project ID the API refuses", "providers:\n  - {name: g, type: gcp, gcp: {project: My_Project}}\n", r#"providers[0] "g": gcp.project "My_Project" is not a project ID: 6 to 30 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen"#),
        bad("gcp with an upper-case network tag", "providers:\n  - {name: g, type: gcp, gcp: {project: my-project, networkTag: Squid}}\n", r#"providers[0] "g": gcp.networkTag "Squid" is not a network tag: 1 to 63 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen"#),
        bad("local without a block", "providers:\n  - {name: l, type: local}\n", r#"providers[0] "l": local block is required"#),
        bad("local without a state directory", "providers:\n  - {name: l, type: local, local: {}}\n", r#"providers[0] "l": local.stateDir is required"#),
        bad("local with a relative state directory", "providers:\n  - {name: l, type: local, local: {stateDir: state}}\n", r#"providers[0] "l": local.stateDir must be an absolute path (got "state")"#),
        bad("local with a quote in the state directory", "providers:\n  - {name: l, type: local, local: {stateDir: '/s\"x'}}\n", r#"providers[0] "l": local.stateDir must not contain a double quote or a line break (got "/s\"x")"#),
        bad("local with a relative tinyproxy", "providers:\n  - {name: l, type: local, local: {stateDir: /s, tinyproxyPath: tinyproxy}}\n", r#"providers[0] "l": local.tinyproxyPath must be an absolute path (got "tinyproxy")"#),
        bad("createsPerMinute 0", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: 0}\n", r#"providers.yaml: providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got 0)"#),
        bad("createsPerMinute negative", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: -5}\n", r#"providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got -5)"#),
        bad("createsPerMinute over the ceiling", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: 10001}\n", r#"providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got 10001)"#),
        bad("createsPerMinute past any integer", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: 99999999999999999999999}\n", r#"providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got "#),
        bad("createsPerMinute a word", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: fast}\n", r#"providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got "fast")"#),
        bad("createsPerMinute a fraction", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: 1.5}\n", r#"providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got 1.5)"#),
        bad("createsPerMinute a list", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: [60]}\n", r#"providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got [60])"#),
        bad("createsPerMinute a boolean", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: true}\n", r#"providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got true)"#),
        bad("createsPerMinute in any case, refused the same", "providers:\n  - {name: a, type: kubernetes, CREATESPERMINUTE: 0}\n", r#"providers[0] "a": createsPerMinute: must be a whole number from 1 to 10000 (got 0)"#),
        bad("createsPerMinute twice, in two cases", "providers:\n  - {name: a, type: kubernetes, createsPerMinute: 5, CreatesPerMinute: 6}\n", r#"providers[0] "a": duplicate field `createsPerMinute`"#),
        bad("createsPerMinute inside the block", "providers:\n  - {name: k, type: kubernetes, kubernetes: {createsPerMinute: 5}}\n", r#"providers[0] "k": kubernetes.createsPerMinute: unknown field `createsPerMinute`"#),
        bad("local with an unknown key", "providers:\n  - {name: l, type: local, local: {stateDir: /s, port: 1}}\n", r#"providers[0] "l": local.port: unknown field `port`, expected one of `stateDir`, `tinyproxyPath`, `connectPorts`"#),
    ];
    // Every wrong-block pair, including kvm<->kvm2 and gcp<->kubernetes.
    let types = ["kubernetes", "gcp", "kvm", "kvm2", "local"];
    for t in types {
        for b in types.into_iter().filter(|b| *b != t) {
            let yaml = format!("providers:\n  - name: p1\n    type: {t}\n    {b}: {{}}\n");
            rows.push(bad(format!("type {t} with a {b} block"), yaml, format!(r#"providers[0] "p1": type is {t} but a {b} block is set"#)));
        }
    }
    rows
}

const VENDOR_DATA_TAIL: &str = ".vendorData must start with a line cloud-init recognises (#cloud-config, #!, #include, ## template: jinja...) and must not be MIME multipart while installGuestAgent is on: cloud-init would drop it";

/// Every kvm.md §1.2 message for block `b` (`kvm` or `kvm2`), in the
/// validator's order. The dash in two messages is U+2014.
#[rustfmt::skip]
fn kvm_rows(b: &str) -> Vec<Bad> {
    let row = |what: &str, yaml: String, tail: String| bad(format!("{b}: {what}"), yaml, format!(r#"providers[0] "kvm-home": {b}{tail}"#));
    let img = r#".images["debian-13"]"#;
    let hosts = format!("      hosts:\n{HOST_LINE}");
    vec![
        row("block missing", format!("providers:\n  - {{name: kvm-home, type: {b}}}\n"), " block is required".into()),
        row("null block counts as missing", format!("providers:\n  - name: kvm-home\n    type: {b}\n    {b}:\n"), " block is required".into()),
        row("no sshKeyFile", kvm_edit(b, SSH_LINE, ""), ".sshKeyFile is required".into()),
        row("no knownHostsFile", kvm_edit(b, KNOWN_HOSTS_LINE, ""), format!(".knownHostsFile is required unless {b}.insecureIgnoreHostKey is true")),
        row("no knownHostsFile, not insecure", kvm_edit(b, KNOWN_HOSTS_LINE, "      insecureIgnoreHostKey: false\n"), format!(".knownHostsFile is required unless {b}.insecureIgnoreHostKey is true")),
        row("negative diskSizeGb", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      diskSizeGb: -1\n")), ".diskSizeGb must not be negative".into()),
        row("bad domainType", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      domainType: xen\n")), r#".domainType must be kvm or qemu (got "xen")"#.into()),
        row("image key ../etc/d", kvm_edit(b, "        debian-13:\n", "        ../etc/d:\n"), r#".images["../etc/d"]: key must be letters, digits, dots, dashes or underscores — it becomes part of the cached base volume's name"#.into()),
        row("bad image keys in sorted order", kvm_edit(b, "        debian-13:\n", &format!("        zz/bad:\n{URL_LINE}        aa/bad:\n{URL_LINE}        debian-13:\n")), r#".images["aa/bad"]: key must be"#.into()),
        row("ftp url", kvm_edit(b, URL_LINE, "          url: ftp://x\n"), format!(r#"{img}.url must be an http(s) URL (got "ftp://x")"#)),
        row("url without a host", kvm_edit(b, URL_LINE, "          url: 'http://'\n"), format!(r#"{img}.url must be an http(s) URL (got "http://")"#)),
        row("url that is not a url", kvm_edit(b, URL_LINE, "          url: not a url\n"), format!(r#"{img}.url must be an http(s) URL (got "not a url")"#)),
        row("image without a url", kvm_edit(b, URL_LINE, "          format: raw\n"), format!(r#"{img}.url must be an http(s) URL (got "")"#)),
        row("short sha256", kvm_edit(b, URL_LINE, &format!("{URL_LINE}          sha256: abc123\n")), format!("{img}.sha256 must be 64 hex characters")),
        row("non-hex sha256", kvm_edit(b, URL_LINE, &format!("{URL_LINE}          sha256: {}g\n", "a".repeat(63))), format!("{img}.sha256 must be 64 hex characters")),
        row("bad format", kvm_edit(b, URL_LINE, &format!("{URL_LINE}          format: vmdk\n")), format!(r#"{img}.format must be qcow2 or raw (got "vmdk")"#)),
        row("bad firmware", kvm_edit(b, URL_LINE, &format!("{URL_LINE}          firmware: coreboot\n")), format!(r#"{img}.firmware must be uefi or bios (got "coreboot")"#)),
        row("no machineTypes", kvm_edit(b, MACHINES, ""), ".machineTypes must define at least one profile".into()),
        row("empty machineTypes", kvm_edit(b, MACHINES, "      machineTypes: {}\n"), ".machineTypes must define at least one profile".into()),
        row("zero vcpus", kvm_edit(b, "{vcpus: 1,", "{vcpus: 0,"), r#".machineTypes["small"] needs vcpus > 0 and memoryMiB > 0"#.into()),
        row("no memory", kvm_edit(b, "{vcpus: 1, memoryMiB: 1024}", "{vcpus: 1}"), r#".machineTypes["small"] needs vcpus > 0 and memoryMiB > 0"#.into()),
        row("no hosts", kvm_edit(b, &hosts, ""), ".hosts must list at least one host".into()),
        row("empty hosts", kvm_edit(b, &hosts, "      hosts: []\n"), ".hosts must list at least one host".into()),
        row("host without a name", kvm_edit(b, "{name: beelink, ", "{"), ".hosts[0]: name is required".into()),
        row("host name with a slash", kvm_edit(b, "name: beelink", "name: dc1/rack2"), r#".hosts[0]: name "dc1/rack2" must be letters, digits, dots, dashes or underscores — it becomes part of the providerID hosts/<name>/domains/<vm>"#.into()),
        row("duplicate host name", kvm_edit(b, HOST_LINE, &format!("{HOST_LINE}{HOST_LINE}")), r#".hosts[1]: duplicate host name "beelink""#.into()),
        // Two hosts on one daemon would list each other's domains and race on one image cache.
        row("two hosts on one daemon", kvm_edit(b, HOST_LINE, &format!("{HOST_LINE}        - {{name: beelink-2, address: BEELINK:22, user: other, bridge: br1}}\n")), r#".hosts[1] "beelink-2": address "BEELINK:22" and socket "/var/run/libvirt/libvirt-sock" are those of host "beelink"; two hosts of one entry must reach two libvirt daemons"#.into()),
        row("host without an address", kvm_edit(b, "address: beelink:22, ", ""), r#".hosts[0] "beelink": address is required"#.into()),
        row("host without a user", kvm_edit(b, "user: novakj, ", ""), r#".hosts[0] "beelink": user is required"#.into()),
        row("host without a bridge", kvm_edit(b, ", bridge: br0", ""), r#".hosts[0] "beelink": bridge is required"#.into()),
        // The review's fixes (spec/kvm.md §13: M16, L12, L13, L20, L24).
        row("address without a port", kvm_edit(b, "address: beelink:22", "address: beelink"), r#".hosts[0] "beelink": address must be host:port (got "beelink")"#.into()),
        row("address with port 0", kvm_edit(b, "address: beelink:22", "address: beelink:0"), r#".hosts[0] "beelink": address must be host:port (got "beelink:0")"#.into()),
        row("bridge with a space", kvm_edit(b, "bridge: br0", "bridge: 'br 0'"), r#".hosts[0] "beelink": bridge "br 0" must be letters, digits, dots, dashes or underscores"#.into()),
        row("pool with a slash", kvm_edit(b, "bridge: br0", "bridge: br0, pool: ../images"), r#".hosts[0] "beelink": pool "../images" must be letters, digits, dots, dashes or underscores"#.into()),
        row("diskSizeGb that would overflow", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      diskSizeGb: 17179869184\n")), ".diskSizeGb must be at most 65536".into()),
        row("stallTimeoutSeconds under the floor", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      stallTimeoutSeconds: 4\n")), ".stallTimeoutSeconds must be between 5 and 600 (got 4)".into()),
        row("stallTimeoutSeconds over the ceiling", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      stallTimeoutSeconds: 601\n")), ".stallTimeoutSeconds must be between 5 and 600 (got 601)".into()),
        row("memory beyond any host", kvm_edit(b, "memoryMiB: 1024}", "memoryMiB: 99999999}"), r#".machineTypes["small"] needs vcpus <= 1024 and memoryMiB <= 4194304"#.into()),
        row("url with credentials", kvm_edit(b, URL_LINE, "          url: https://u:secret@mirror/x.qcow2\n"), format!("{img}.url must not carry credentials (user:password@): they would show in logs and errors")),
        row("multipart vendorData", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      vendorData: \"Content-Type: multipart/mixed; boundary=x\\n\\n--x\\n\"\n")), VENDOR_DATA_TAIL.into()),
        row("imageUrlHosts entry with a scheme", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      imageUrlHosts: [mirror.example, 'https://mirror.example']\n")), r#".imageUrlHosts[1] must be a host name or an IP address, without scheme, port or path (got "https://mirror.example")"#.into()),
        row("imageUrlHosts entry with a port", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      imageUrlHosts: ['10.0.0.5:8080']\n")), r#".imageUrlHosts[0] must be a host name or an IP address, without scheme, port or path (got "10.0.0.5:8080")"#.into()),
        row("vendorData cloud-init cannot classify", kvm_edit(b, SSH_LINE, &format!("{SSH_LINE}      vendorData: \"packages: [htop]\\n\"\n")), VENDOR_DATA_TAIL.into()),
    ]
}

#[test]
fn config_malformed_files_are_rejected_with_one_line() {
    let registry = registry();
    let mut rows = structural_rows();
    rows.extend(entry_rows());
    rows.extend(kvm_rows("kvm"));
    rows.extend(kvm_rows("kvm2"));
    assert!(rows.len() >= 25);

    let mut failures = Vec::new();
    for row in &rows {
        match ProvidersConfig::parse(&row.yaml, FILE, &registry) {
            Ok(loaded) => failures.push(format!("{}: accepted: {loaded:?}", row.what)),
            Err(err) => {
                let shown = err.to_string();
                println!("{:<50} {shown}", row.what);
                if !shown.starts_with("providers.yaml: ") || shown.contains(['\n', '\r']) || !shown.contains(&row.want)
                {
                    failures.push(format!("{}:\n   got: {shown}\n  want: {}", row.what, row.want));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
    println!("{} malformed rows", rows.len());
}

/// One valid file and what must be true of its model.
struct Good {
    what: &'static str,
    yaml: String,
    check: fn(&ProvidersConfig, &[String]),
}

fn good(what: &'static str, yaml: impl AsRef<str>, check: fn(&ProvidersConfig, &[String])) -> Good {
    Good {
        what,
        yaml: dedent(yaml.as_ref()),
        check,
    }
}

fn only(config: &ProvidersConfig) -> &ProviderConfig {
    assert_eq!(config.providers.len(), 1);
    &config.providers[0]
}

fn valid_rows() -> Vec<Good> {
    vec![
        good(
            "no createsPerMinute: the default budget",
            "providers:\n  - {name: k, type: kubernetes}\n",
            |c, _| {
                assert_eq!(only(c).creates_per_minute, None);
                assert_eq!(only(c).creates_per_minute(), 60);
            },
        ),
        good(
            "createsPerMinute set beside name and type",
            "providers:\n  - {name: k, type: kubernetes, createsPerMinute: 3}\n",
            |c, _| assert_eq!(only(c).creates_per_minute(), 3),
        ),
        good(
            "createsPerMinute in any case",
            "providers:\n  - {name: k, type: kubernetes, CreatesPerMinute: 120}\n",
            |c, _| assert_eq!(only(c).creates_per_minute, Some(120)),
        ),
        good(
            "createsPerMinute at its bounds",
            "providers:\n  - {name: a, type: kubernetes, createsPerMinute: 1}\n  - {name: b, type: kubernetes, createsPerMinute: 10000}\n",
            |c, _| {
                let budgets: Vec<u32> = c.providers.iter().map(|p| p.creates_per_minute()).collect();
                assert_eq!(budgets, [1, 10000]);
            },
        ),
        good(
            "createsPerMinute with no value is the default",
            "providers:\n  - name: k\n    type: kubernetes\n    createsPerMinute:\n",
            |c, _| assert_eq!(only(c).creates_per_minute(), 60),
        ),
        good(
            "local with defaults",
            "providers:\n  - {name: dev, type: local, local: {stateDir: /var/lib/egress-local}}\n",
            |c, w| {
                assert!(w.is_empty());
                let local = only(c).local().expect("a local block");
                assert_eq!(local.state_dir, "/var/lib/egress-local");
                assert_eq!(local.effective_tinyproxy_path(), "/usr/bin/tinyproxy");
            },
        ),
        good(
            "local with its own tinyproxy",
            "providers:\n  - {name: dev, type: local, local: {stateDir: /s, tinyproxyPath: /opt/tp/bin/tinyproxy}}\n",
            |_, _| {},
        ),
        good(
            "kubernetes minimal",
            "providers:\n  - {name: kubernetes, type: kubernetes}\n",
            |c, w| {
                assert!(w.is_empty());
                let e = only(c);
                assert_eq!((e.name.as_str(), e.type_name.as_str()), ("kubernetes", "kubernetes"));
                assert!(e.blocks_present().is_empty());
            },
        ),
        good(
            "kubernetes with an image",
            "providers:\n  - {name: k, type: kubernetes, kubernetes: {image: 'squid:7'}}\n",
            |c, _| {
                let image = only(c).kubernetes().and_then(|k| k.image);
                assert_eq!(image.as_deref(), Some("squid:7"));
            },
        ),
        good(
            "gcp minimal",
            "providers:\n  - {name: gcp-eu, type: gcp, gcp: {project: my-project}}\n",
            |c, _| {
                let gcp = only(c).gcp().expect("gcp block");
                assert_eq!(gcp.project, "my-project");
                assert_eq!((gcp.network.as_deref(), gcp.disk_size_gb), (None, None));
            },
        ),
        good("kvm minimal", kvm_yaml("kvm"), |c, _| {
            let e = only(c);
            let kvm = e.kvm().expect("kvm block");
            assert!(e.kvm2().is_none());
            assert_eq!(kvm.hosts[0].name, "beelink");
            assert_eq!(kvm.machine_types["small"].memory_mib, 1024);
            assert_eq!(kvm.effective_disk_size_gb(), 10);
            assert_eq!(kvm.effective_stall_timeout(), std::time::Duration::from_secs(30));
        }),
        good(
            "kvm2 with its own stall timeout",
            kvm_edit("kvm2", SSH_LINE, &format!("{SSH_LINE}      stallTimeoutSeconds: 90\n")),
            |c, _| {
                let kvm2 = only(c).kvm2().expect("kvm2 block");
                assert_eq!(kvm2.effective_stall_timeout(), std::time::Duration::from_secs(90));
            },
        ),
        good("kvm2 is parsed into the kvm2 block", kvm_yaml("kvm2"), |c, _| {
            let e = only(c);
            assert!(e.kvm().is_none());
            assert_eq!(e.blocks_present(), ["kvm2"]);
            assert_eq!(e.kvm2().map(|k| k.ssh_key_file), Some("/k/id".to_owned()));
        }),
        good(
            "kvm, insecure, no knownHostsFile",
            kvm_edit("kvm", KNOWN_HOSTS_LINE, "      insecureIgnoreHostKey: true\n"),
            |c, _| {
                let kvm = only(c).kvm().expect("kvm block");
                assert!(kvm.insecure_ignore_host_key && kvm.known_hosts_file.is_empty());
            },
        ),
        good(
            "kvm2 with every optional field",
            include_str!("data/providers/kvm2-all-fields.yaml"),
            |c, _| {
                let kvm = only(c).kvm2().expect("kvm2 block");
                assert_eq!((kvm.effective_domain_type(), kvm.effective_cpu_mode()), ("qemu", None));
                assert!(!kvm.effective_install_guest_agent());
                assert_eq!(kvm.images["debian-13.raw"].effective_firmware(), "bios");
                assert_eq!(kvm.hosts[0].effective_pool(), "images");
            },
        ),
        good(
            "empty domainType means kvm",
            kvm_edit("kvm", SSH_LINE, &format!("{SSH_LINE}      domainType: ''\n")),
            |c, _| {
                assert_eq!(
                    only(c).kvm().map(|k| k.effective_domain_type().to_owned()).as_deref(),
                    Some("kvm")
                );
            },
        ),
        good(
            "names that look like YAML 1.1 booleans or numbers",
            kvm_edit("kvm", "name: beelink", "name: no").replacen("small:", "1:", 1),
            |c, _| {
                let kvm = only(c).kvm().expect("kvm block");
                assert_eq!(kvm.hosts[0].name, "no");
                assert!(kvm.machine_types.contains_key("1"));
            },
        ),
        good(
            "the full example of providers.md 3.5",
            include_str!("data/providers/full-example.yaml"),
            |c, w| {
                assert!(w.is_empty());
                let names: Vec<_> = c.providers.iter().map(|e| e.name.as_str()).collect();
                assert_eq!(names, ["kubernetes", "gcp-eu", "kvm-home", "kvm2-home"]);
                assert!(c.providers[3].kvm2().is_some() && c.providers[3].kvm().is_none());
            },
        ),
        good("an empty list is accepted with a warning", "providers: []\n", |c, w| {
            assert!(c.providers.is_empty());
            assert_eq!(w, ["no providers are configured; only External proxies can be used"]);
        }),
        good(
            "every entry commented out",
            "providers:\n#  - {name: k, type: kubernetes}\n",
            |c, w| {
                assert!(c.providers.is_empty());
                assert_eq!(w.len(), 1);
            },
        ),
        good(
            "null blocks count as absent",
            "providers:\n  - name: k\n    type: kubernetes\n    gcp:\n    kvm2: ~\n",
            |c, _| {
                let e = only(c);
                assert!(e.gcp().is_none() && e.kvm2().is_none());
            },
        ),
        good(
            "merge keys are expanded",
            "providers:\n  - &k {name: a, type: kubernetes}\n  - <<: *k\n    name: b\n",
            |c, _| {
                assert_eq!(
                    (c.providers[1].name.as_str(), c.providers[1].type_name.as_str()),
                    ("b", "kubernetes")
                );
            },
        ),
        good(
            "anchors and aliases are allowed",
            "
            providers:
              - name: kvm-a
                type: kvm
                kvm: &shared
                  sshKeyFile: /k/id
                  insecureIgnoreHostKey: true
                  machineTypes: {small: {vcpus: 1, memoryMiB: 512}}
                  hosts: [{name: h1, address: 'h1:22', user: u, bridge: br0}]
              - name: kvm-b
                type: kvm2
                kvm2: *shared
            ",
            |c, _| assert_eq!(c.providers[0].kvm(), c.providers[1].kvm2()),
        ),
    ]
}

/// What the Go operator's loader took, and so must load here. It read the file with
/// `sigs.k8s.io/yaml` (seeds/000_5b40a21e69c953cd.txt:4225, `sigs.k8s.io/yaml v1.6.0` in go.mod)
/// through `UnmarshalStrict` (seeds/001_f9c7a0763cf33b5b.txt:7327-7328): YAML 1.1, converted to
/// JSON for `encoding/json`, which matches keys to fields without regard to case and leaves the
/// zero value for an absent or null document.
#[rustfmt::skip]
fn go_rows() -> Vec<Good> {
    let no_providers = |c: &ProvidersConfig, w: &[String]| {
        assert!(c.providers.is_empty());
        assert_eq!(w, ["no providers are configured; only External proxies can be used"]);
    };
    vec![
        // An empty document is JSON null, which leaves the config empty.
        good("an empty file", "", no_providers),
        good("only a comment", "# nothing here yet\n", no_providers),
        good("a null document", "~\n", no_providers),
        // An absent `providers` key leaves the list empty.
        good("an empty mapping", "{}\n", no_providers),
        good("keys in another case", "Providers:\n  - {Name: g, TYPE: gcp, Gcp: {Project: my-project, DiskSizeGB: 20}}\n", |c, _| {
            let e = only(c);
            let gcp = e.gcp().expect("the gcp block");
            assert_eq!((e.name.as_str(), e.type_name.as_str(), gcp.project.as_str(), gcp.disk_size_gb), ("g", "gcp", "my-project", Some(20)));
        }),
        // YAML 1.1 booleans, in a boolean field.
        good("insecureIgnoreHostKey: yes", kvm_edit("kvm", KNOWN_HOSTS_LINE, "      insecureIgnoreHostKey: yes\n"), |c, _| {
            assert!(only(c).kvm().expect("kvm").insecure_ignore_host_key);
        }),
        good("insecureIgnoreHostKey: Off", kvm_edit("kvm", KNOWN_HOSTS_LINE, &format!("{KNOWN_HOSTS_LINE}      insecureIgnoreHostKey: Off\n")), |c, _| {
            assert!(!only(c).kvm().expect("kvm").insecure_ignore_host_key);
        }),
        // ...and text in a string field: a network tag `no` stays "no" (the issue's rule; Go
        // made it "false").
        good("a string field holding no", "providers:\n  - {name: g, type: gcp, gcp: {project: my-project, networkTag: no}}\n", |c, _| {
            assert_eq!(only(c).gcp().expect("gcp").network_tag.as_deref(), Some("no"));
        }),
        // A key with no value is as good as absent: Go left the zero value.
        good("a field with no value", kvm_edit("kvm", KNOWN_HOSTS_LINE, &format!("{KNOWN_HOSTS_LINE}      insecureIgnoreHostKey:\n")), |c, _| {
            assert!(!only(c).kvm().expect("kvm").insecure_ignore_host_key);
        }),
        // A number in a string field is its text, as sigs.k8s.io/yaml converted it.
        good("a number in a string field", "providers:\n  - {name: g, type: gcp, gcp: {project: 12345}}\n", |c, _| {
            assert_eq!(only(c).gcp().expect("gcp").project, "12345");
        }),
        // Go did not check entry names at load; its health monitor warned and skipped the
        // ProviderHealth object (seeds/001_f9c7a0763cf33b5b.txt:6220-6221 and 7450). The loader
        // warns here, naming the entry, %q-quoted as every message is.
        good("an upper-case entry name", "providers:\n  - {name: Kvm-Home, type: kubernetes}\n", |c, w| {
            assert_eq!(only(c).name, "Kvm-Home");
            assert_eq!(w, [format!(r#"providers[0] "Kvm-Home": {NOT_DNS}"#)]);
        }),
        good("an underscore in an entry name", "providers:\n  - {name: ok, type: kubernetes}\n  - {name: kvm_home, type: kubernetes}\n", |c, w| {
            assert_eq!(c.providers[1].name, "kvm_home");
            assert_eq!(w, [format!(r#"providers[1] "kvm_home": {NOT_DNS}"#)]);
        }),
        good("a dotted entry name", "providers:\n  - {name: kvm.home, type: kubernetes}\n", |_, w| {
            assert_eq!(w, [format!(r#"providers[0] "kvm.home": {NOT_DNS_LABEL}"#)]);
        }),
        good("an entry name of 64 characters", format!("providers:\n  - {{name: {}, type: kubernetes}}\n", "a".repeat(64)), |c, w| {
            let long = "a".repeat(64);
            assert_eq!(only(c).name, long);
            // 64 characters still make an object name.
            assert_eq!(w, [format!(r#"providers[0] "{long}": {NOT_DNS_LABEL}"#)]);
        }),
        good("an entry name with a quote", "providers:\n  - {name: 'a\"b', type: kubernetes}\n", |_, w| {
            assert_eq!(w, [format!(r#"providers[0] "a\"b": {NOT_DNS}"#)]);
        }),
    ]
}

#[test]
fn what_the_go_loader_took_loads() {
    let registry = registry();
    for row in go_rows() {
        let loaded = ProvidersConfig::parse(&row.yaml, FILE, &registry)
            .unwrap_or_else(|e| panic!("{}: rejected: {e}\n{}", row.what, row.yaml));
        (row.check)(&loaded.config, &loaded.warnings);
    }
}

#[test]
fn config_valid_files_load() {
    let registry = registry();
    let rows = valid_rows();
    for row in &rows {
        let loaded = ProvidersConfig::parse(&row.yaml, FILE, &registry)
            .unwrap_or_else(|e| panic!("{}: rejected: {e}\n{}", row.what, row.yaml));
        (row.check)(&loaded.config, &loaded.warnings);
    }
    println!("{} valid rows", rows.len());
}

/// A path in the temp dir unique to this process and test.
fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("egress-provider-config-{}-{tag}.yaml", std::process::id()))
}

#[test]
fn config_load_reads_a_file() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/providers/full-example.yaml");
    let config = ProvidersConfig::load(&path, &registry()).expect("loads");
    assert_eq!(config.providers.len(), 4);
}

#[test]
fn config_load_of_a_missing_file_names_the_path() {
    let path = temp_path("missing");
    let err = ProvidersConfig::load(&path, &registry()).expect_err("missing file");
    let shown = err.to_string();
    assert!(shown.starts_with(&path.display().to_string()), "{shown}");
    assert!(shown.contains("cannot read the providers config"), "{shown}");
    assert!(shown.contains("os error 2"), "{shown}");
}

/// A pipe nobody writes to at `--providers-config` would hang the start; it is refused at once
/// (nextest's timeout fails a load that waits), as a directory is.
#[test]
fn config_load_refuses_a_pipe_or_a_directory_at_once() {
    let dir = egress_testkit::ScratchDir::new("providers-config-odd");
    let pipe = dir.path().join("providers.yaml");
    egress_testkit::make_fifo(&pipe);
    for odd in [pipe.as_path(), dir.path()] {
        let shown = ProvidersConfig::load(odd, &registry())
            .expect_err("no regular file")
            .to_string();
        assert_eq!(
            shown,
            format!(
                "{}: cannot read the providers config: not a regular file",
                odd.display()
            )
        );
    }
}

#[test]
fn config_load_refuses_a_file_over_one_mib() {
    let path = temp_path("huge");
    let mut text = String::from("providers: []\n");
    text.push_str(&format!("# {}\n", "x".repeat(1024 * 1024)));
    std::fs::write(&path, &text).expect("write temp file");
    let result = ProvidersConfig::load(&path, &registry());
    std::fs::remove_file(&path).expect("remove temp file");
    let shown = result.expect_err("too big").to_string();
    assert!(shown.contains("1 MiB"), "{shown}");
    assert!(!shown.contains('\n'));
}

#[test]
fn config_load_accepts_a_file_just_under_the_cap() {
    let path = temp_path("big");
    let mut text = String::from("providers: []\n# ");
    text.push_str(&"x".repeat(1024 * 1024 - text.len() - 1));
    text.push('\n');
    assert_eq!(text.len(), 1024 * 1024);
    std::fs::write(&path, &text).expect("write temp file");
    let result = ProvidersConfig::load(&path, &registry());
    std::fs::remove_file(&path).expect("remove temp file");
    assert!(result.expect("exactly 1 MiB loads").providers.is_empty());
}

#[test]
fn config_load_refuses_a_file_that_is_not_utf8() {
    let path = temp_path("latin1");
    std::fs::write(&path, b"providers:\n  - {name: caf\xe9, type: kubernetes}\n").expect("write temp file");
    let result = ProvidersConfig::load(&path, &registry());
    std::fs::remove_file(&path).expect("remove temp file");
    let shown = result.expect_err("not UTF-8").to_string();
    assert!(shown.contains("the file is not valid UTF-8"), "{shown}");
}

#[test]
fn the_complete_example_of_the_config_doc_loads() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md")).unwrap();
    let section = &doc[doc.find("## A complete example").expect("the section")..];
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let yaml = &section[start..start + section[start..].find("```").unwrap()];
    let loaded = ProvidersConfig::parse(yaml, FILE, &registry()).unwrap_or_else(|e| panic!("{e}"));
    let kubernetes = loaded
        .config
        .providers
        .iter()
        .find(|p| p.type_name == "kubernetes")
        .and_then(|p| p.kubernetes())
        .and_then(|k| k.access)
        .expect("the example sets kubernetes.access");
    assert_eq!(kubernetes.connect_ports.as_deref(), Some(&[443, 8443][..]));
}

/// What loading one of the Go operator's files must give.
enum GoOutcome {
    /// It loads, and the check holds.
    Loads(fn(&ProvidersConfig)),
    /// It fails, with a message holding what Go's held.
    Fails(&'static str),
}

/// Indents every non-empty line of `body` (after its leading line breaks) by `n` spaces, as the
/// Go tests' `indent` helper did (seeds/000_5b40a21e69c953cd.txt:4467-4470).
fn go_indent(body: &str, n: usize) -> String {
    let pad = " ".repeat(n);
    body.trim_start_matches('\n')
        .split('\n')
        .map(|l| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{pad}{l}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The Go tests' `minimal`: one entry of type `block` named `name`, its block `body`.
fn go_minimal(block: &str, name: &str, body: &str) -> String {
    format!(
        "providers:\n  - name: {name}\n    type: {block}\n    {block}:\n{}",
        go_indent(body, 6)
    )
}

/// The Go tests' `hostsAndTypes`.
const GO_HOSTS_AND_TYPES: &str = "\nmachineTypes:\n  small: {vcpus: 1, memoryMiB: 1024}\nhosts:\n  - {name: nas1, address: nas1:22, user: virt, bridge: br0}\n";
const GO_ONE_TYPE: &str = "machineTypes:\n  small: {vcpus: 1, memoryMiB: 1024}\n";
const GO_ONE_HOST: &str = "hosts:\n  - {name: nas1, address: nas1:22, user: virt, bridge: br0}\n";

/// The failing fixtures of Go's `config_test.go` (`TestLoadConfig_kvmInvalid`,
/// seeds/001_f9c7a0763cf33b5b.txt:9613-9739; `TestLoadConfig_kvm2Invalid` and the cross-block
/// rows, seeds/000_5b40a21e69c953cd.txt:4402-4494), each with the text Go's error held.
#[rustfmt::skip]
fn go_failing_fixtures() -> Vec<(String, String, &'static str)> {
    let kvm = |body: &str| go_minimal("kvm", "kvm-home", body);
    let kvm2 = |body: &str| go_minimal("kvm2", "kvm2-home", body);
    let keys = "sshKeyFile: /key\nknownHostsFile: /kh\n";
    let row = |what: &str, yaml: String, want: &'static str| (what.to_owned(), yaml, want);
    vec![
        row("kvm: missing kvm block", "providers:\n  - name: kvm-home\n    type: kvm\n".into(), "kvm block is required"),
        row("kvm: missing sshKeyFile", kvm(&format!("knownHostsFile: /kh\n{GO_HOSTS_AND_TYPES}")), "kvm.sshKeyFile is required"),
        row("kvm: missing knownHostsFile", kvm(&format!("sshKeyFile: /key\n{GO_HOSTS_AND_TYPES}")), "kvm.knownHostsFile is required unless"),
        row("kvm: negative disk size", kvm(&format!("{keys}diskSizeGb: -1\n{GO_HOSTS_AND_TYPES}")), "diskSizeGb must not be negative"),
        row("kvm: no machine types", kvm(&format!("{keys}{GO_ONE_HOST}")), "machineTypes must define at least one"),
        row("kvm: machine type with zero memory", kvm(&format!("{keys}machineTypes:\n  small: {{vcpus: 1}}\n{GO_ONE_HOST}")), r#"machineTypes["small"] needs vcpus > 0 and memoryMiB > 0"#),
        row("kvm: no hosts", kvm(&format!("{keys}{GO_ONE_TYPE}")), "kvm.hosts must list at least one host"),
        row("kvm: duplicate host name", kvm(&format!("{keys}{GO_ONE_TYPE}hosts:\n  - {{name: nas1, address: a:22, user: virt, bridge: br0}}\n  - {{name: nas1, address: b:22, user: virt, bridge: br0}}\n")), r#"duplicate host name "nas1""#),
        row("kvm: host name with a slash", kvm(&format!("{keys}{GO_ONE_TYPE}hosts:\n  - {{name: dc1/rack2, address: a:22, user: virt, bridge: br0}}\n")), r#"name "dc1/rack2" must be letters, digits, dots, dashes or underscores"#),
        row("kvm: image key with a slash", kvm(&format!("{keys}images:\n  ../etc/d: {{url: https://x/y.qcow2}}\n{GO_HOSTS_AND_TYPES}")), r#"images["../etc/d"]: key must be letters, digits, dots, dashes or underscores"#),
        row("kvm: host missing address", kvm(&format!("{keys}{GO_ONE_TYPE}hosts:\n  - {{name: nas1, user: virt, bridge: br0}}\n")), "address is required"),
        row("kvm: host missing user", kvm(&format!("{keys}{GO_ONE_TYPE}hosts:\n  - {{name: nas1, address: a:22, bridge: br0}}\n")), "user is required"),
        row("kvm: host missing bridge", kvm(&format!("{keys}{GO_ONE_TYPE}hosts:\n  - {{name: nas1, address: a:22, user: virt}}\n")), "bridge is required"),
        row("kvm: image with a non-http url", kvm(&format!("{keys}images:\n  d: {{url: file:///tmp/x.qcow2}}\n{GO_HOSTS_AND_TYPES}")), r#"images["d"].url must be an http(s) URL"#),
        row("kvm: image with a bad sha256", kvm(&format!("{keys}images:\n  d: {{url: https://x/y.qcow2, sha256: abc}}\n{GO_HOSTS_AND_TYPES}")), r#"images["d"].sha256 must be 64 hex characters"#),
        row("kvm: image with an unknown firmware", kvm(&format!("{keys}images:\n  d: {{url: https://x/y.qcow2, firmware: coreboot}}\n{GO_HOSTS_AND_TYPES}")), r#"images["d"].firmware must be uefi or bios"#),
        row("kvm: image with an unknown format", kvm(&format!("{keys}images:\n  d: {{url: https://x/y.vmdk, format: vmdk}}\n{GO_HOSTS_AND_TYPES}")), r#"images["d"].format must be qcow2 or raw"#),
        row("kvm type with a gcp block", "\nproviders:\n  - name: p1\n    type: kvm\n    gcp:\n      project: my-project".into(), "type is kvm but a gcp block is set"),
        row("gcp type with a kvm block", "\nproviders:\n  - name: p1\n    type: gcp\n    gcp:\n      project: my-project\n    kvm:\n      sshKeyFile: /key".into(), "type is gcp but a kvm block is set"),
        // Only the end of this row is in the seeds (`image: custom-image`); its start is the
        // shape of the rows around it.
        row("gcp type with a kubernetes block", "\nproviders:\n  - name: p1\n    type: gcp\n    gcp:\n      project: my-project\n    kubernetes:\n     image: custom-image".into(), "type is gcp but a kubernetes block is set"),
        row("kvm type with a kvm2 block", "\nproviders:\n  - name: p1\n    type: kvm\n    kvm2:\n      sshKeyFile: /key".into(), "type is kvm but a kvm2 block is set"),
        row("kvm2 type with a kvm block", "\nproviders:\n  - name: p1\n    type: kvm2\n    kvm:\n      sshKeyFile: /key".into(), "type is kvm2 but a kvm block is set"),
        row("kvm2: missing kvm2 block", "providers:\n  - name: kvm2-home\n    type: kvm2\n".into(), "kvm2 block is required"),
        row("kvm2: missing sshKeyFile", kvm2(&format!("knownHostsFile: /kh\n{GO_HOSTS_AND_TYPES}")), "kvm2.sshKeyFile is required"),
        row("kvm2: missing knownHostsFile", kvm2(&format!("sshKeyFile: /key\n{GO_HOSTS_AND_TYPES}")), "kvm2.knownHostsFile is required unless kvm2.insecureIgnoreHostKey is true"),
        row("kvm2: no machine types", kvm2(&format!("{keys}{GO_ONE_HOST}")), "kvm2.machineTypes must define at least one"),
        row("kvm2: no hosts", kvm2(&format!("{keys}{GO_ONE_TYPE}")), "kvm2.hosts must list at least one host"),
        row("kvm2: duplicate host name", kvm2(&format!("{keys}{GO_ONE_TYPE}hosts:\n  - {{name: nas1, address: a:22, user: virt, bridge: br0}}\n  - {{name: nas1, address: b:22, user: virt, bridge: br0}}\n")), r#"kvm2.hosts[1]: duplicate host name "nas1""#),
        row("kvm2: image key with a slash", kvm2(&format!("{keys}images:\n  ../etc/d: {{url: https://x/y.qcow2}}\n{GO_HOSTS_AND_TYPES}")), r#"kvm2.images["../etc/d"]: key must be letters, digits, dots, dashes or underscores"#),
    ]
}

/// Every providers file the seeds show the Go operator shipping, documenting or loading in its
/// tests (tests/data/go/README.md lists them with their seed lines) loads here, or fails with
/// the message Go gave; so do the variants Go's tests derived from its fixture.
#[test]
fn every_providers_file_the_go_operator_showed_loads() {
    let registry = registry();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/go");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let fixture = read("fixture-kvm.yaml");
    let files: Vec<(String, String, GoOutcome)> = vec![
        (
            "manager-configmap.yaml".into(),
            read("manager-configmap.yaml"),
            GoOutcome::Loads(|c| {
                let names: Vec<_> = c
                    .providers
                    .iter()
                    .map(|e| (e.name.as_str(), e.type_name.as_str()))
                    .collect();
                assert_eq!(
                    names,
                    [("kubernetes", "kubernetes"), ("kvm-home", "kvm"), ("kvm2-home", "kvm2")]
                );
                assert_eq!(c.providers[1].kvm(), c.providers[2].kvm2());
            }),
        ),
        (
            "samples-kvm.yaml".into(),
            read("samples-kvm.yaml"),
            GoOutcome::Loads(|c| {
                assert_eq!(only(c).kvm().expect("kvm").hosts[0].address, "beelink:22");
            }),
        ),
        (
            "docs-kvm.yaml".into(),
            read("docs-kvm.yaml"),
            GoOutcome::Loads(|c| {
                assert_eq!(only(c).kvm().expect("kvm").hosts[0].name, "nas1");
            }),
        ),
        (
            "docs-kvm2.yaml".into(),
            read("docs-kvm2.yaml"),
            GoOutcome::Loads(|c| {
                assert_eq!(only(c).kvm2().expect("kvm2").machine_types.len(), 1);
            }),
        ),
        (
            "design-kvm.yaml".into(),
            read("design-kvm.yaml"),
            GoOutcome::Fails(r#"images["debian-13"].sha256 must be 64 hex characters"#),
        ),
        // What TestLoadConfig_kvmValid checked (seeds/001_f9c7a0763cf33b5b.txt:9576-9601).
        (
            "fixture-kvm.yaml".into(),
            fixture.clone(),
            GoOutcome::Loads(|c| {
                let k = only(c).kvm().expect("kvm");
                assert_eq!(
                    (k.ssh_key_file.as_str(), k.disk_size_gb),
                    ("/etc/proxy-operator/kvm/id_ed25519", 20)
                );
                assert!(k.images["debian-13"].sha256.starts_with("0123"));
                assert_eq!(k.images["ubuntu"].format, "raw");
                let medium = &k.machine_types["medium"];
                assert_eq!((medium.vcpus, medium.memory_mib), (2, 2048));
                assert_eq!(
                    (k.hosts.len(), k.hosts[1].socket.as_str(), k.hosts[1].pool.as_str()),
                    (2, "/run/libvirt/virtqemud-sock", "fast")
                );
            }),
        ),
        // TestLoadConfig_kvmInsecureHostKeyNeedsNoKnownHosts (9603-9611).
        (
            "fixture-kvm.yaml, insecure".into(),
            fixture.replacen(
                "knownHostsFile: /etc/proxy-operator/kvm/known_hosts",
                "insecureIgnoreHostKey: true",
                1,
            ),
            GoOutcome::Loads(|c| {
                assert!(only(c).kvm().expect("kvm").insecure_ignore_host_key);
            }),
        ),
        // TestLoadConfig_kvm2Valid (seeds/000_5b40a21e69c953cd.txt:4374-4400).
        (
            "fixture-kvm.yaml as kvm2".into(),
            fixture.replacen("type: kvm\n    kvm:\n", "type: kvm2\n    kvm2:\n", 1),
            GoOutcome::Loads(|c| {
                let e = only(c);
                assert!(e.kvm().is_none());
                let k = e.kvm2().expect("kvm2");
                assert_eq!((k.hosts[0].name.as_str(), k.hosts[1].pool.as_str()), ("nas1", "fast"));
            }),
        ),
    ];
    let fixtures = go_failing_fixtures()
        .into_iter()
        .map(|(what, yaml, want)| (what, yaml, GoOutcome::Fails(want)));
    for (what, yaml, outcome) in files.into_iter().chain(fixtures) {
        let loaded = ProvidersConfig::parse(&yaml, FILE, &registry);
        match (outcome, loaded) {
            (GoOutcome::Loads(check), Ok(loaded)) => {
                assert!(loaded.warnings.is_empty(), "{what}: {:?}", loaded.warnings);
                check(&loaded.config);
            }
            (GoOutcome::Fails(want), Err(e)) => {
                assert!(
                    e.to_string().contains(want),
                    "{what}: {e}\nwant a message holding {want:?}"
                );
            }
            (GoOutcome::Loads(_), Err(e)) => panic!("{what}: Go loaded it, refused here: {e}\n{yaml}"),
            (GoOutcome::Fails(want), Ok(_)) => panic!("{what}: Go refused it ({want}), loaded here\n{yaml}"),
        }
    }
}

/// An entry of `type` (`kvm` or `kvm2`) named `name` on host `host` (`hv` when it is `hv:22`)
/// with one image `key` at `url`, in flow form.
fn libvirt_entry(type_name: &str, name: &str, address: &str, key: &str, url: &str) -> String {
    format!(
        "  - {{name: {name}, type: {type_name}, {type_name}: {{sshKeyFile: /k, knownHostsFile: /kh, \
         machineTypes: {{small: {{vcpus: 1, memoryMiB: 1024}}}}, \
         hosts: [{{name: h, address: '{address}', user: u, bridge: br0}}], images: {{'{key}': {{url: '{url}'}}}}}}}}\n"
    )
}

/// H4 at load: entries whose hosts share a storage pool must not give one base volume name to
/// two images (kvm names bases by key alone; kvm2 by entry and key, with a dash between that
/// either may contain); the same image under one name is shared, fenced by the fill leases.
#[test]
fn entries_sharing_a_pool_are_refused_only_where_two_images_would_share_a_base_name() {
    let registry = registry();
    let (one, two) = ("https://m/one.qcow2", "https://m/two.qcow2");
    let hex = "0123456789abcdef0123456789abcdef";
    let refused = [
        (
            vec![libvirt_entry("kvm2", "a", "hv:22", "b-c", one), libvirt_entry("kvm2", "a-b", "hv:22", "c", two)],
            r#"providers[1] "a-b": base volume "base-a-b-c.qcow2" in pool "default" of "hv:22" (/var/run/libvirt/libvirt-sock) would hold both image "c" of providers[1] "a-b" (host "h") and image "b-c" (another URL or digest) of providers[0] "a"; rename the key or one of the entries"#.to_owned(),
        ),
        (
            vec![libvirt_entry("kvm2", "a", "hv:22", "d", one), libvirt_entry("kvm2", "a-url", "HV:22", hex, two)],
            format!(r#"providers[1] "a-url": base volume "base-a-url-{hex}.qcow2" in pool "default" of "hv:22" (/var/run/libvirt/libvirt-sock) would hold both image "{hex}" of providers[1] "a-url" (host "h") and an image its Proxies give by URL of providers[0] "a""#),
        ),
        (
            vec![libvirt_entry("kvm", "k1", "hv:22", "debian", one), libvirt_entry("kvm", "k2", "hv:22", "debian", two)],
            r#"providers[1] "k2": base volume "base-debian.qcow2" in pool "default" of "hv:22""#.to_owned(),
        ),
        (
            vec![
                libvirt_entry("kvm", "k", "hv:22", "k2-debian", one),
                libvirt_entry("kvm2", "k2", "hv:22", "debian", two),
            ],
            r#"providers[1] "k2": base volume "base-k2-debian.qcow2""#.to_owned(),
        ),
    ];
    for (entries, want) in refused {
        let yaml = format!("providers:\n{}", entries.concat());
        let e = ProvidersConfig::parse(&yaml, FILE, &registry)
            .expect_err(&yaml)
            .to_string();
        assert!(e.contains(&want), "{e}\nwanted {want}");
    }
    let accepted = [
        // One image under one name: a shared cache.
        vec![
            libvirt_entry("kvm", "k1", "hv:22", "debian", one),
            libvirt_entry("kvm", "k2", "hv:22", "debian", one),
        ],
        // The clashing names on two hypervisors.
        vec![
            libvirt_entry("kvm2", "a", "hv1:22", "b-c", one),
            libvirt_entry("kvm2", "a-b", "hv2:22", "c", two),
        ],
        // kvm's base-<key> and kvm2's base-<entry>-<key> apart.
        vec![
            libvirt_entry("kvm", "k", "hv:22", "debian", one),
            libvirt_entry("kvm2", "k2", "hv:22", "debian", two),
        ],
    ];
    for entries in accepted {
        let yaml = format!("providers:\n{}", entries.concat());
        ProvidersConfig::parse(&yaml, FILE, &registry).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    }
}
