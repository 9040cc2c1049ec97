//! Keyed locks whose waits end with the caller (spec/kvm.md §7.9): one slot per key, the entry
//! of a key removed once nobody holds or waits for it, so the table does not keep every name it
//! has seen, while everyone waiting on one key waits on the same slot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use egress_provider::{Interrupted, OpCtx};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, Default)]
struct Table {
    /// Per key: its slot and how many hold or wait for it.
    entries: HashMap<String, (Arc<Semaphore>, usize)>,
}

/// A table of keyed locks.
#[derive(Debug, Default, Clone)]
pub struct KeyedLocks {
    table: Arc<Mutex<Table>>,
}

/// Counts one holder or waiter of a key; the last one out removes the key's entry.
#[derive(Debug)]
struct Interest {
    table: Arc<Mutex<Table>>,
    key: String,
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, users)) = table.entries.get_mut(&self.key) {
            *users -= 1;
            if *users == 0 {
                table.entries.remove(&self.key);
            }
        }
    }
}

/// A held key; dropping it releases the key (exactly once).
#[derive(Debug)]
pub struct KeyGuard {
    // Field order: the permit goes back before the interest is withdrawn, so the entry a
    // waiter holds is never removed under it.
    _permit: OwnedSemaphorePermit,
    _interest: Interest,
}

impl KeyedLocks {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes `key`, waiting for its holder if there is one.
    ///
    /// # Errors
    /// Why the caller stopped waiting.
    pub async fn acquire(&self, cx: &OpCtx, key: &str) -> Result<KeyGuard, Interrupted> {
        let slot = {
            let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            let entry = table
                .entries
                .entry(key.to_owned())
                .or_insert_with(|| (Arc::new(Semaphore::new(1)), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        let interest = Interest {
            table: self.table.clone(),
            key: key.to_owned(),
        };
        let permit = cx.run(slot.acquire_owned()).await?;
        // The semaphore is never closed.
        let permit = permit.map_err(|_| Interrupted::Cancelled)?;
        Ok(KeyGuard {
            _permit: permit,
            _interest: interest,
        })
    }

    /// How many keys are held or waited for.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).entries.len()
    }

    /// Whether no key is held or waited for.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use egress_provider::CancellationToken;

    use super::*;

    #[tokio::test]
    async fn one_holder_per_key_and_nothing_kept_afterwards() {
        let locks = KeyedLocks::new();
        let cx = OpCtx::background();
        let a = locks.acquire(&cx, "a").await.unwrap();
        // Another key is independent.
        let b = locks.acquire(&cx, "b").await.unwrap();
        assert_eq!(locks.len(), 2);
        // A waiter on a held key gives up with its caller.
        let token = CancellationToken::new();
        let waiter = {
            let locks = locks.clone();
            let cx = OpCtx::with_cancel(token.clone());
            tokio::spawn(async move { locks.acquire(&cx, "a").await.map(drop) })
        };
        token.cancel();
        assert_eq!(waiter.await.unwrap(), Err(Interrupted::Cancelled));
        // A waiter that stays gets the key once it is released.
        let next = {
            let locks = locks.clone();
            tokio::spawn(async move { locks.acquire(&OpCtx::background(), "a").await.map(drop) })
        };
        drop(a);
        assert_eq!(next.await.unwrap(), Ok(()));
        drop(b);
        assert!(locks.is_empty(), "released keys leave no entry behind");
    }
}
