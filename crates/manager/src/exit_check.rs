//! The exit check's parts in the manager: the engine's setting (`--exit-check-url`,
//! `--exit-check-interval`), the GeoIP databases (read at start, then followed), the operator's
//! own exit (fetched directly at start and once per interval), and the findings the reconciler
//! judges.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use egress_controller::proxy::exit_findings::{EngineExits, ExitFindings, NoExitChecks, OwnExit};
use egress_geoip::{DatabaseFile, GeoIp, Kind};
use egress_health::{ConnectProber, ExitCheck, ProxyKey, Snapshot};
use egress_runtime::Fatal;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::flags::Options;

/// The budget of one direct fetch of the operator's own exit.
const OWN_EXIT_BUDGET: Duration = Duration::from_secs(5);
/// How often the GeoIP files are looked at again (a look is one `stat` each), as often as the
/// other followed files.
const GEOIP_POLL: Duration = crate::discovery_auth::FILE_POLL;

/// The engine's exit check; `None` without an echo URL.
pub(crate) fn engine_setting(options: &Options) -> Option<ExitCheck> {
    (!options.exit_check_url.is_empty()).then(|| ExitCheck {
        url: options.exit_check_url.clone(),
        interval: options.exit_check_interval,
    })
}

/// What the reconciler judges exits with (see [`findings`]), with the GeoIP databases read
/// now (a file that cannot be used stops the start) and followed from then on.
pub(crate) fn start(
    options: &Options,
    (snapshot, prober, events): (&Snapshot, &ConnectProber, &mpsc::Sender<ProxyKey>),
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<Arc<dyn ExitFindings>, Fatal> {
    let (geoip, files) = geoip(options)?;
    let files = files.into_iter().map(|file| Rejudged {
        file,
        snapshot: snapshot.clone(),
        events: events.clone(),
    });
    follow_geoip(files, tasks, shutdown);
    let parts = (snapshot.clone(), geoip, prober.clone());
    Ok(findings(options, parts, events.clone(), tasks, shutdown))
}

/// Reads the GeoIP databases the flags name and lets them go, when the process starts (on every
/// replica, before it runs anything): a file that cannot be used stops it there, rather than
/// at the election that makes it leader. The leader reads them again for use ([`start`]).
pub(crate) fn check_geoip(options: &Options) -> Result<(), Fatal> {
    geoip(options).map(drop)
}

/// The GeoIP databases the flags name, read now: a file that cannot be used stops the start.
fn geoip(options: &Options) -> Result<(GeoIp, Vec<DatabaseFile>), Fatal> {
    let geoip = GeoIp::default();
    let mut followed = Vec::new();
    for (kind, path) in [
        (Kind::Country, &options.geoip_country_file),
        (Kind::Asn, &options.geoip_asn_file),
    ] {
        if path.is_empty() {
            continue;
        }
        let mut file = DatabaseFile::new(geoip.clone(), kind, path.into());
        egress_files::Followed::check(&mut file).map_err(|e| Fatal::new("Failed to read a GeoIP database", e))?;
        followed.push(file);
    }
    Ok((geoip, followed))
}

/// Follows the GeoIP files read at start until `shutdown`.
fn follow_geoip(
    files: impl Iterator<Item = Rejudged>,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) {
    for file in files {
        tasks.spawn(egress_files::Follower::new(file).run(GEOIP_POLL, shutdown.clone()));
    }
}

/// A GeoIP file whose change has every Proxy with a known exit judged again: their country,
/// ASN and organisation come from the new data at once, not at their next changed exit.
struct Rejudged {
    file: DatabaseFile,
    snapshot: Snapshot,
    events: mpsc::Sender<ProxyKey>,
}

impl egress_files::Followed for Rejudged {
    type Change = std::path::PathBuf;
    type Problem = egress_geoip::GeoError;

    fn check(&mut self) -> Result<Option<Self::Change>, Self::Problem> {
        self.file.check()
    }

    fn changed(&self, path: &Self::Change) {
        self.file.changed(path);
        // On the follower's blocking thread: waiting for room in the queue is fine here.
        for key in self.snapshot.with_exit() {
            if self.events.blocking_send(key).is_err() {
                return;
            }
        }
    }

    fn unusable(&self, problem: &Self::Problem) {
        self.file.unusable(problem);
    }
}

/// What the reconciler judges exits with: nothing without an echo URL; else the engine's
/// snapshot, the GeoIP databases, and the operator's own exit, learned by a task started here
/// that tells the reconciler about the Proxies at its old and new address when it changes.
fn findings(
    options: &Options,
    parts: (Snapshot, GeoIp, ConnectProber),
    events: mpsc::Sender<ProxyKey>,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> Arc<dyn ExitFindings> {
    let Some(check) = engine_setting(options) else {
        return Arc::new(NoExitChecks);
    };
    let (snapshot, geoip, prober) = parts;
    let own = OwnExit::default();
    let learner = OwnExitLearner {
        prober,
        check,
        own: own.clone(),
        snapshot: snapshot.clone(),
        events,
    };
    tasks.spawn(learner.run(shutdown.clone()));
    Arc::new(EngineExits { snapshot, own, geoip })
}

/// Learns the operator's own exit, once at start and then once per interval.
struct OwnExitLearner {
    prober: ConnectProber,
    check: ExitCheck,
    own: OwnExit,
    snapshot: Snapshot,
    events: mpsc::Sender<ProxyKey>,
}

impl OwnExitLearner {
    async fn run(self, shutdown: CancellationToken) {
        let mut said: Option<Result<IpAddr, String>> = None;
        loop {
            let found = self.prober.own_exit(&self.check.url, OWN_EXIT_BUDGET).await;
            let now = found.map_err(|e| e.to_string());
            if said.as_ref() != Some(&now) {
                self.report(said.as_ref(), &now).await;
                said = Some(now.clone());
            }
            self.own.set(now.ok());
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.check.interval) => {}
            }
        }
    }

    /// Says what changed; a new address re-judges the Proxies at the old one and the new one.
    async fn report(&self, before: Option<&Result<IpAddr, String>>, now: &Result<IpAddr, String>) {
        match now {
            Ok(ip) => tracing::info!(address = %ip, "The operator's own exit address"),
            Err(why) => {
                tracing::warn!(reason = %why, "Could not learn the operator's own exit; the last one found stays");
                return;
            }
        }
        let old = before.and_then(|b| b.as_ref().ok()).copied();
        let new = now.as_ref().ok().copied();
        self.own.set(new);
        for ip in [old, new].into_iter().flatten() {
            for key in self.snapshot.at(ip) {
                if self.events.send(key).await.is_err() {
                    return;
                }
            }
        }
    }
}
