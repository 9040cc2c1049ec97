//! The one read of a file from a path: [`read_regular_file`].
//!
//! A path a user gives may name something that is not a file at all. A pipe would stall the
//! open, and then the read, until something writes to it; a device (`/dev/zero`) might never
//! end; a directory cannot be read. So the file is opened without waiting (`O_NONBLOCK`: a pipe
//! opens at once that way), and the opened file itself is looked at (`fstat`), so nothing put
//! in the path's place between a look and the open can slip through. Only a regular file is
//! read, through a cap, so a file that grows while it is read stays bounded. A symlink is
//! followed (a Secret volume's files are symlinks through `..data`).

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// Why the file at a path cannot be read: the path and what is wrong, never what the file holds.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct ReadError {
    /// The path as given.
    pub path: PathBuf,
    /// What is wrong.
    pub problem: Problem,
}

/// What is wrong with a file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// Opening or reading it failed (it is missing, say, or may not be read): what the system
    /// said.
    #[error(transparent)]
    Io(std::io::Error),
    /// It is a pipe, a device, a socket or a directory.
    #[error("not a regular file")]
    NotRegular,
    /// It holds more than the cap.
    #[error("larger than {}", size(*max))]
    TooLarge {
        /// The cap, in bytes.
        max: u64,
    },
}

impl ReadError {
    /// Whether nothing is at the path (a dangling symlink included): a Secret volume's file may
    /// not be there yet.
    pub fn is_not_found(&self) -> bool {
        matches!(&self.problem, Problem::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The regular file at `path` (symlinks followed), read whole: at most `max` bytes.
///
/// Blocking; from async code, see [`read_regular_file_async`].
///
/// # Errors
///
/// The file cannot be opened or read ([`Problem::Io`]), is not a regular file
/// ([`Problem::NotRegular`]: refused without reading a byte), or holds more than `max` bytes
/// ([`Problem::TooLarge`]: found reading at most one byte more).
pub fn read_regular_file(path: impl AsRef<Path>, max: u64) -> Result<Vec<u8>, ReadError> {
    let path = path.as_ref();
    let fail = |problem| ReadError {
        path: path.to_owned(),
        problem,
    };
    // NB: NOCTTY too: a terminal named by mistake must not become the process's controlling
    // terminal when it opens it.
    let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits().cast_signed())
        .open(path)
        .map_err(|e| fail(Problem::Io(e)))?;
    if !file.metadata().map_err(|e| fail(Problem::Io(e)))?.is_file() {
        return Err(fail(Problem::NotRegular));
    }
    // Reading a regular file never waits, whatever O_NONBLOCK says.
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| fail(Problem::Io(e)))?;
    if bytes.len() as u64 > max {
        return Err(fail(Problem::TooLarge { max }));
    }
    Ok(bytes)
}

/// [`read_regular_file`] on a thread that may block.
///
/// # Errors
///
/// As [`read_regular_file`]; and [`Problem::Io`] when the runtime shuts down under the read.
///
/// # Cancellation
///
/// Dropped midway, the read still ends on its thread (it is bounded), and its bytes are dropped.
pub async fn read_regular_file_async(path: impl Into<PathBuf>, max: u64) -> Result<Vec<u8>, ReadError> {
    let path = path.into();
    let shown = path.clone();
    match tokio::task::spawn_blocking(move || read_regular_file(&path, max)).await {
        Ok(read) => read,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(ReadError {
            path: shown,
            problem: Problem::Io(std::io::Error::other("the runtime shut down during the read")),
        }),
    }
}

/// A cap for people: `1 MiB`, `64 KiB`, or bytes when it is neither a whole number of MiB nor of
/// KiB.
fn size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    match bytes {
        b if b >= MIB && b.is_multiple_of(MIB) => format!("{} MiB", b / MIB),
        b if b >= KIB && b.is_multiple_of(KIB) => format!("{} KiB", b / KIB),
        b => format!("{b} bytes"),
    }
}

/// The permission bits of a file that others than its owner and its group may read, write or
/// run (a private key kept so is exposed); `None` when they may not. Group access stays
/// allowed: a Kubernetes Secret volume's files are root's, read by the Pod through its fsGroup.
#[must_use]
pub fn others_may_access(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = meta.permissions().mode() & 0o777;
    (mode & 0o007 != 0).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_is_said_in_the_largest_whole_unit() {
        assert_eq!(size(1024 * 1024), "1 MiB");
        assert_eq!(size(4 * 1024 * 1024), "4 MiB");
        assert_eq!(size(64 * 1024), "64 KiB");
        assert_eq!(size(1536 * 1024), "1536 KiB");
        assert_eq!(size(1000), "1000 bytes");
        assert_eq!(size(0), "0 bytes");
    }
}
