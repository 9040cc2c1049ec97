//! Files the project reads from a path a user gives (a flag, a config field, an environment
//! variable): certificates, keys, tokens, the providers and clients configs.
//!
//! - [`read`]: the one way such a file is read. It is opened without waiting, taken only when
//!   the opened file is a regular file (so a pipe, a device or a directory put in its place is
//!   refused at once, with no window between a look and the open), and read up to a cap; errors
//!   name the path and what is wrong, never what the file holds.
//! - [`follow`]: the one follower. Files are read again on a schedule; a change that can be
//!   used is put in force, one that cannot is reported once (until the problem changes) and
//!   what is in force stays.
//!
//! ```text
//!  every `every` ─► Followed::check (on a thread that may block)
//!                     │ read_regular_file ─► parse, check ─► put in force
//!                     ▼
//!                   Ok(None) unchanged · Ok(Some) changed ─► Followed::changed
//!                   Err(problem) ─► new? ─► Followed::unusable (once)
//! ```
//!
//! It depends on nothing of the project's, so every crate that reads a file can take it:
//! `egress-provider`, the provider crates and `egress-discovery` as well as `egress-runtime`,
//! which re-exports it for binaries. It does not watch with inotify (a Secret volume's update
//! swaps a symlink, which a poll sees as surely), and it never logs: what a change means, and
//! how it is said, is the caller's.

pub mod follow;
pub mod read;

pub use follow::{Followed, Follower, Kept, Report, Reports};
pub use read::{Problem, ReadError, others_may_access, read_regular_file, read_regular_file_async};
