//! The exit verdict (pure): what a Proxy's exit check found, judged against the other Proxies'
//! exits, the operator's own, and what the spec expects. What each means for leases under
//! `--exit-policy` is [`crate::exit_policy`]'s.
//!
//! ```text
//!  no address ───────────────────────────────► Unknown          (offered)
//!  the operator's own address ───────────────► OperatorAddress  (offered under observe only)
//!  other Proxies at the same address ────────► Shared           (offered under observe only)
//!  spec.exit.countries, country not in it ───► Unexpected       (offered under observe only)
//!  spec.exit.countries, country not known ───► Unknown          (offered)
//!  otherwise ────────────────────────────────► Verified         (offered)
//! ```
//!
//! `attributes` are never read: a typed `geo` is the user's word, not an expectation.

use std::net::IpAddr;

use egress_api::{ConditionStatus, reasons};

/// What is known about one Proxy's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitFacts<'a> {
    /// The address its last exit check found, or why it found none.
    pub seen: Result<IpAddr, &'a str>,
    /// How many Proxies' last exit check found this address, this one included.
    pub sharing: usize,
    /// The operator's own exit, when its own check found one.
    pub own: Option<IpAddr>,
    /// The address's country, from the country database.
    pub country: Option<&'a str>,
    /// `spec.exit.countries`.
    pub expected: &'a [String],
}

/// The `ExitVerified` condition of a Proxy. A `False` one keeps it from leases under enforce
/// ([`crate::exit_policy::refused`] reads the condition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitVerdict {
    pub status: ConditionStatus,
    pub reason: &'static str,
    pub message: String,
}

impl ExitVerdict {
    fn new(status: ConditionStatus, reason: &'static str, message: String) -> Self {
        Self {
            status,
            reason,
            message,
        }
    }
}

/// Judges one Proxy's exit.
pub fn judge(facts: &ExitFacts<'_>) -> ExitVerdict {
    use ConditionStatus::{False, True, Unknown};
    let ip = match facts.seen {
        Ok(ip) => ip,
        Err(why) => return ExitVerdict::new(Unknown, reasons::EXIT_UNKNOWN, format!("the exit check failed: {why}")),
    };
    if facts.own == Some(ip) {
        let message = format!("the exit {ip} is the operator's own address: the proxy hides nothing");
        return ExitVerdict::new(False, reasons::EXIT_OPERATOR_ADDRESS, message);
    }
    if facts.sharing > 1 {
        let others = facts.sharing - 1;
        let message = format!(
            "the exit {ip} is shared with {others} other {}",
            if others == 1 { "Proxy" } else { "Proxies" }
        );
        return ExitVerdict::new(False, reasons::EXIT_SHARED, message);
    }
    if !facts.expected.is_empty() {
        let Some(country) = facts.country else {
            let message = format!(
                "the country of the exit {ip} is not known (no country database, or the address is not in it), so spec.exit.countries cannot be checked"
            );
            return ExitVerdict::new(Unknown, reasons::EXIT_UNKNOWN, message);
        };
        if !facts.expected.iter().any(|c| c == country) {
            let message = format!(
                "the exit {ip} is in {country}, not in spec.exit.countries ({})",
                facts.expected.join(", ")
            );
            return ExitVerdict::new(False, reasons::EXIT_UNEXPECTED, message);
        }
    }
    let message = match facts.country {
        Some(country) => format!("the exit {ip}, in {country}, is this proxy's alone"),
        None => format!("the exit {ip} is this proxy's alone"),
    };
    ExitVerdict::new(True, reasons::EXIT_VERIFIED, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(seen: Result<IpAddr, &'a str>, expected: &'a [String]) -> ExitFacts<'a> {
        ExitFacts {
            seen,
            sharing: 1,
            own: Some("198.51.100.1".parse().unwrap()),
            country: Some("DE"),
            expected,
        }
    }

    #[test]
    fn each_finding_has_its_reason_and_status_operator_address_before_shared() {
        let ip: IpAddr = "203.0.113.7".parse().unwrap();
        let de = ["DE".to_owned()];
        let fr = ["FR".to_owned(), "BE".to_owned()];
        let cases: Vec<(ExitFacts<'_>, &str, ConditionStatus)> = vec![
            (facts(Ok(ip), &[]), reasons::EXIT_VERIFIED, ConditionStatus::True),
            (facts(Ok(ip), &de), reasons::EXIT_VERIFIED, ConditionStatus::True),
            (
                facts(Err("no answer within 5s"), &de),
                reasons::EXIT_UNKNOWN,
                ConditionStatus::Unknown,
            ),
            (
                ExitFacts {
                    own: Some(ip),
                    sharing: 3,
                    ..facts(Ok(ip), &[])
                },
                reasons::EXIT_OPERATOR_ADDRESS,
                ConditionStatus::False,
            ),
            (
                ExitFacts {
                    sharing: 3,
                    ..facts(Ok(ip), &fr)
                },
                reasons::EXIT_SHARED,
                ConditionStatus::False,
            ),
            (facts(Ok(ip), &fr), reasons::EXIT_UNEXPECTED, ConditionStatus::False),
            (
                ExitFacts {
                    country: None,
                    ..facts(Ok(ip), &fr)
                },
                reasons::EXIT_UNKNOWN,
                ConditionStatus::Unknown,
            ),
            (
                ExitFacts {
                    country: None,
                    ..facts(Ok(ip), &[])
                },
                reasons::EXIT_VERIFIED,
                ConditionStatus::True,
            ),
        ];
        for (facts, reason, status) in cases {
            let verdict = judge(&facts);
            assert_eq!((verdict.reason, verdict.status), (reason, status), "{facts:?}");
        }
    }

    #[test]
    fn messages_say_what_was_found() {
        let ip: IpAddr = "203.0.113.7".parse().unwrap();
        let shared = judge(&ExitFacts {
            sharing: 2,
            ..facts(Ok(ip), &[])
        });
        assert_eq!(shared.message, "the exit 203.0.113.7 is shared with 1 other Proxy");
        let fr = ["FR".to_owned()];
        assert_eq!(
            judge(&facts(Ok(ip), &fr)).message,
            "the exit 203.0.113.7 is in DE, not in spec.exit.countries (FR)"
        );
        assert_eq!(
            judge(&facts(Ok(ip), &[])).message,
            "the exit 203.0.113.7, in DE, is this proxy's alone"
        );
    }
}
