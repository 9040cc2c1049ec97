//! `cargo xtask image [--debug] [--tag T]`: the operator's image (the gateway's too: one image)
//! built without any registry, and saved as an OCI archive that `podman load`, `docker load`
//! and `skopeo copy oci-archive:` accept.
//!
//! ```text
//!  cargo build (host, bookworm's glibc) ─► target/image/context/{bin,licenses}
//!  debian:bookworm-slim absent? ─► mmdebstrap ─► podman import (tagged as the FROM line names it)
//!  podman build --pull=never --target prebuilt -f deploy/Dockerfile ─► podman save --format oci-archive
//! ```
//!
//! podman runs with a containers.conf of its own (`target/image/containers.conf`): runc, since
//! crun refuses these machines' hybrid cgroups, and no default ulimits, which the sandbox
//! refuses to raise. Builds use the host's network (the runtime stage runs apt).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

/// The image's repository name, as `podman images` shows it.
pub(crate) const REPOSITORY: &str = "localhost/egress-proxies-operator";
/// The base the Dockerfile's runtime stage names.
const BASE: &str = "docker.io/library/debian:bookworm-slim";
/// The Debian packages the build needs: podman and what it runs with, mmdebstrap for the base,
/// binutils' strip for the binaries, skopeo to read the archive back as a registry push would.
pub(crate) const PACKAGES: &[&str] = &["podman", "runc", "catatonit", "mmdebstrap", "binutils", "skopeo"];
/// The licence files the image must carry: the Rust crates' list, and a Debian copyright file
/// of a library the runtime layer adds.
const LICENCE_FILES: &[&str] = &[
    "/usr/share/doc/egress-proxies-operator/rust-crates.tsv",
    "/usr/share/doc/libvirt0/copyright",
];
/// The binaries the image ships.
const BINARIES: &[&str] = &["egress-operator", "egress-gateway"];

/// What was built.
#[derive(Debug, Clone)]
pub(crate) struct Built {
    /// `REPOSITORY:tag`.
    pub(crate) image: String,
    /// The OCI archive.
    pub(crate) archive: PathBuf,
}

/// Where everything this module writes goes.
fn dir(root: &Path) -> PathBuf {
    crate::target_dir(root).join("image")
}

/// podman's settings for these machines, where [`podman`] and the tests find them.
fn write_containers_conf(root: &Path) -> Result<()> {
    std::fs::create_dir_all(dir(root))?;
    std::fs::write(
        dir(root).join("containers.conf"),
        "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n",
    )?;
    Ok(())
}

/// `podman`, with this module's containers.conf.
pub(crate) fn podman(root: &Path) -> Command {
    let mut cmd = Command::new("podman");
    cmd.env("CONTAINERS_CONF", dir(root).join("containers.conf"));
    cmd
}

/// Builds the image from binaries built now (release), or from the debug ones `cargo build
/// --workspace` made (`release` false, as the test command does: a release build would cost
/// CI minutes), and saves it.
pub(crate) fn build(root: &Path, release: bool, tag: &str) -> Result<Built> {
    crate::system::require_packages(PACKAGES)?;
    write_containers_conf(root)?;
    let context = prepare_context(root, release)?;
    ensure_base(root)?;
    let image = format!("{REPOSITORY}:{tag}");
    checked(
        podman(root)
            .args(["build", "--pull=never", "--network", "host", "--target", "prebuilt"])
            .arg("--file")
            .arg(root.join("deploy/Dockerfile"))
            .args(["--tag", &image])
            .arg(&context),
    )?;
    let archive = dir(root).join("egress-proxies-operator.oci.tar");
    let _ = std::fs::remove_file(&archive);
    checked(
        podman(root)
            .args(["save", "--format", "oci-archive", "--output"])
            .arg(&archive)
            .arg(&image),
    )?;
    copies_with_skopeo(root, &archive)?;
    Ok(Built { image, archive })
}

/// The archive read back whole by skopeo, as the install guide's `skopeo copy oci-archive:...
/// docker://REGISTRY/...` reads it (every blob against its digest), into a directory: no
/// registry runs here.
fn copies_with_skopeo(root: &Path, archive: &Path) -> Result<()> {
    let copy = dir(root).join("skopeo-copy");
    let _ = std::fs::remove_dir_all(&copy);
    let copied = checked(
        Command::new("skopeo")
            .args(["copy", "--quiet"])
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(format!("dir:{}", copy.display())),
    )
    .context("skopeo does not take the archive");
    let _ = std::fs::remove_dir_all(&copy);
    copied.map(drop)
}

/// The build context: the binaries (debug sections stripped: they only cost size) and the
/// licence list.
fn prepare_context(root: &Path, release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    if release {
        let mut args = vec!["build", "--release", "--locked"];
        for b in BINARIES {
            args.extend(["--bin", b]);
        }
        crate::cargo(root, &args)?;
    } else {
        // As `cargo xtask dev` builds them: nothing to do after `cargo build --workspace`.
        crate::cargo(root, &["build", "--workspace", "--bins"])?;
    }
    let context = dir(root).join("context");
    let _ = std::fs::remove_dir_all(&context);
    std::fs::create_dir_all(context.join("bin"))?;
    std::fs::create_dir_all(context.join("licenses"))?;
    for b in BINARIES {
        let built = crate::target_dir(root).join(profile).join(b);
        if !built.exists() {
            bail!("{} is not built: run cargo build --workspace first", built.display());
        }
        checked(
            Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(context.join("bin").join(b))
                .arg(&built),
        )?;
    }
    std::fs::copy(
        root.join(crate::licenses::FILE),
        context.join("licenses").join("rust-crates.tsv"),
    )
    .context("copying the licence list")?;
    Ok(context)
}

