//! The shared conformance suite every egress-proxy provider must pass.
//!
//! Each contract rule of spec/providers.md §1 is proved by a case
//! (CT-A01 ... CT-M05) written once here as a public async function over a
//! [`ConformanceTarget`]. A provider crate runs all of them with one line:
//!
//! ```no_run
//! // tests/conformance.rs of a provider crate, with its own target type:
//! egress_conformance::conformance_suite!(egress_conformance::memory::MemoryTarget::new());
//! # fn main() {}
//! ```
//!
//! which expands to one named `#[test]` per case (`cargo test ct_b02` runs
//! one). Each case gets a fresh backend, a capturing tracing subscriber and
//! a `conformance.parent` span:
//!
//! ```text
//!  target.backend() ──► Scenario { provider(), hooks(), capture, profile, fixtures }
//!                              │
//!  case(scenario) ── panics on a violation ── Err(Skip) when a gate, fixture or hook excludes it
//! ```
//!
//! Backends offer test hooks ([`BackendHooks`]); a hook a backend lacks
//! skips exactly the cases that need it, and says so. A real backend that is
//! not configured skips every case with a printed reason, unless the run
//! requires real backends (`EGRESS_REAL_BACKENDS_REQUIRED=1`, the one rule of
//! [`egress_testkit::real`]), which turns that skip into a failure.
//!
//! The crate also holds an in-memory reference provider ([`memory`]) that
//! passes the whole suite, and its deliberately broken variants, which prove
//! the cases can fail.
//!
//! What it does not do: measure speed (that is `cargo xtask bench`), or
//! replace a provider's own unit tests of its builders and classifiers.

pub mod capture;
pub mod cases;
pub mod harness;
pub mod hooks;
pub mod intercept;
pub mod memory;
pub mod target;

use std::time::Duration;

pub use harness::{CaseResult, Scenario, Skip, outcome, run_case};
pub use hooks::{BackendHooks, CallKind, Fault, Gate, NativeState, SeedSpec, SeedTime, Times, Unsupported};
pub use intercept::Interceptor;
pub use target::{BuildOptions, ConformanceTarget, Fixtures, NotConfigured, Profile};

/// The bound on "returns promptly".
pub const PROMPT: Duration = Duration::from_secs(1);
/// How many deletes CT-D03 runs at once.
pub const CONCURRENT_DELETES: usize = 10;
/// Put in cloud-init; must never show in telemetry or errors.
pub const SENTINEL_CI: &str = "SENTINEL-cloudinit-7f3a";
/// Put in credentials; must never show in telemetry or errors.
pub const SENTINEL_CRED: &str = "SENTINEL-credential-91bc";
/// The configured entry name providers are built with (unlike any type name,
/// so a hard-coded name is caught).
pub const ENTRY_NAME: &str = "conformance-entry";
/// The installation the mark cases (CT-M) write when the target's requests carry none.
pub const INSTALLATION: &str = "conformance-installation";
/// The span every case runs in.
pub const PARENT_SPAN: &str = "conformance.parent";

