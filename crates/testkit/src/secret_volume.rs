//! A Secret volume laid out as the kubelet lays it out, for rotation tests (the discovery
//! token, the TLS and CA files of the operator's flags): each key's file is a symlink through
//! `..data`, itself a symlink to a timestamped directory holding every key, which the kubelet
//! swaps in whole, by a rename over `..data`, when the Secret changes.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// A Secret volume directory.
#[derive(Debug)]
pub struct Volume {
    dir: PathBuf,
    generation: u32,
    /// What the Secret holds now, by key.
    keys: BTreeMap<String, String>,
}

impl Volume {
    /// A volume with key `token` holding `first`.
    pub fn new(name: &str, first: &str) -> Self {
        Self::with_keys(name, &[("token", first)])
    }

    /// A volume with these keys and texts.
    pub fn with_keys(name: &str, keys: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("egress-auth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut v = Self {
            dir,
            generation: 0,
            keys: keys.iter().map(|(k, t)| ((*k).to_owned(), (*t).to_owned())).collect(),
        };
        let first_dir = v.write_generation();
        std::os::unix::fs::symlink(&first_dir, v.dir.join("..data")).unwrap();
        v.link_keys();
        v
    }

    fn write_generation(&mut self) -> String {
        self.generation += 1;
        let name = format!("..2026_12_01_00_00_0{}.{}", self.generation, 1000 + self.generation);
        std::fs::create_dir_all(self.dir.join(&name)).unwrap();
        for (key, text) in &self.keys {
            std::fs::write(self.dir.join(&name).join(key), text).unwrap();
        }
        name
    }

    /// Each key's link through `..data`, where it is missing.
    fn link_keys(&self) {
        for key in self.keys.keys() {
            let link = self.dir.join(key);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{key}"), link).unwrap();
            }
        }
    }

    /// What the kubelet does on an update: a new directory with every key, a new `..data` link
    /// made beside the old one and renamed over it (atomic), the old directory removed.
    pub fn update_keys(&mut self, changed: &[(&str, &str)]) {
        for (key, text) in changed {
            self.keys.insert((*key).to_owned(), (*text).to_owned());
        }
        let old = std::fs::read_link(self.dir.join("..data")).unwrap();
        let new = self.write_generation();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&new, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        self.link_keys();
    }

    /// What the kubelet does when a key leaves the Secret: a new version without it swapped
    /// in, and the key's link removed.
    pub fn remove_key(&mut self, key: &str) {
        self.keys.remove(key);
        self.update_keys(&[]);
        let _ = std::fs::remove_file(self.dir.join(key));
    }

    /// [`update_keys`](Self::update_keys) of key `token`.
    pub fn update(&mut self, text: &str) {
        self.update_keys(&[("token", text)]);
    }

    /// The file of `key`, as a pod sees it.
    pub fn file(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    pub fn token_file(&self) -> PathBuf {
        self.file("token")
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
