//! The objects, the resourceVersion clock and the change history, and every verb's rules.
//! Everything here is synchronous and runs under one lock: a request sees and leaves a
//! consistent state, and each change gets the next resourceVersion.
//!
//! ```text
//!  state      the State, its clock, history and commit (the one place a change is made)
//!  read       get, list, the changes and snapshot a watch starts from
//!  write      create, update, and the common end of update, patch and apply
//!  patching   the four patch forms
//!  delete     delete, delete collection, what follows a removal
//!  lifecycle  namespaces and the garbage collector
//!  admit      what a candidate object must pass
//!  meta, options, change: the helpers and types they share
//! ```
//!
//! The verbs are methods of [`State`] in these modules; the lock is the HTTP side's, taken once
//! per request around the one method it calls.

mod admit;
mod change;
mod delete;
mod lifecycle;
mod meta;
mod options;
mod patching;
mod read;
mod state;
mod write;

pub(crate) use change::{Change, ChangeKind, watches};
pub(crate) use options::{DeleteOptions, ListOptions, PatchKind, Target, WriteOptions};
pub(crate) use state::State;
