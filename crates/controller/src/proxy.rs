//! The Proxy controller (docs/controller.md#the-reconciler): one pass per Proxy brings its
//! instance, its credentials and its status to what its spec asks for.
//!
//! ```text
//!  Proxy ─► reconciler ──Input, Facts──► decide::next ──► Do(Action) ──► reconciler performs it
//!              ▲                          (pure)     └──► Done(Outcome)      (kube, provider)
//!              └──────────── the action's result joins the Facts ◄──────────────┘
//!  Outcome ─► status (merge patch, only on change) and events
//! ```
//!
//! [`decide`] is the pure decision; [`reconciler`] its I/O shell, with the [`context`] every
//! reconcile shares, and [`controller`] the loop that runs it for each Proxy that changed. What they share: the Proxy's
//! [`status`], its [`spec_hash`], the [`secret`] and [`credentials`] it reads, the
//! [`destinations`] an External Proxy may not point at. [`events`] says what a pass tells a
//! person, and [`health`] is the seam to the health engine, whose verdicts the pass reads.

pub mod context;
pub mod controller;
pub mod credentials;
pub mod decide;
pub mod destinations;
pub mod events;
pub mod exit;
pub mod exit_findings;
pub mod health;
pub mod reconciler;
pub mod secret;
pub mod spec_hash;
pub mod status;
