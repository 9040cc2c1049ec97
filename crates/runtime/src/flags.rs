//! Command lines parsed the way Go's `flag` package parses them, so manifests and scripts written
//! for the Go operator keep working: `-name` and `--name`, `--name=value` and `--name value`,
//! booleans only as `--name` or `--name=<bool>`, `--` ends the flags, a repeated flag keeps its
//! last value.
//!
//! One difference, on purpose: Go stops at the first argument that is not a flag and ignores the
//! rest, so `--leader-elect false` silently leaves leader election on and drops every later flag.
//! Here a stray argument is an error.
//!
//! A program describes each flag once ([`Flag`]: its Go name, default, help and setter) and gets
//! [`parse`] and [`usage`] from that one table. The `--zap-*` flags every binary shares are
//! [`log_flags`].

use std::time::Duration;

use crate::ProgramOptions;
use crate::logging::LogLevel;

/// How a flag takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `--name` alone is `true`; a value only as `--name=<bool>`.
    Bool,
    /// A Go duration; listed as `duration` in the help.
    Duration,
    /// Any other text; listed as `string` in the help.
    Text,
}

/// What an unusable value looks like in the error line, which may reach a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// As given, with any password in it masked ([`redact`]).
    Redacted,
    /// Not at all: a value that may hide a secret from any pattern (a malformed URL).
    Hidden,
}

/// One flag of a program's table.
pub struct Flag<O> {
    /// The Go name, without dashes.
    pub name: &'static str,
    pub kind: Kind,
    /// The default as the help shows it; empty or `false` is not shown.
    pub default: &'static str,
    pub usage: &'static str,
    /// Puts a value into the options, or says why it cannot.
    pub set: fn(&mut O, &str) -> Result<(), String>,
    pub shown: Shown,
}

impl<O> Flag<O> {
    /// A flag whose bad values are shown redacted.
    pub const fn new(
        name: &'static str,
        kind: Kind,
        default: &'static str,
        usage: &'static str,
        set: fn(&mut O, &str) -> Result<(), String>,
    ) -> Self {
        Self {
            name,
            kind,
            default,
            usage,
            set,
            shown: Shown::Redacted,
        }
    }

    /// The same flag, its bad values never shown.
    #[must_use]
    pub const fn hidden(self) -> Self {
        Self {
            shown: Shown::Hidden,
            ..self
        }
    }
}

impl<O> Clone for Flag<O> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<O> Copy for Flag<O> {}

impl<O> std::fmt::Debug for Flag<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flag").field("name", &self.name).finish_non_exhaustive()
    }
}

/// What a command line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Run with the options as parsed.
    Run,
    /// `-h`, `-help` or `--help`: print [`usage`] and exit 0.
    Help,
}

/// A command line that cannot be used. Printed as one line, before any logger exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("flag provided but not defined: -{0}")]
    Unknown(String),
    #[error("flag needs an argument: -{0}")]
    MissingValue(String),
    #[error("invalid value {value:?} for flag -{flag}: {reason}")]
    Invalid {
        flag: String,
        value: String,
        reason: String,
    },
    #[error("bad flag syntax: {0}")]
    Syntax(String),
    #[error("unexpected argument {0:?}: every setting is a flag (a boolean takes its value as -flag=false)")]
    Stray(String),
}

