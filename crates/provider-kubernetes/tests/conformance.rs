//! The conformance suite against egress-kube-testserver, whose request hook serves as the
//! backend hooks.

mod support;

egress_conformance::conformance_suite!(support::KubeTarget);
