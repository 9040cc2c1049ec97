//! The reconciler's decision for one Proxy, as a pure function (spec/core.md §3).
//!
//! A pass is a loop: [`next`] looks at the Proxy as fetched and at the [`Facts`] gathered so
//! far in this pass, and answers either an [`Action`] to perform (a metadata write, a secret
//! read, a provider call) or the end of the pass ([`Outcome`]: the status to flush and when to
//! come back). The caller performs the action, records its result in the facts and asks again.
//! Each call replays the rules from the top, so the order of the rules is the order of the
//! code, and every branch can be tested without I/O.
//!
//! A pass performs each kind of provider call at most once (the instance the credentials Secret
//! names is asked about apart from the recorded one, and credentials are prepared at most twice),
//! so the loop ends after a handful of steps; the caller still bounds it.
//!
//! The rules by path: `managed` (and `observe`, for the instance the provider answered for),
//! `external` and `delete`; the endings they share are in `ending`. What the decision reads is
//! in `facts` and `timings`, what it answers in `outcome`.

mod delete;
mod ending;
mod external;
mod facts;
mod managed;
mod observe;
mod outcome;
mod timings;

use egress_api::Mode;

use self::facts::owned_facts;
pub use self::facts::{Facts, Input, ProviderFailure, foreign_owner};
pub use self::managed::{adoptable, built_from_current_spec};
pub use self::observe::WAITING_TO_RUN;
pub use self::outcome::{Action, Marked, Next, Note, Outcome, Requeue};
pub use self::timings::{DEFAULT_ADDRESS_BUDGET, Timings};
use crate::proxy::spec_hash::spec_hash;

/// Whether this step of the pass belongs to a replacement (an instance is recorded and the spec
/// hash it was built from differs from the spec's): the `reconcile.replaceInstance` span.
pub fn replacing(input: &Input<'_>, facts: &Facts) -> bool {
    let proxy = input.proxy;
    if proxy.metadata.deletion_timestamp.is_some() || proxy.spec.mode != Mode::Managed {
        return false;
    }
    if proxy.status.as_ref().is_none_or(|s| s.provider_id.is_empty()) {
        return false;
    }
    let Ok(Ok(text)) = managed::cloud_init(input, facts) else {
        return false;
    };
    let hash = spec_hash(&proxy.spec, &text);
    let recorded = managed::recorded_hash(proxy, facts);
    recorded.is_some_and(|r| r != hash && !adoptable(proxy, &r, &hash))
}

/// The decision for one step of a pass.
pub fn next(input: &Input<'_>, facts: &Facts, timings: &Timings) -> Next {
    let proxy = input.proxy;
    let status = proxy.status.clone().unwrap_or_default();
    if proxy.metadata.deletion_timestamp.is_some() {
        return delete::delete_path(input, facts, timings, status);
    }
    let facts = &owned_facts(proxy, facts);
    match proxy.spec.mode {
        Mode::External => Next::Done(external::external_path(input, status)),
        Mode::Managed => said(input, facts, managed::managed_path(input, facts, timings, status)),
    }
}

/// The end of a managed pass with what it did on the way that its status does not show, so
/// its events say it whatever it went on to find: an adoption (its note) and an installation
/// mark written.
fn said(input: &Input<'_>, facts: &Facts, next: Next) -> Next {
    let Next::Done(mut outcome) = next else {
        return next;
    };
    let recorded = || {
        input
            .proxy
            .status
            .as_ref()
            .map(|s| s.provider_id.clone())
            .unwrap_or_default()
    };
    if let (Some(previous), None) = (&facts.adopted_from, &outcome.note) {
        outcome.note = Some(Note::Adopted {
            provider_id: recorded(),
            previous: previous.clone(),
        });
    }
    if let (Some(Ok(())), Some(installation)) = (&facts.marked, input.installation) {
        outcome.marked = Some(Marked {
            provider_id: recorded(),
            installation: installation.to_owned(),
        });
    }
    Next::Done(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_provider::ProxyCredentials;

    #[test]
    fn debug_never_shows_cloud_init() {
        let secret = "#cloud-config\npassword: SENTINEL-7f3a";
        let action = Action::Create {
            cloud_init: secret.into(),
            credentials: Some(ProxyCredentials::new(
                egress_provider::Credentials::new("u", "SENTINEL-pw").unwrap(),
                "s",
            )),
        };
        let facts = Facts {
            secret: Some(Ok(secret.into())),
            ..Default::default()
        };
        for text in [format!("{action:?}"), format!("{facts:?}")] {
            assert!(!text.contains("SENTINEL"), "{text}");
            assert!(text.contains(&format!("<{} bytes>", secret.len())), "{text}");
        }
    }
}
