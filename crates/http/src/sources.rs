//! Connections counted per source address, so that one source cannot hold every slot of a
//! server before it has even authenticated. A source is the peer's IP address (an IPv4-mapped
//! IPv6 one counts as its IPv4 address); clients behind one SNAT address are one source and
//! share its cap. The map holds one entry per source with a connection open, so it never holds
//! more entries than the server has connections.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The open connections of each source, and the cap on them.
#[derive(Debug)]
pub(crate) struct Sources {
    cap: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection of a source, counted until dropped.
#[derive(Debug)]
pub(crate) struct SourceSlot {
    sources: Arc<Sources>,
    ip: IpAddr,
}

impl Sources {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one more connection from `ip`, or `None` when it has its cap open.
    pub(crate) fn take(self: &Arc<Self>, ip: IpAddr) -> Option<SourceSlot> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = open.entry(ip).or_insert(0);
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(SourceSlot {
            sources: self.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self
            .sources
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_has_its_cap_and_leaves_no_entry_once_closed() {
        let sources = Sources::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = sources.take(a).unwrap();
        let second = sources.take(mapped).expect("the same source, mapped, has one left");
        assert!(sources.take(a).is_none(), "the third from one source");
        let other = sources.take(b).expect("another source is served");
        drop(first);
        let again = sources.take(a).expect("a closed connection frees its slot");
        drop((second, again, other));
        assert!(sources.open.lock().unwrap().is_empty());
    }
}
