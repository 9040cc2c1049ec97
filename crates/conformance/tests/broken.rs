//! The suite has teeth: each deliberately broken variant of the reference
//! provider is caught by the case written for that rule.

use egress_conformance::cases;
use egress_conformance::memory::{Defect, MemoryTarget};
use egress_conformance::outcome;

/// Runs `case` against the reference provider with `defect` and asserts it
/// fails (not skips, not passes), and that the correct provider passes it.
macro_rules! caught {
    ($test:ident, $defect:expr, $case:path) => {
        #[test]
        fn $test() {
            let broken = outcome(MemoryTarget::broken($defect), $case);
            assert!(
                broken.is_err(),
                "{} did not catch {:?}: {broken:?}",
                stringify!($case),
                $defect
            );
            let healthy = outcome(MemoryTarget::new(), $case);
            assert_eq!(
                healthy,
                Ok(Ok(())),
                "the correct provider must pass {}",
                stringify!($case)
            );
        }
    };
}

caught!(
    a_transient_fault_reported_as_notfound_is_caught,
    Defect::NotFoundOnTransientFault,
    cases::ct_c03_faults_are_never_notfound
);
caught!(
    a_create_that_is_not_idempotent_is_caught,
    Defect::CreateNotIdempotent,
    cases::ct_b02_create_is_idempotent
);
caught!(
    listing_unmarked_instances_is_caught,
    Defect::ListsUnmarked,
    cases::ct_e01_lists_marked_only
);
caught!(
    created_at_filled_from_memory_is_caught,
    Defect::CreatedAtFromMemory,
    cases::ct_c09_uid_and_created_at_read_back
);
caught!(
    cloud_init_inside_an_error_is_caught,
    Defect::CloudInitInErrors,
    cases::ct_h01_cloud_init_sentinel_never_leaks
);
caught!(
    ignoring_cancellation_is_caught,
    Defect::IgnoresCancellation,
    cases::ct_g01_cancel_returns_promptly
);
caught!(
    running_without_an_address_is_caught,
    Defect::RunningWithoutIp,
    cases::ct_c04_running_requires_ip
);
caught!(
    a_mark_that_is_never_written_is_caught,
    Defect::MarkNotWritten,
    cases::ct_m01_mark_is_written_and_read_back
);
caught!(
    a_mark_written_without_reading_the_instance_is_caught,
    Defect::MarksWithoutLooking,
    cases::ct_m04_another_installations_mark_is_kept
);
