//! A Secret volume laid out as the kubelet lays it out, for token-rotation tests (the discovery
//! crate's and the operator's): the key's file is a symlink through `..data`, itself a symlink
//! to a timestamped directory that the kubelet swaps in whole, by a rename over `..data`, when
//! the Secret changes.

use std::path::PathBuf;

/// A Secret volume directory with key `token`.
#[derive(Debug)]
pub struct Volume {
    dir: PathBuf,
    generation: u32,
}

impl Volume {
    pub fn new(name: &str, first: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("egress-auth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut v = Self { dir, generation: 0 };
        let first_dir = v.write_generation(first);
        std::os::unix::fs::symlink(&first_dir, v.dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/token", v.dir.join("token")).unwrap();
        v
    }

    fn write_generation(&mut self, text: &str) -> String {
        self.generation += 1;
        let name = format!("..2026_12_01_00_00_0{}.{}", self.generation, 1000 + self.generation);
        std::fs::create_dir_all(self.dir.join(&name)).unwrap();
        std::fs::write(self.dir.join(&name).join("token"), text).unwrap();
        name
    }

    /// What the kubelet does on an update: a new directory, a new `..data` link made beside
    /// the old one and renamed over it (atomic), the old directory removed.
    pub fn update(&mut self, text: &str) {
        let old = std::fs::read_link(self.dir.join("..data")).unwrap();
        let new = self.write_generation(text);
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&new, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        std::fs::remove_dir_all(self.dir.join(old)).unwrap();
    }

    pub fn token_file(&self) -> PathBuf {
        self.dir.join("token")
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
