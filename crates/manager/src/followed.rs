//! Files the operator reads again while it runs, every [`FILE_POLL`], with the one file
//! follower of `egress-files` (through `egress-runtime`): a Secret or ConfigMap volume's files
//! change in place when a CA is rotated or a certificate renewed, and the change reaches what
//! uses them without a restart. The PEM files of flags are read by [`read_pem_file`], bounded.
//! A change that reads and checks well is applied and logged; one that does not is logged once
//! (until the problem changes) as a warning, naming the flag and the file but never what the
//! files hold, and what is in use stays.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use egress_runtime::Fatal;
use egress_runtime::files;

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

/// Files followed by the one follower ([`egress_runtime::files::Follower`]), with the
/// operator's log lines.
pub(crate) struct Following<F: Followed>(files::Follower<Logged<F>>);

impl<F: Followed> Following<F> {
    pub(crate) fn new(followed: F) -> Self {
        Self(files::Follower::new(Logged(followed)))
    }

    /// Checks the files now, and logs what it found. Blocking (see [`Followed::check`]).
    pub(crate) fn check_now(&mut self) {
        self.0.check_now();
    }

    /// Checks the files every `every` until `shutdown`, each time on a thread that may block.
    pub(crate) async fn run(self, every: Duration, shutdown: CancellationToken) {
        self.0.run(every, shutdown).await;
    }
}

/// Followed files as the one follower takes them: a change and a new problem logged.
struct Logged<F>(F);

impl<F: Followed> files::Followed for Logged<F> {
    type Change = ();
    type Problem = Unusable;

    fn check(&mut self) -> Result<Option<()>, Unusable> {
        self.0.check().map(|changed| changed.then_some(()))
    }

    fn changed(&self, (): &()) {
        tracing::info!(files = %self.0.files(), "{}", F::CHANGED);
    }

    fn unusable(&self, problem: &Unusable) {
        tracing::warn!(flag = problem.flag, path = %problem.path, problem = %problem.why, "{}", F::UNUSABLE);
    }
}

/// The most a PEM file a flag names (CA certificates, a client certificate or its key) may
/// hold: a bundle of every public CA is about 200 KiB.
const MAX_PEM_FILE: u64 = 1024 * 1024;

/// The PEM file at `path`, read whole with [`read_flag_file`], at most [`MAX_PEM_FILE`].
pub(crate) fn read_pem_file(path: &str) -> Result<Vec<u8>, String> {
    read_flag_file(path, MAX_PEM_FILE, "which no certificate or key file is")
}

/// The file at `path`, read whole with the one bounded read
/// ([`egress_runtime::files::read_regular_file`]: a regular file, opened without waiting, of at
/// most `max` bytes); over it, the error says so and why that is too much (`beyond`). The error
/// leaves out the path, which the caller names with its flag.
pub(crate) fn read_flag_file(path: &str, max: u64, beyond: &str) -> Result<Vec<u8>, String> {
    files::read_regular_file(path, max).map_err(|e| match e.problem {
        files::Problem::TooLarge { .. } => format!("{}, {beyond}", e.problem),
        problem => problem.to_string(),
    })
}
