//! The part of a test backend every provider needs the same way: record each
//! backend call, and apply the suite's outage switch, gates, delays and
//! injected faults to it (hooks H06-H09 and H16).
//!
//! A provider's test backend calls [`Interceptor::enter`] at the top of each
//! backend call and turns a returned [`Fault`] into its own error type; its
//! [`BackendHooks`](crate::BackendHooks) implementation forwards the five
//! hooks to the methods of the same names here.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::hooks::{BackendCall, CallKind, Fault, Gate, Times};

#[derive(Debug, Default)]
struct State {
    calls: Vec<BackendCall>,
    faults: Vec<(CallKind, Fault, Option<u32>)>,
    gates: Vec<(CallKind, Gate)>,
    delays: Vec<(CallKind, Duration)>,
    unreachable: bool,
}

/// Call log and fault injection for one test backend. Clones share state.
#[derive(Clone, Debug, Default)]
pub struct Interceptor {
    state: Arc<Mutex<State>>,
}

impl Interceptor {
    /// Nothing recorded, nothing injected.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every backend call passes here first: it is recorded, then an outage
    /// fails it with [`Fault::ConnectionReset`]; otherwise a gate holds it,
    /// a delay slows it, and an injected fault for its kind fails it.
    ///
    /// # Errors
    /// The fault the call must fail with.
    pub async fn enter(&self, kind: CallKind, target: &str) -> Result<(), Fault> {
        let (gate, delay) = {
            let mut st = self.lock();
            st.calls.push(BackendCall {
                kind,
                target: target.to_owned(),
            });
            if st.unreachable {
                return Err(Fault::ConnectionReset);
            }
            let gate = st
                .gates
                .iter()
                .position(|(k, _)| *k == kind)
                .map(|i| st.gates.remove(i).1);
            let delay = st.delays.iter().find(|(k, _)| *k == kind).map(|(_, d)| *d);
            (gate, delay)
        };
        if let Some(gate) = gate {
            gate.pass().await;
        }
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let mut st = self.lock();
        let Some(i) = st.faults.iter().position(|(k, _, _)| *k == kind) else {
            return Ok(());
        };
        let fault = st.faults[i].1.clone();
        match &mut st.faults[i].2 {
            Some(n) if *n <= 1 => {
                st.faults.remove(i);
            }
            Some(n) => *n -= 1,
            None => {}
        }
        Err(fault)
    }

    /// H06: every call so far, in order.
    pub fn call_log(&self) -> Vec<BackendCall> {
        self.lock().calls.clone()
    }

    /// H07: fail matching calls with `fault`.
    pub fn fail(&self, kind: CallKind, fault: Fault, times: Times) {
        let n = match times {
            Times::Once => Some(1),
            Times::N(n) => Some(n),
            Times::Always => None,
        };
        self.lock().faults.push((kind, fault, n));
    }

    /// H07: remove every injected fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// H08: hold the next matching call until the returned gate is released.
    pub fn freeze(&self, kind: CallKind) -> Gate {
        let gate = Gate::new();
        self.lock().gates.push((kind, gate.clone()));
        gate
    }

    /// H09: slow every matching call down by `by` (replacing an earlier delay).
    pub fn delay(&self, kind: CallKind, by: Duration) {
        let mut st = self.lock();
        st.delays.retain(|(k, _)| *k != kind);
        st.delays.push((kind, by));
    }

    /// H16: every call fails (and is still recorded) while set.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.lock().unreachable = unreachable;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: CallKind = CallKind("k");
    const OTHER: CallKind = CallKind("other");

    #[tokio::test]
    async fn faults_hit_their_kind_the_given_number_of_times() {
        let i = Interceptor::new();
        i.fail(K, Fault::Busy, Times::N(2));
        assert_eq!(i.enter(OTHER, "a").await, Ok(()));
        assert_eq!(i.enter(K, "a").await, Err(Fault::Busy));
        assert_eq!(i.enter(K, "a").await, Err(Fault::Busy));
        assert_eq!(i.enter(K, "a").await, Ok(()));
        assert_eq!(i.call_log().len(), 4);
    }

    #[tokio::test]
    async fn an_outage_fails_every_call_but_records_it() {
        let i = Interceptor::new();
        i.set_unreachable(true);
        assert_eq!(i.enter(K, "a").await, Err(Fault::ConnectionReset));
        i.set_unreachable(false);
        assert_eq!(i.enter(K, "a").await, Ok(()));
        assert_eq!(
            i.call_log(),
            vec![
                BackendCall {
                    kind: K,
                    target: "a".into()
                };
                2
            ]
        );
    }

    #[tokio::test]
    async fn a_gate_holds_one_call_until_released() {
        let i = Interceptor::new();
        let gate = i.freeze(K);
        let held = tokio::spawn({
            let i = i.clone();
            async move { i.enter(K, "a").await }
        });
        gate.entered().await;
        assert!(!held.is_finished());
        gate.release();
        assert_eq!(held.await.unwrap(), Ok(()));
        // The gate was used up: the next call passes straight through.
        assert_eq!(i.enter(K, "b").await, Ok(()));
    }
}
