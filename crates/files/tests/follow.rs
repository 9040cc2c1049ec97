//! The follower's decisions: a change put in force is said once; one that cannot be used keeps
//! what is in force and is said once, until the problem changes or goes away.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_files::{Followed, Follower, Kept, Report, Reports};
use tokio_util::sync::CancellationToken;

/// Followed "files" whose looks are scripted, saying what they are told into `said`; what is
/// in force is the last value a good look gave.
struct Scripted {
    looks: VecDeque<Result<Option<u32>, String>>,
    in_force: u32,
    said: Arc<Mutex<Vec<String>>>,
}

impl Followed for Scripted {
    type Change = u32;
    type Problem = String;

    fn check(&mut self) -> Result<Option<u32>, String> {
        let look = self.looks.pop_front().unwrap_or(Ok(None));
        if let Ok(Some(value)) = look {
            self.in_force = value;
        }
        look
    }

    fn changed(&self, change: &u32) {
        self.said.lock().unwrap().push(format!("changed to {change}"));
    }

    fn unusable(&self, problem: &String) {
        self.said.lock().unwrap().push(format!("unusable: {problem}"));
    }
}

fn scripted(looks: Vec<Result<Option<u32>, &str>>) -> (Scripted, Arc<Mutex<Vec<String>>>) {
    let said = Arc::new(Mutex::new(Vec::new()));
    let looks = looks.into_iter().map(|l| l.map_err(str::to_owned)).collect();
    (
        Scripted {
            looks,
            in_force: 0,
            said: said.clone(),
        },
        said,
    )
}

#[test]
fn a_problem_is_said_once_until_it_changes_or_goes_away() {
    let mut reports = Reports::<&str>::default();
    assert_eq!(reports.after(Ok(Some(1))), Report::Changed(1));
    assert_eq!(reports.after::<u32>(Ok(None)), Report::Unchanged);
    assert_eq!(reports.after::<u32>(Err("bad")), Report::Unusable(&"bad"));
    assert_eq!(reports.after::<u32>(Err("bad")), Report::StillUnusable, "said once");
    assert_eq!(reports.after::<u32>(Err("worse")), Report::Unusable(&"worse"));
    assert_eq!(
        reports.after::<u32>(Err("bad")),
        Report::Unusable(&"bad"),
        "changed again"
    );
    assert_eq!(reports.after::<u32>(Ok(None)), Report::Unchanged);
    assert_eq!(
        reports.after::<u32>(Err("bad")),
        Report::Unusable(&"bad"),
        "a problem back after a good look is new again"
    );
}

#[test]
fn a_kept_value_stays_over_a_missing_or_unusable_file_and_a_problem_is_answered_once() {
    let mut kept = Kept::<&str, &str>::default();
    assert_eq!(kept.value(), None);
    assert_eq!(kept.take(Ok(Some("v1"))), None);
    assert_eq!(kept.take(Ok(None)), None, "missing or empty");
    assert_eq!(kept.value(), Some(&"v1"));
    assert_eq!(kept.take(Err("bad")), Some(&"bad"));
    assert_eq!(kept.take(Err("bad")), None, "answered once");
    assert_eq!(kept.value(), Some(&"v1"), "the old value stays");
    assert_eq!(kept.take(Ok(Some("v2"))), None);
    assert_eq!(kept.value(), Some(&"v2"));
    assert_eq!(kept.take(Err("bad")), Some(&"bad"), "new again after a good value");
    assert_eq!(Kept::<&str, &str>::holding("v0").value(), Some(&"v0"));
}

#[test]
fn the_follower_says_each_change_and_each_new_problem_once() {
    let (files, said) = scripted(vec![
        Ok(Some(1)),
        Ok(None),
        Err("bad"),
        Err("bad"),
        Err("bad"),
        Err("worse"),
        Ok(None),
        Err("worse"),
        Ok(Some(2)),
    ]);
    let mut follower = Follower::new(files);
    for _ in 0..9 {
        follower.check_now();
    }
    assert_eq!(
        *said.lock().unwrap(),
        [
            "changed to 1",
            "unusable: bad",
            "unusable: worse",
            "unusable: worse",
            "changed to 2"
        ]
    );
    assert_eq!(follower.followed().in_force, 2);
}

#[test]
fn a_bad_change_keeps_what_is_in_force() {
    let (files, said) = scripted(vec![Ok(Some(7)), Err("bad"), Err("bad")]);
    let mut follower = Follower::new(files);
    follower.check_now();
    follower.check_now();
    follower.check_now();
    assert_eq!(follower.followed().in_force, 7);
    assert_eq!(*said.lock().unwrap(), ["changed to 7", "unusable: bad"]);
}

/// The schedule, on a paused clock: each period a check, and nothing after shutdown.
#[tokio::test(start_paused = true)]
async fn the_follower_checks_every_period_until_shutdown() {
    let (files, said) = scripted(vec![Ok(Some(1)), Err("bad"), Err("bad"), Ok(Some(2))]);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(Follower::new(files).run(Duration::from_secs(10), shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
    while said.lock().unwrap().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", said.lock().unwrap());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    shutdown.cancel();
    running.await.unwrap();
    assert_eq!(*said.lock().unwrap(), ["changed to 1", "unusable: bad", "changed to 2"]);
}
