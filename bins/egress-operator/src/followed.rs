//! Files the operator reads again while it runs, every [`FILE_POLL`]: a Secret or ConfigMap
//! volume's files change in place when a CA is rotated or a certificate renewed, and the change
//! reaches what uses them without a restart. The PEM files of flags are read by
//! [`read_pem_file`], bounded. A change that reads and checks well is applied and logged; one
//! that does not is logged once (until the problem changes) as a warning, naming the flag and
//! the file but never what the files hold, and what is in use stays.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Fatal;

pub(crate) use crate::discovery_auth::FILE_POLL;

/// Files read again, and what uses them.
pub(crate) trait Followed: Send + 'static {
    /// What the log says when a change was applied.
    const CHANGED: &'static str;
    /// What the log says when a change cannot be used.
    const UNUSABLE: &'static str;

    /// Reads the files and, when they changed, applies them: whether it did.
    fn check(&mut self) -> Result<bool, Unusable>;

    /// The files, for the log.
    fn files(&self) -> String;
}

/// Why files cannot be used: the flag, the file (or files) and the reason, never what they
/// hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unusable {
    pub(crate) flag: &'static str,
    pub(crate) path: String,
    pub(crate) why: String,
}

impl Unusable {
    /// The problem as it stops the start, under `message`.
    pub(crate) fn fatal(self, message: &str) -> Fatal {
        Fatal {
            message: message.to_owned(),
            error: Some(format!("--{}: {}", self.flag, self.why)),
            path: Some(self.path),
        }
    }
}

/// Checks `followed` every `every` until `shutdown`.
pub(crate) async fn follow<F: Followed>(mut followed: F, every: Duration, shutdown: CancellationToken) {
    let mut last_problem: Option<Unusable> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match followed.check() {
            Ok(false) => last_problem = None,
            Ok(true) => {
                last_problem = None;
                tracing::info!(files = %followed.files(), "{}", F::CHANGED);
            }
            Err(problem) if last_problem.as_ref() != Some(&problem) => {
                tracing::warn!(flag = problem.flag, path = %problem.path, problem = %problem.why, "{}", F::UNUSABLE);
                last_problem = Some(problem);
            }
            Err(_) => {}
        }
    }
}

/// The most a PEM file a flag names (CA certificates, a client certificate or its key) may
/// hold: a bundle of every public CA is about 200 KiB.
const MAX_PEM_FILE: u64 = 1024 * 1024;

/// The PEM file at `path`, read whole: a regular file (a pipe would stall the read until
/// something writes to it, a device might never end) of at most [`MAX_PEM_FILE`] bytes.
pub(crate) fn read_pem_file(path: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let metadata = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err("not a regular file".to_owned());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_PEM_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(format!(
            "larger than {} MiB, which no certificate or key file is",
            MAX_PEM_FILE >> 20
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    /// A directory of a test's own, removed when dropped.
    pub(crate) struct Dir(std::path::PathBuf);

    impl Dir {
        pub(crate) fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("egress-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        /// Writes `text` to `file` as a Secret volume does: whole, at once. Returns its path.
        pub(crate) fn write(&self, file: &str, text: &str) -> String {
            let path = self.0.join(file);
            let next = self.0.join(format!(".{file}.next"));
            std::fs::write(&next, text).unwrap();
            std::fs::rename(&next, &path).unwrap();
            path.display().to_string()
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