/// Calls `$callback!` with the name of every case, in order. The single list
/// of cases: the suite macro and [`CASES`] both come from it.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($callback:ident ! ($($args:tt)*)) => {
        $crate::$callback! { ($($args)*)
            ct_a00_mandatory_hooks_are_offered
            ct_a01_constructor_does_not_dial
            ct_a02_missing_credentials_are_lazy
            ct_a03_unparsable_credentials_are_permanent
            ct_a04_insecure_switch_warns_at_build
            ct_b01_id_is_self_contained
            ct_b02_create_is_idempotent
            ct_b03_concurrent_creates_same_name
            ct_b04_create_adopts_existing_by_name
            ct_b05_marks_written_in_the_create_call
            ct_b06_get_after_create_is_not_notfound
            ct_b07_unsatisfiable_placement_rejected_before_backend
            ct_b08_create_never_returns_notfound
            ct_b09_quota_signal_is_quota_class
            ct_b10_cloud_init_delivered_byte_for_byte
            ct_b11_blocking_create_resumes_after_each_step
            ct_b12_create_return_matches_profile
            ct_b13_adoption_guard
            ct_c01_missing_is_notfound
            ct_c02_notfound_after_delete
            ct_c03_faults_are_never_notfound
            ct_c04_running_requires_ip
            ct_c05_unknown_state_is_stopped
            ct_c06_never_started_is_not_stopped
            ct_c07_get_during_delete_returns_instance
            ct_c08_async_or_locked_is_last_state_or_transient
            ct_c09_uid_and_created_at_read_back
            ct_c10_missing_or_garbage_created_at_is_zero
            ct_c11_malformed_id_is_permanent
            ct_c12_unconfigured_location_is_permanent
            ct_d01_delete_missing_is_ok
            ct_d02_delete_twice_is_ok
            ct_d03_concurrent_deletes_same_id
            ct_d04_delete_while_deleting_is_ok_and_cheap
            ct_d05_delete_removes_secondary_resources
            ct_d06_delete_malformed_id_is_permanent
            ct_d07_delete_unconfigured_location_is_logged_noop
            ct_d08_delete_on_locked_instance_is_transient
            ct_e01_lists_marked_only
            ct_e02_empty_uid_still_listed
            ct_e03_listed_ids_work_for_get_and_delete
            ct_e04_listed_fields_are_real
            ct_e05_whole_scope_is_covered
            ct_e06_partial_scope_follows_policy
            ct_e07_unreadable_instance_is_skipped_or_fails
            ct_e08_list_failure_is_an_error
            ct_e09_cancelled_list_is_an_error
            ct_f01_every_error_is_wrapped_with_configured_name
            ct_f02_classify_table
            ct_f03_errors_are_sanitised
            ct_g01_cancel_returns_promptly
            ct_g02_pre_cancelled_does_nothing
            ct_g03_dropped_future_leaves_no_poison
            ct_g04_per_call_budget_bounds_a_hung_call
            ct_g05_cancel_does_not_kill_unrelated_calls_repeatedly
            ct_h01_cloud_init_sentinel_never_leaks
            ct_h02_credential_sentinel_never_leaks
            ct_i01_no_own_operation_spans_or_counts
            ct_i02_child_spans_under_caller
            ct_i03_events_inside_caller_span
            ct_i04_quiet_on_success_at_info
            ct_j01_one_entry_per_target_stable_order
            ct_j02_success_is_reachable
            ct_j03_never_fails_as_a_whole
            ct_j04_expired_deadline_returns_promptly
            ct_j05_frozen_probe_times_out
            ct_j06_reasons_table
            ct_j07_check_does_not_disrupt_reconciles
            ct_j08_check_uses_list_permissions
            ct_k01_mixed_load
            ct_k02_create_delete_race_converges
            ct_l01_full_lifecycle
            ct_l02_check_against_real_backend
            ct_m01_mark_is_written_and_read_back
            ct_m02_marking_again_is_harmless
            ct_m03_marking_a_gone_instance_is_notfound
            ct_m04_another_installations_mark_is_kept
            ct_m05_malformed_id_is_permanent
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __emit_tests {
    (($target:expr) $($case:ident)*) => {
        $(
            #[test]
            fn $case() {
                $crate::run_case(stringify!($case), $target, $crate::cases::$case);
            }
        )*
    };
}

/// Generates one `#[test]` per conformance case for `$target` (an
/// expression building a fresh [`ConformanceTarget`], evaluated per test).
#[macro_export]
macro_rules! conformance_suite {
    ($target:expr) => {
        $crate::__with_cases!(__emit_tests!($target));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __emit_names {
    (() $($case:ident)*) => {
        &[$(stringify!($case)),*]
    };
}

/// The name of every case, in order.
pub const CASES: &[&str] = __with_cases!(__emit_names!());
