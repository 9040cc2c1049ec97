//! The liveness record of one connection: a dead signal fired exactly once, the reason, and the
//! action that tears the transport down.
//!
//! Marking dead never waits on the teardown (spec H1): under a short lock the first caller
//! records the reason and fires the signal; the lock is released; only then does the kill run,
//! outside any lock. A kill that blocks can delay nobody but the task that runs it, so an
//! abandoning caller returns at once and everyone waiting on the signal wakes with the reason
//! already readable.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

type Kill = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    reason: Option<String>,
    kill: Option<Kill>,
}

/// One connection's liveness. Clones share it.
#[derive(Clone)]
pub struct Link {
    state: Arc<Mutex<State>>,
    dead: watch::Sender<bool>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("dead_because", &self.reason()).finish()
    }
}

impl Default for Link {
    fn default() -> Self {
        Self::new()
    }
}

impl Link {
    /// A live link with nothing to kill yet.
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            dead: watch::channel(false).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets what marking dead runs. On a link that is already dead it runs at once.
    pub fn on_kill(&self, kill: impl FnOnce() + Send + 'static) {
        let mut st = self.lock();
        if st.reason.is_some() {
            drop(st);
            kill();
            return;
        }
        st.kill = Some(Box::new(kill));
    }

    /// Marks the link dead for `reason` (the first reason wins), wakes every waiter, and then
    /// runs the kill outside any lock.
    pub fn mark_dead(&self, reason: impl Into<String>) {
        let kill = {
            let mut st = self.lock();
            if st.reason.is_some() {
                return;
            }
            st.reason = Some(reason.into());
            self.dead.send_replace(true);
            st.kill.take()
        };
        if let Some(kill) = kill {
            kill();
        }
    }

    /// Whether the link is dead.
    pub fn is_dead(&self) -> bool {
        *self.dead.borrow()
    }

    /// Why the link died, once it has.
    pub fn reason(&self) -> Option<String> {
        self.lock().reason.clone()
    }

    /// Resolves once the link is dead.
    pub async fn dead(&self) {
        let mut rx = self.dead.subscribe();
        // The sender lives in self, so this cannot fail.
        let _ = rx.wait_for(|d| *d).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn the_first_reason_wins_and_the_kill_runs_once() {
        let link = Link::new();
        let kills = Arc::new(AtomicUsize::new(0));
        let k = kills.clone();
        link.on_kill(move || {
            k.fetch_add(1, Ordering::SeqCst);
        });
        assert!(!link.is_dead());
        link.mark_dead("keepalive: no reply");
        link.mark_dead("closed");
        assert!(link.is_dead());
        assert_eq!(link.reason().as_deref(), Some("keepalive: no reply"));
        assert_eq!(kills.load(Ordering::SeqCst), 1);
        link.dead().await;
        // A kill set after death runs at once.
        let k = kills.clone();
        link.on_kill(move || {
            k.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(kills.load(Ordering::SeqCst), 2);
    }

    /// Spec H1: a kill that blocks delays nobody else: the dead signal is observed, the reason
    /// is readable, and other markers return, while the kill is still blocked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blocked_kill_blocks_nobody_else() {
        let link = Link::new();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        link.on_kill(move || {
            let _ = started_tx.send(());
            // Parked until the test releases it, as a close stuck behind a frozen TCP write.
            let _ = release_rx.recv();
        });
        let killer = {
            let link = link.clone();
            std::thread::spawn(move || link.mark_dead("call DomainCreate abandoned"))
        };
        started_rx.await.unwrap();
        // The kill is parked: the state's lock must be free, or every reader below would hang.
        assert!(
            link.state.try_lock().is_ok(),
            "the kill runs while the link's lock is held"
        );
        link.dead().await;
        assert_eq!(link.reason().as_deref(), Some("call DomainCreate abandoned"));
        // Another marker returns at once.
        link.mark_dead("keepalive: no reply");
        assert!(!killer.is_finished(), "the kill is still parked");
        release_tx.send(()).unwrap();
        killer.join().unwrap();
    }
}
