//! What one `cargo xtask dev` run is: the namespace and provider entry it uses, where its
//! files live, and where its discovery API answers.

use std::path::PathBuf;

use anyhow::Result;

/// The namespace the samples go to.
pub(super) const NAMESPACE: &str = "default";
/// The local entry's name (the samples' `spec.provider`).
pub(super) const ENTRY: &str = "local";

/// Files of one run.
pub(super) struct Layout {
    pub(super) dir: PathBuf,
}

impl Layout {
    pub(super) fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The local provider's state directory: the proxies' records and tinyproxy configs.
    pub(super) fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// Adds a child's pid to the file the next run reads to stop what this one left.
    pub(super) fn remember_pid(&self, pid: u32) -> Result<()> {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.file("pids"))?;
        writeln!(file, "{pid}")?;
        Ok(())
    }
}

/// Where the run's discovery API is (over TLS, its certificate signed by the run's CA), and its
/// token.
pub(super) struct Discovery<'a> {
    pub(super) url: &'a str,
    pub(super) token: &'a str,
    /// The CA file its certificate chains to.
    pub(super) ca: &'a std::path::Path,
}

impl Discovery<'_> {
    /// A client of the API that trusts the run's CA, with `token` when given.
    pub(super) fn client(&self, token: Option<String>) -> Result<egress_discovery::client::Client> {
        let ca = std::fs::read(self.ca)?;
        egress_discovery::client::Client::with_ca(self.url, token, std::time::Duration::from_secs(10), &ca)
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// A new random discovery token for one run (hex of 24 random bytes).
pub(super) fn discovery_token() -> String {
    let bytes: [u8; 24] = rand::random();
    data_encoding::HEXLOWER.encode(&bytes)
}
