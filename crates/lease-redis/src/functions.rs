//! The scripts as one library of Redis Functions (`FUNCTION LOAD`, `FCALL`; Redis 7.0): the
//! shared Lua (`clock`, `ended`, the index's) is compiled once when the library loads, where an
//! `EVALSHA` of the same code defines it all again on every call. Measured on the bench
//! machine, that definition costs Redis about 2 µs of every call's 3.4 µs of fixed cost.
//!
//! The library's name carries a digest of its code, so during a rolling update replicas of two
//! versions on one Redis each call their own code. A library of an older version stays (a few
//! kilobytes) until someone deletes it (`FUNCTION DELETE`).
//!
//! Redis keeps functions in its snapshot and append-only file and sends them to its replicas;
//! a server that has lost them (restarted without its data, or a node new to the cluster)
//! answers "Function not found", and the call loads the library and is sent again.

use std::future::Future;

use redis::{Cmd, RedisResult};

use crate::CALL_BUDGET;
use crate::connection::{Connection, Live};

/// One operation of the store: a function of the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    AcquireIndexed,
    Release,
    Report,
    Active,
    Sweep,
    Publish,
    Session,
    Renew,
}

impl Op {
    pub(crate) const ALL: [Op; 9] = [
        Op::Acquire,
        Op::AcquireIndexed,
        Op::Release,
        Op::Report,
        Op::Active,
        Op::Sweep,
        Op::Publish,
        Op::Session,
        Op::Renew,
    ];

    /// The function's name within the library, and what a person reading figures calls it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::AcquireIndexed => "acquire_indexed",
            Op::Release => "release",
            Op::Report => "report",
            Op::Active => "active",
            Op::Sweep => "sweep",
            Op::Publish => "publish",
            Op::Session => "session",
            Op::Renew => "renew",
        }
    }

    fn body(self) -> &'static str {
        match self {
            Op::Acquire => include_str!("lua/acquire.lua"),
            Op::AcquireIndexed => include_str!("lua/acquire_indexed.lua"),
            Op::Release => include_str!("lua/release.lua"),
            Op::Report => include_str!("lua/report.lua"),
            Op::Active => include_str!("lua/active.lua"),
            Op::Sweep => include_str!("lua/sweep.lua"),
            Op::Publish => include_str!("lua/publish.lua"),
            Op::Session => include_str!("lua/session.lua"),
            Op::Renew => include_str!("lua/renew.lua"),
        }
    }
}

/// Stands for the library's name in its code until the name, a digest of that code, is known.
const NAME: &str = "@library@";

/// The library: its code and its name.
#[derive(Debug)]
pub(crate) struct Library {
    name: String,
    code: String,
}

impl Library {
    pub(crate) fn new() -> Self {
        let shared = [
            include_str!("lua/clock.lua"),
            include_str!("lua/ended.lua"),
            include_str!("lua/index.lua"),
        ]
        .concat();
        // The whole code with a stand-in for the name, so that the digest covers all of it.
        let mut template = format!("#!lua name={NAME}\n{shared}\n");
        for op in Op::ALL {
            // Each script body becomes a function taking the keys and arguments by the names
            // `EVAL` gives them.
            template.push_str(&format!(
                "redis.register_function('{NAME}_{}', function(KEYS, ARGV)\n{}\nend)\n",
                op.name(),
                op.body()
            ));
        }
        // The SHA-1 the client library computes for scripts; twelve hex digits tell versions
        // apart.
        let digest: String = redis::Script::new(&template).get_hash().chars().take(12).collect();
        let name = format!("egress_lease_{digest}");
        Self {
            code: template.replace(NAME, &name),
            name,
        }
    }

    /// The name `FCALL` (and Redis's slow log) gives the operation's function.
    pub(crate) fn function(&self, op: Op) -> String {
        format!("{}_{}", self.name, op.name())
    }

    /// `FCALL` of the operation on the store whose keys' hash tag is `tag`.
    pub(crate) fn call(&self, op: Op, tag: &str, args: &[String]) -> Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(self.function(op)).arg(1).arg(tag).arg(args);
        cmd
    }

    /// `FUNCTION LOAD REPLACE`: replicas loading at once, or again, do no harm (the code under a
    /// name is always the same). On a cluster the client library sends it to every master.
    fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(&self.code);
        cmd
    }

    /// Sends `call` (an `FCALL`, or a pipeline that starts with one) on `connection` within
    /// [`CALL_BUDGET`]: when the server does not have the library, it is loaded and `call` sent
    /// once more, each within its own budget (so such a call may take three). `None`: no
    /// answer in time.
    pub(crate) async fn send<T, F, Fut>(&self, connection: &Connection, call: F) -> Option<RedisResult<T>>
    where
        F: Fn(Live) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        match connection.within(CALL_BUDGET, &call).await {
            Some(Err(e)) if missing(&e) => {
                let load = self.load();
                let load = &load;
                let loaded = connection
                    .within(CALL_BUDGET, |mut live| async move {
                        load.query_async::<redis::Value>(&mut live).await
                    })
                    .await;
                // Sent again whatever the load answered: on a cluster it fails when any master
                // refuses it, while the one that holds the store's slot may have it.
                match (connection.within(CALL_BUDGET, &call).await, loaded) {
                    // Still missing: why the load failed says more.
                    (Some(Err(e)), Some(Err(load))) if missing(&e) => Some(Err(load)),
                    (again, _) => again,
                }
            }
            other => other,
        }
    }
}

/// Whether Redis answered that it has no such function.
fn missing(e: &redis::RedisError) -> bool {
    e.to_string().contains("Function not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_names_every_function_after_its_code() {
        let library = Library::new();
        assert!(library.code.starts_with(&format!("#!lua name={}\n", library.name)));
        assert!(!library.code.contains(NAME));
        for op in Op::ALL {
            assert!(
                library
                    .code
                    .contains(&format!("redis.register_function('{}',", library.function(op))),
                "{op:?}"
            );
        }
        assert_eq!(library.name, Library::new().name, "the same code, the same name");
        assert!(library.name.len() == "egress_lease_".len() + 12);
    }
}
