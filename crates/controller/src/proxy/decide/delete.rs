//! The decision for a Proxy being deleted: its instance deleted (unless it is not this Proxy's
//! to delete), then its finalizer released. Deletion never gives up by itself.

use egress_api::ProxyStatus;
use egress_provider::{ErrorClass, ProviderId};

use super::ending::has_finalizer;
use super::facts::{Facts, Input, foreign_owner};
use super::outcome::{Action, Next, Note, Outcome, Requeue};
use super::timings::Timings;

/// `deletionFailure` (spec/core.md §3.8): never gives up.
fn deletion_failure(timings: &Timings, status: ProxyStatus, message: String, class: ErrorClass) -> Outcome {
    let requeue = match class {
        ErrorClass::QuotaExceeded => Requeue::After(timings.quota_retry),
        _ => Requeue::Error(message),
    };
    Outcome {
        status,
        requeue,
        note: None,
        marked: None,
    }
}

/// The delete path (spec/core.md §3.7): the instance deleted, then the finalizer released.
pub(super) fn delete_path(input: &Input<'_>, facts: &Facts, timings: &Timings, mut status: ProxyStatus) -> Next {
    let proxy = input.proxy;
    status.phase = Some(egress_api::Phase::Deleting);
    let done = |status: ProxyStatus, requeue: Requeue, note: Option<Note>| {
        Next::Done(Outcome {
            status,
            requeue,
            note,
            marked: None,
        })
    };
    let release = |status: ProxyStatus, note: Option<Note>| {
        if facts.finalizer_removed {
            Next::Done(Outcome {
                status,
                requeue: Requeue::Never,
                note,
                marked: None,
            })
        } else {
            Next::Do(Action::RemoveFinalizer)
        }
    };
    // 1. Not ours to clean up.
    if !has_finalizer(proxy) {
        return done(status, Requeue::Never, None);
    }
    // 2. Nothing was ever recorded as created.
    if status.provider_id.is_empty() {
        return release(status, None);
    }
    let id = ProviderId::new(status.provider_id.clone());
    // 3. The escape hatch, before the provider lookup.
    if proxy.skip_cleanup() {
        let note = Note::SkipCleanup {
            provider_id: id.as_str().to_string(),
        };
        return release(status, Some(note));
    }
    // 4. Cleanup needs the provider.
    if !input.provider_configured {
        let message = format!(
            "provider \"{}\" is not configured; cannot clean up instance {}",
            proxy.spec.provider,
            id.as_str()
        );
        return done(status, Requeue::Error(message), None);
    }
    // 5. Where is it?
    match &facts.get {
        None => Next::Do(Action::Get(id)),
        Some(Err(f)) if f.class == ErrorClass::NotFound => release(status, None),
        Some(Err(get)) if get.class == ErrorClass::Permanent => match &facts.delete {
            None => Next::Do(Action::Delete(id)),
            Some(Ok(())) => {
                let note = Note::UnreachableButCleaned {
                    provider_id: id.as_str().to_string(),
                    get_error: get.message.clone(),
                };
                release(status, Some(note))
            }
            Some(Err(del)) => {
                let joined = format!("{}; {}", get.message, del.message);
                Next::Done(deletion_failure(timings, status, joined, del.class))
            }
        },
        Some(Err(get)) => Next::Done(deletion_failure(timings, status, get.message.clone(), get.class)),
        // Another Proxy's instance (review M2): not deleted; this Proxy lets go of it.
        Some(Ok(instance)) if let Some(owner) = foreign_owner(proxy, instance) => {
            let note = Note::LeftToItsOwner {
                provider_id: id.as_str().to_string(),
                owner: owner.to_owned(),
            };
            release(status, Some(note))
        }
        // 6. Still there: delete, and poll until Get says NotFound.
        Some(Ok(_)) => match &facts.delete {
            None => Next::Do(Action::Delete(id)),
            Some(Err(f)) => Next::Done(deletion_failure(timings, status, f.message.clone(), f.class)),
            Some(Ok(())) => done(status, Requeue::After(timings.deletion_poll), None),
        },
    }
}
