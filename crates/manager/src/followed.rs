//! Files the operator reads again while it runs, every [`FILE_POLL`]: a Secret or ConfigMap
//! volume's files change in place when a CA is rotated or a certificate renewed, and the change
//! reaches what uses them without a restart. The PEM files of flags are read by
//! [`read_pem_file`], bounded. A change that reads and checks well is applied and logged; one
//! that does not is logged once (until the problem changes) as a warning, naming the flag and
//! the file but never what the files hold, and what is in use stays.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use egress_runtime::Fatal;

pub(crate) use crate::discovery_auth::FILE_POLL;

/// Files read again, and what uses them.
pub(crate) trait Followed: Send + 'static {
    /// What the log says when a change was applied.
    const CHANGED: &'static str;
    /// What the log says when a change cannot be used.
    const UNUSABLE: &'static str;

    /// Reads the files and, when they changed, applies them: whether it did. Blocking (it
    /// reads files, and building TLS settings may read the system's CA store).
    fn check(&mut self) -> Result<bool, Unusable>;

    /// The files, for the log.
    fn files(&self) -> String;
}

/// Why files cannot be used: the flag (or flags), the file (or files) and the reason, never
/// what they hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unusable {
    /// As given on the command line, `--` and all.
    pub(crate) flag: &'static str,
    pub(crate) path: String,
    pub(crate) why: String,
}

impl Unusable {
    /// The problem as it stops the start, under `message`.
    pub(crate) fn fatal(self, message: &str) -> Fatal {
        Fatal {
            message: message.to_owned(),
            error: Some(format!("{}: {}", self.flag, self.why)),
            path: Some(self.path),
        }
    }
}

/// Files followed, and the problem last logged for them.
pub(crate) struct Following<F> {
    followed: F,
    last_problem: Option<Unusable>,
}

impl<F: Followed> Following<F> {
    pub(crate) fn new(followed: F) -> Self {
        Self {
            followed,
            last_problem: None,
        }
    }

    /// Checks the files now, and logs what it found. Blocking (see [`Followed::check`]).
    pub(crate) fn check_now(&mut self) {
        match self.followed.check() {
            Ok(false) => self.last_problem = None,
            Ok(true) => {
                self.last_problem = None;
                tracing::info!(files = %self.followed.files(), "{}", F::CHANGED);
            }
            Err(problem) if self.last_problem.as_ref() != Some(&problem) => {
                tracing::warn!(flag = problem.flag, path = %problem.path, problem = %problem.why, "{}", F::UNUSABLE);
                self.last_problem = Some(problem);
            }
            Err(_) => {}
        }
    }

    /// Checks the files every `every` until `shutdown`, each time on a thread that may block.
    pub(crate) async fn run(mut self, every: Duration, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            self = match tokio::task::spawn_blocking(move || {
                self.check_now();
                self
            })
            .await
            {
                Ok(following) => following,
                // A check that panicked: a bug, logged by the panic hook; nothing is followed
                // from then on, and what is in use stays.
                Err(_) => return,
            };
        }
    }
}

/// The most a PEM file a flag names (CA certificates, a client certificate or its key) may
/// hold: a bundle of every public CA is about 200 KiB.
const MAX_PEM_FILE: u64 = 1024 * 1024;

/// The PEM file at `path`, read whole with [`read_regular_file`], at most [`MAX_PEM_FILE`].
pub(crate) fn read_pem_file(path: &str) -> Result<Vec<u8>, String> {
    read_regular_file(path, MAX_PEM_FILE, "which no certificate or key file is")
}

/// The file at `path`, read whole: a regular file (a pipe would stall the read until something
/// writes to it, a device might never end) of at most `max` bytes; over it, the error says so
/// and why that is too much (`beyond`). Opened without waiting (a pipe opens at once that way)
/// and then looked at, so a pipe put in the file's place between a look and the open cannot
/// stall it either.
pub(crate) fn read_regular_file(path: &str, max: u64, beyond: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits().cast_signed())
        .open(path)
        .map_err(|e| e.to_string())?;
    if !file.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".to_owned());
    }
    // Reading a regular file never waits, whatever the flag says.
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        let size = if max >= 1 << 20 {
            format!("{} MiB", max >> 20)
        } else {
            format!("{} KiB", max >> 10)
        };
        return Err(format!("larger than {size}, {beyond}"));
    }
    Ok(bytes)
}
