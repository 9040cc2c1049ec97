//! One pooled connection per host, dialled on first use.
//!
//! Each host has a one-slot lock held while checking or dialling (not during calls): concurrent
//! callers for one host cause one dial, hosts never wait for each other, and a caller waiting
//! for the slot gives up when its context ends. A dead connection is replaced; a failed dial is
//! not remembered (the next caller dials again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use egress_provider::OpCtx;

use crate::connection::Connection;
use crate::dial::{Dialer, HostTarget};
use crate::error::{DialCause, DialError, Stage};

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Connection>>>>;

/// The pooled connections of one provider entry.
#[derive(Debug)]
pub struct Pool {
    dialer: Arc<Dialer>,
    slots: Mutex<HashMap<String, Slot>>,
}

impl Pool {
    /// An empty pool dialling with `dialer`.
    pub fn new(dialer: Arc<Dialer>) -> Self {
        Self {
            dialer,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The dialer, for connections that are never pooled (uploads, health checks).
    pub fn dialer(&self) -> &Arc<Dialer> {
        &self.dialer
    }

    fn slot(&self, host: &str) -> Slot {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(host.to_owned())
            .or_default()
            .clone()
    }

    /// The live pooled connection to `host`, dialled when there is none.
    ///
    /// # Errors
    /// The dial's error; waiting for the slot past `cx` is a [`DialCause::Cancelled`] at the
    /// credentials stage (nothing was dialled).
    pub async fn get(&self, cx: &OpCtx, host: &HostTarget) -> Result<Arc<Connection>, DialError> {
        let slot = self.slot(&host.name);
        // An uncontended caller takes the slot even when its context has just ended.
        let mut held = match slot.try_lock() {
            Ok(held) => held,
            Err(_) => cx.run(slot.lock()).await.map_err(|why| DialError {
                host: host.name.clone(),
                stage: Stage::Credentials,
                cause: DialCause::Cancelled(format!("waiting for the connection to host {}: {why}", host.name)),
            })?,
        };
        if let Some(conn) = held.as_ref() {
            if !conn.is_dead() {
                return Ok(conn.clone());
            }
            tracing::debug!(host = %host.name, reason = %conn.link().reason().unwrap_or_default(), "libvirt connection lost, redialing");
        }
        *held = None;
        let conn = Arc::new(self.dialer.dial(cx, host).await?);
        *held = Some(conn.clone());
        Ok(conn)
    }
}
