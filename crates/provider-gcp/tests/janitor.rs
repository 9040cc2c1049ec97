//! The janitor of `cargo xtask conformance --provider gcp --real`
//! ([`egress_provider_gcp::suite_run::sweep`]) against the fake Compute server: it removes every
//! instance a conformance run labelled, and nothing else.

mod support;

use std::time::Duration;

use egress_provider::{LABEL_INSTALLATION, LABEL_MANAGED, LABEL_UID, OpCtx};
use egress_provider_gcp::WireOptions;
use egress_provider_gcp::suite_run::{Pacing, Sweep, sweep};
use support::{GcpBackend, ZONES};

/// A managed instance labelled with `installation` (none when `None`).
fn seed(b: &GcpBackend, name: &str, zone: &str, status: &str, installation: Option<&str>) {
    b.fake.with(|w| {
        let mut vm = w.new_vm(name, zone);
        vm.status = status.into();
        vm.labels.insert(LABEL_MANAGED.into(), "true".into());
        vm.labels.insert(LABEL_UID.into(), format!("uid-{name}"));
        if let Some(i) = installation {
            vm.labels.insert(LABEL_INSTALLATION.into(), i.into());
        }
        w.seed(vm);
    });
}

fn names(b: &GcpBackend) -> Vec<String> {
    let mut names: Vec<String> = b.fake.with(|w| w.vms()).into_iter().map(|vm| vm.name).collect();
    names.sort();
    names
}

/// A budget that runs out quickly, for the sweeps that cannot finish.
const SHORT: Pacing = Pacing {
    poll: Duration::from_millis(10),
    budget: Duration::from_millis(100),
};

const QUICK: Pacing = Pacing {
    poll: Duration::from_millis(10),
    budget: Duration::from_secs(30),
};

#[tokio::test]
async fn the_janitor_removes_every_runs_instances_and_nothing_else() {
    let b = GcpBackend::new().await;
    seed(
        &b,
        "proxy-this-run",
        ZONES[0],
        "RUNNING",
        Some("conformance-1796400000"),
    );
    seed(&b, "proxy-killed-run", ZONES[1], "PROVISIONING", Some("conformance-1"));
    seed(&b, "proxy-stopped-run", ZONES[0], "TERMINATED", Some("conformance-2"));
    seed(&b, "proxy-prod", ZONES[0], "RUNNING", Some("prod"));
    seed(&b, "proxy-lookalike", ZONES[0], "RUNNING", Some("conformance-prod"));
    seed(&b, "proxy-go-operator", ZONES[1], "RUNNING", None);
    let p = b.provider("janitor", WireOptions::default());
    let cx = OpCtx::background().with_timeout(Duration::from_secs(60));
    let mut deleted: Vec<String> = sweep(&p, &cx, &Sweep::AllRuns, QUICK)
        .await
        .expect("the sweep")
        .into_iter()
        .map(|id| id.as_str().rsplit('/').next().unwrap_or_default().to_owned())
        .collect();
    deleted.sort();
    assert_eq!(deleted, ["proxy-killed-run", "proxy-stopped-run", "proxy-this-run"]);
    assert_eq!(
        names(&b),
        ["proxy-go-operator", "proxy-lookalike", "proxy-prod"],
        "only the runs' instances went"
    );
    // One run's pass takes only that run's.
    seed(&b, "proxy-run-a", ZONES[0], "RUNNING", Some("conformance-10"));
    seed(&b, "proxy-run-b", ZONES[0], "RUNNING", Some("conformance-11"));
    let only_a = sweep(&p, &cx, &Sweep::Run("conformance-10".into()), QUICK)
        .await
        .expect("one run's sweep");
    assert_eq!(only_a.len(), 1, "{only_a:?}");
    assert_eq!(
        names(&b),
        ["proxy-go-operator", "proxy-lookalike", "proxy-prod", "proxy-run-b"]
    );
    b.fake.with(|w| {
        w.vm("proxy-run-b").expect("run b").labels.remove(LABEL_INSTALLATION);
    });
    // Nothing of any run left: a second pass deletes nothing.
    assert_eq!(
        sweep(&p, &cx, &Sweep::AllRuns, QUICK).await.expect("a second sweep"),
        Vec::new()
    );
}

#[tokio::test]
async fn a_janitor_that_cannot_finish_says_what_is_left() {
    let b = GcpBackend::new().await;
    seed(&b, "proxy-stuck", ZONES[0], "RUNNING", Some("conformance-3"));
    // A delete under way that never finishes (held by the fake).
    assert!(b.fake.with(|w| w.hold_delete("proxy-stuck")));
    let p = b.provider("janitor", WireOptions::default());
    let cx = OpCtx::background().with_timeout(Duration::from_secs(60));
    let e = sweep(&p, &cx, &Sweep::AllRuns, SHORT)
        .await
        .expect_err("the instance never goes");
    assert!(
        e.to_string()
            .contains("still there: zones/europe-west1-b/instances/proxy-stuck"),
        "{e}"
    );
    // An API that does not answer: the sweep ends with the reason, it does not hang.
    b.fake.set_unreachable(true);
    let e = sweep(&p, &cx, &Sweep::AllRuns, SHORT).await.expect_err("no answer");
    assert!(e.to_string().contains("the last list failed"), "{e}");
}