/// Makes the Debian base with mmdebstrap and imports it under the name the Dockerfile's FROM
/// line uses, unless it is there already (pulled, or made before). Like Debian's slim images:
/// minbase, without manuals, locales and documentation except the copyright files.
fn ensure_base(root: &Path) -> Result<()> {
    if podman(root).args(["image", "exists", BASE]).status()?.success() {
        return Ok(());
    }
    let tarball = dir(root).join("bookworm-slim.tar");
    let mirror = "http://deb.debian.org/debian";
    checked(
        Command::new("mmdebstrap")
            .args(["--variant=minbase", "--quiet"])
            .args([
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
            ])
            .args([
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            ])
            .arg("bookworm")
            .arg(&tarball)
            .arg(format!("deb {mirror} bookworm main"))
            .arg(format!("deb {mirror} bookworm-updates main"))
            .arg("deb http://deb.debian.org/debian-security bookworm-security main"),
    )?;
    checked(
        podman(root)
            .args(["import", "--change", "CMD [\"bash\"]"])
            .arg(&tarball)
            .arg(BASE),
    )?;
    let _ = std::fs::remove_file(&tarball);
    Ok(())
}

/// Prints the image's size and the Debian packages its runtime layer adds to the base, and
/// checks that the operator and the gateway start in it (their shared libraries are there:
/// `-version` prints the commit they were built from) and that it carries its licences.
pub(crate) fn describe(root: &Path, built: &Built) -> Result<()> {
    let size = text(checked(
        podman(root)
            .args(["image", "inspect", "--format", "{{.Size}}"])
            .arg(&built.image),
    )?);
    let size: u64 = size.trim().parse().context("the image's size")?;
    let base = packages(root, BASE)?;
    let added: Vec<String> = packages(root, &built.image)?
        .into_iter()
        .filter(|p| !base.contains(p))
        .collect();
    let commit = starts_with_its_licences(root, &built.image)?;
    println!(
        "xtask: image {} ({} MB; the operator of commit {}), archive {}",
        built.image,
        size / 1_000_000,
        commit,
        built.archive.display()
    );
    println!(
        "xtask: the runtime layer adds {} Debian packages: {}",
        added.len(),
        added.join(" ")
    );
    Ok(())
}

/// The commit the operator in `image` was built from (its `-version`), once it and the gateway
/// have started there (their shared libraries are in the image) and its licence files are found.
fn starts_with_its_licences(root: &Path, image: &str) -> Result<String> {
    let commit = run_in(root, image, None, &["-version"]).context("the operator does not start in the image")?;
    run_in(root, image, Some("/usr/local/bin/egress-gateway"), &["-version"])
        .context("the gateway does not start in the image")?;
    for file in LICENCE_FILES {
        run_in(root, image, Some("test"), &["-s", file]).with_context(|| format!("the image lacks {file}"))?;
    }
    Ok(text(commit).trim().to_owned())
}

/// `podman run` of `image` with no network, `entrypoint` in place of the image's own when given,
/// and `args`; its output when it exits 0.
fn run_in(root: &Path, image: &str, entrypoint: Option<&str>, args: &[&str]) -> Result<Output> {
    let mut cmd = podman(root);
    cmd.args(["run", "--rm", "--network", "none"]);
    if let Some(entrypoint) = entrypoint {
        cmd.args(["--entrypoint", entrypoint]);
    }
    checked(cmd.arg(image).args(args))
}

/// The Debian packages in `image`, as `name version`.
fn packages(root: &Path, image: &str) -> Result<Vec<String>> {
    let out = run_in(
        root,
        image,
        Some("dpkg-query"),
        &["-W", "-f=${binary:Package} ${Version}\\n"],
    )?;
    Ok(text(out).lines().map(str::to_owned).collect())
}

fn text(out: Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd`, its error output passed through; fails with what it said when it fails.
fn checked(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(out)
}

/// The test command's image step: the image built from the debug binaries (a release build
/// would cost CI minutes; the runtime layer is the same), described, then the shipped-install
/// test (`crates/e2e/tests/shipped_install`) run against it on its own. Returns cargo's status
/// and the test's counts.
pub(crate) fn test_shipped_install(root: &Path) -> Result<(std::process::ExitStatus, crate::tally::Counts)> {
    let built = build(root, false, "test")?;
    describe(root, &built)?;
    let mut cmd = Command::new(crate::cargo_bin());
    cmd.args(["test", "-p", "egress-e2e", "--test", "shipped_install"])
        .current_dir(root)
        .env(egress_testkit::real::REQUIRED_ENV, "1")
        .env("EGRESS_TEST_IMAGE", &built.image)
        .env("EGRESS_TEST_IMAGE_ARCHIVE", &built.archive)
        .env("CONTAINERS_CONF", dir(root).join("containers.conf"));
    crate::tally::run_counting(&mut cmd).context("running the shipped-install test")
}
