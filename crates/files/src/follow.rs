//! The one file follower: files read again every so often, and what they give put in force
//! when it changed, without a restart (a Secret or ConfigMap volume's files change in place
//! when a token is rotated, a CA renewed or a config edited).
//!
//! Its decisions, the same for every followed file:
//!
//! - a change that reads and checks well is put in force and said once ([`Followed::changed`]);
//! - one that cannot be used leaves what is in force, and is said once, until the problem
//!   changes, goes away, or comes back after a good read ([`Followed::unusable`], [`Reports`]);
//! - what a file last gave that could be used stays while the file is missing or unusable
//!   ([`Kept`], for a caller that gathers several files itself).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Files read again, and what uses them.
pub trait Followed: Send + 'static {
    /// What changed, for [`changed`](Self::changed) to say.
    type Change: Send;
    /// Why the files cannot be used. Equal problems are said once.
    type Problem: PartialEq + Send + 'static;

    /// Reads the files and, when what they give changed and can be used, puts it in force: the
    /// change, or `None` when nothing changed. On an error, what is in force stays. Blocking:
    /// it reads files (with [`read_regular_file`](crate::read_regular_file)).
    ///
    /// # Errors
    ///
    /// Why what the files give now cannot be used.
    fn check(&mut self) -> Result<Option<Self::Change>, Self::Problem>;

    /// Says that `change` was put in force (a log line, say).
    fn changed(&self, change: &Self::Change);

    /// Says that the files cannot be used, and that what is in force stays. Called once per
    /// problem (see [`Reports`]).
    fn unusable(&self, problem: &Self::Problem);
}

/// What to say after a look at followed files.
#[derive(Debug, PartialEq, Eq)]
pub enum Report<'a, C, P> {
    /// Nothing changed (or nothing is there to take): nothing to say.
    Unchanged,
    /// This change was put in force.
    Changed(C),
    /// The files cannot be used, for a reason not said yet: say it.
    Unusable(&'a P),
    /// The files still cannot be used, for the reason already said: say nothing.
    StillUnusable,
}

/// The problem last said about followed files, so that each is said once.
#[derive(Debug)]
pub struct Reports<P> {
    last: Option<P>,
}

impl<P> Default for Reports<P> {
    fn default() -> Self {
        Self { last: None }
    }
}

impl<P: PartialEq> Reports<P> {
    /// What to say about `look` (see [`Followed::check`]). A problem is said when it differs
    /// from the last one said; any look without a problem forgets that one, so a problem that
    /// comes back is said again.
    pub fn after<C>(&mut self, look: Result<Option<C>, P>) -> Report<'_, C, P> {
        match look {
            Ok(change) => {
                self.last = None;
                change.map_or(Report::Unchanged, Report::Changed)
            }
            Err(problem) if self.last.as_ref() == Some(&problem) => Report::StillUnusable,
            Err(problem) => Report::Unusable(self.last.insert(problem)),
        }
    }
}

/// What one followed file last gave that could be used, kept while the file is missing, empty
/// or unusable; and the problem last said about it.
#[derive(Debug)]
pub struct Kept<T, P> {
    value: Option<T>,
    reports: Reports<P>,
}

impl<T, P> Default for Kept<T, P> {
    fn default() -> Self {
        Self {
            value: None,
            reports: Reports::default(),
        }
    }
}

impl<T, P: PartialEq> Kept<T, P> {
    /// Kept from the start: what a file gave before it was followed.
    pub fn holding(value: T) -> Self {
        Self {
            value: Some(value),
            reports: Reports::default(),
        }
    }

    /// What is kept: the last value given.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }

    /// Takes what the file gives now: a value replaces the one kept; `Ok(None)` (nothing to
    /// take: the file is missing or empty) keeps it; a problem keeps it too, and is answered when
    /// it is new, to be said.
    pub fn take(&mut self, look: Result<Option<T>, P>) -> Option<&P> {
        let look = look.map(|given| given.map(|value| self.value = Some(value)));
        match self.reports.after(look) {
            Report::Unusable(problem) => Some(problem),
            Report::Unchanged | Report::Changed(()) | Report::StillUnusable => None,
        }
    }
}

/// Followed files, and the problem last said about them.
#[derive(Debug)]
pub struct Follower<F: Followed> {
    followed: F,
    reports: Reports<F::Problem>,
}

impl<F: Followed> Follower<F> {
    /// Follows `followed`, whose files were read (and put in force) already, or are read at
    /// the first check.
    pub fn new(followed: F) -> Self {
        Self {
            followed,
            reports: Reports::default(),
        }
    }

    /// What is followed.
    pub fn followed(&self) -> &F {
        &self.followed
    }

    /// Checks the files now, and says what it found. Blocking (see [`Followed::check`]).
    pub fn check_now(&mut self) {
        match self.reports.after(self.followed.check()) {
            Report::Changed(change) => self.followed.changed(&change),
            Report::Unusable(problem) => self.followed.unusable(problem),
            Report::Unchanged | Report::StillUnusable => {}
        }
    }

    /// Checks the files every `every` until `shutdown`, each time on a thread that may block.
    ///
    /// # Cancellation
    ///
    /// Dropped, or at `shutdown`, it stops; a check under way ends on its thread.
    pub async fn run(mut self, every: Duration, shutdown: CancellationToken) {
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
                Ok(follower) => follower,
                // A check that panicked: a bug, which the panic hook reports; nothing is
                // followed from then on, and what is in force stays.
                Err(_) => return,
            };
        }
    }
}
