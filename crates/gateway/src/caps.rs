//! The cap on each client's tunnels and plain-HTTP requests at once, by client name (a client
//! with several tokens has one count).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Each client's tunnels being carried. Only clients holding one are kept, so the map is
/// bounded by the gateway's connection cap.
#[derive(Debug)]
pub(crate) struct ClientCaps {
    per_client: usize,
    held: Mutex<HashMap<String, usize>>,
}

/// One tunnel of a client, counted until dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    caps: Arc<ClientCaps>,
    client: String,
}

impl ClientCaps {
    pub(crate) fn new(per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            per_client,
            held: Mutex::default(),
        })
    }

    /// A slot for `client`, unless it holds its cap already.
    pub(crate) fn take(self: &Arc<Self>, client: &str) -> Option<Slot> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let n = held.entry(client.to_owned()).or_default();
        if *n >= self.per_client {
            if *n == 0 {
                held.remove(client);
            }
            return None;
        }
        *n += 1;
        Some(Slot {
            caps: self.clone(),
            client: client.to_owned(),
        })
    }

    #[cfg(test)]
    fn clients(&self) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.caps.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_holds_at_most_its_cap_and_a_dropped_slot_frees_one() {
        let caps = ClientCaps::new(2);
        let a1 = caps.take("team-a").unwrap();
        let _a2 = caps.take("team-a").unwrap();
        assert!(caps.take("team-a").is_none());
        let b = caps.take("team-b").expect("another client has its own count");
        drop(a1);
        assert!(caps.take("team-a").is_some());
        drop(b);
        assert_eq!(caps.clients(), 1, "a client holding nothing is forgotten");
        assert!(ClientCaps::new(0).take("x").is_none());
    }
}
