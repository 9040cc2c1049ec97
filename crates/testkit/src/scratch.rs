//! Scratch directories for tests: fresh, empty, and named so that no two tests of one process
//! and no two processes share one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh, empty directory `<temp>/egress-<what>-<pid>` for one test. Whatever an earlier
/// process of the same id left there is removed first. It is kept after the test, so what a
/// failed test wrote can be read; `what` must differ between the tests of one binary.
///
/// # Panics
/// When the directory cannot be made: no test can go on without it.
pub fn scratch_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("egress-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// A fresh, empty directory removed with its contents when dropped. Every value is a directory
/// of its own (the name carries the process id and a counter), whatever `what` says.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Makes `<temp>/egress-<what>-<n>-<pid>`.
    ///
    /// # Panics
    /// When the directory cannot be made.
    pub fn new(what: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(scratch_dir(&format!("{what}-{n}")))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scratch_dir_is_fresh_and_its_own() {
        let a = ScratchDir::new("t");
        let b = ScratchDir::new("t");
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("f"), "x").unwrap();
        let kept = a.path().to_owned();
        drop(a);
        assert!(!kept.exists());
        let dir = scratch_dir("each-scratch-dir");
        std::fs::write(dir.join("left"), "x").unwrap();
        assert!(
            std::fs::read_dir(scratch_dir("each-scratch-dir"))
                .unwrap()
                .next()
                .is_none()
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