/// Parses `args` (those after the program name) into `options` with the table `flags`.
///
/// # Errors
///
/// The first unusable argument, worded as Go's `flag` package words it.
pub fn parse<O, I, S>(flags: &[Flag<O>], options: &mut O, args: I) -> Result<Parsed, FlagError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        if arg == "--" {
            return match args.next() {
                Some(stray) => Err(FlagError::Stray(stray)),
                None => Ok(Parsed::Run),
            };
        }
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(FlagError::Stray(arg));
        };
        if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
            return Err(FlagError::Syntax(arg));
        }
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let Some(flag) = flags.iter().find(|f| f.name == name) else {
            if name == "h" || name == "help" {
                return Ok(Parsed::Help);
            }
            return Err(FlagError::Unknown(name.into()));
        };
        let value = match (flag.kind, inline) {
            (_, Some(v)) => v,
            (Kind::Bool, None) => "true".into(),
            (_, None) => args.next().ok_or_else(|| FlagError::MissingValue(name.into()))?,
        };
        (flag.set)(options, &value).map_err(|reason| FlagError::Invalid {
            flag: name.into(),
            value: match flag.shown {
                Shown::Redacted => redact(&value),
                Shown::Hidden => "<not shown>".to_owned(),
            },
            reason,
        })?;
    }
    Ok(Parsed::Run)
}

/// The help text of `program`, listing every flag of `flags` with its default.
pub fn usage<O>(program: &str, flags: &[Flag<O>]) -> String {
    let mut text = format!("Usage of {program}:\n");
    for f in flags {
        let kind = match f.kind {
            Kind::Bool => "",
            Kind::Duration => " duration",
            Kind::Text => " string",
        };
        text.push_str(&format!("  -{}{kind}\n    \t{}", f.name, f.usage));
        if !f.default.is_empty() && f.default != "false" {
            text.push_str(&format!(" (default {:?})", f.default));
        }
        text.push('\n');
    }
    text
}

/// A value with the password of any `user:password@` in it masked, so an error line that quotes
/// a value never carries one.
pub fn redact(value: &str) -> String {
    egress_credentials::redact(value)
}

/// The `--zap-*` flags of controller-runtime, which every binary of the project takes.
pub fn log_flags<O: ProgramOptions>() -> [Flag<O>; 5] {
    [
        Flag::new(
            "zap-devel",
            Kind::Bool,
            "true",
            "Development logging defaults (console, debug, stack traces from warn); false gives production ones (json, info, stack traces from error).",
            |o, v| {
                o.log().devel = parse_bool(v)?;
                Ok(())
            },
        ),
        Flag::new(
            "zap-encoder",
            Kind::Text,
            "",
            "Log encoding: json or console.",
            |o, v| {
                o.log().encoder = Some(v.parse()?);
                Ok(())
            },
        ),
        Flag::new(
            "zap-log-level",
            Kind::Text,
            "",
            "Least level logged: debug, info, error, or an integer > 0 for more verbose debug output.",
            |o, v| {
                o.log().level = Some(v.parse::<LogLevel>()?);
                Ok(())
            },
        ),
        Flag::new(
            "zap-stacktrace-level",
            Kind::Text,
            "",
            "Least level whose lines carry a stack trace: info, error or panic.",
            |o, v| {
                o.log().stacktrace_level = Some(v.parse()?);
                Ok(())
            },
        ),
        Flag::new(
            "zap-time-encoding",
            Kind::Text,
            "",
            "Time format of log lines: epoch, millis, nano, iso8601, rfc3339 or rfc3339nano.",
            |o, v| {
                o.log().time_encoding = Some(v.parse()?);
                Ok(())
            },
        ),
    ]
}

/// Go's `strconv.ParseBool`.
///
/// # Errors
///
/// Not one of Go's spellings of true or false.
pub fn parse_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("parse error".into()),
    }
}

pub use egress_go_decode::parse_duration;

/// A whole number from `min` to `max`.
///
/// # Errors
///
/// Not a whole number, or out of the range.
pub fn whole(value: &str, min: u32, max: u32) -> Result<u32, String> {
    value
        .parse()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| format!("must be a whole number from {min} to {max}"))
}

/// A duration that is not zero.
///
/// # Errors
///
/// Zero.
pub fn positive(d: Duration) -> Result<Duration, String> {
    if d.is_zero() {
        Err("must be more than 0".into())
    } else {
        Ok(d)
    }
}

/// A comma-separated list, each item trimmed, empty items dropped.
pub fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
