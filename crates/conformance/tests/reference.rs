//! The in-memory reference provider passes every case of the suite.

use egress_conformance::memory::MemoryTarget;

egress_conformance::conformance_suite!(MemoryTarget::new());
