//! The discovery API's admission and client scopes as the flags ask for them: the default
//! budget (`--discovery-client-rate`, `--discovery-client-burst`,
//! `--discovery-client-concurrency`), the requests served at once (`--discovery-max-in-flight`),
//! and the per-client budgets and scopes of `--discovery-clients-config`, followed while the
//! manager runs. A file that cannot be used stops the start; later, it is logged once and the
//! budgets and scopes in force stay.

use egress_discovery::{Admission, AdmissionMetrics, Budget, Budgets, Scopes};

use crate::flags::Options;
use crate::followed::{Followed, Following, Unusable, read_flag_file};
use egress_runtime::Fatal;

const FLAG: &str = "--discovery-clients-config";

/// What the API takes from the flags and the clients config file, and the follower of that file
/// (`None` without one).
pub(crate) struct Clients {
    pub(crate) admission: Admission,
    pub(crate) scopes: Scopes,
    pub(crate) following: Option<Following<ClientsConfig>>,
}

/// The admission and scopes the flags ask for.
pub(crate) fn clients(options: &Options, metrics: AdmissionMetrics) -> Result<Clients, Fatal> {
    let (default, at_once) = budget(options);
    let admission = Admission::new(Budgets::uniform(default), at_once, metrics);
    let scopes = Scopes::default();
    if options.discovery_clients_config.is_empty() {
        return Ok(Clients {
            admission,
            scopes,
            following: None,
        });
    }
    let mut file = ClientsConfig {
        path: options.discovery_clients_config.clone(),
        default,
        admission: admission.clone(),
        scopes: scopes.clone(),
        applied: None,
    };
    file.check()
        .map_err(|problem| problem.fatal("The discovery clients config cannot be used"))?;
    tracing::info!(
        path = %file.path,
        clients = admission.budgets().clients.len(),
        scoped = scopes.table().len(),
        "Discovery clients config read"
    );
    Ok(Clients {
        admission,
        scopes,
        following: Some(Following::new(file)),
    })
}

/// The default budget and the requests served at once the flags ask for: a concurrency or a
/// count at once of 0 is the lease store's default.
fn budget(options: &Options) -> (Budget, usize) {
    let (store_budget, store_at_once) = egress_discovery::admission::defaults(options.lease_store != "memory");
    let mut budget = options.discovery_budget;
    if budget.concurrency == 0 {
        budget.concurrency = store_budget.concurrency;
    }
    let at_once = match options.discovery_max_in_flight {
        0 => store_at_once,
        n => n,
    };
    (budget, at_once)
}

/// The clients config file, and the admission and scopes its budgets and scopes go to.
pub(crate) struct ClientsConfig {
    path: String,
    default: Budget,
    admission: Admission,
    scopes: Scopes,
    /// The text last put in force.
    applied: Option<Vec<u8>>,
}

impl Followed for ClientsConfig {
    const CHANGED: &'static str = "Discovery clients config changed; the new budgets and scopes are in force";
    const UNUSABLE: &'static str = "Discovery clients config cannot be used; the budgets and scopes in force stay";

    fn check(&mut self) -> Result<bool, Unusable> {
        let unusable = |why: String| Unusable {
            flag: FLAG,
            path: self.path.clone(),
            why,
        };
        let max = egress_discovery::MAX_CLIENTS_CONFIG_BYTES as u64;
        let text = read_flag_file(&self.path, max, "which no clients config is").map_err(unusable)?;
        if self.applied.as_deref() == Some(&text) {
            return Ok(false);
        }
        let readable = String::from_utf8(text.clone()).map_err(|_| unusable("not UTF-8 text".to_owned()))?;
        let parsed = egress_discovery::parse_clients_config(&readable, self.default).map_err(unusable)?;
        self.admission.set_budgets(parsed.budgets);
        self.scopes.set(parsed.scopes);
        self.applied = Some(text);
        Ok(true)
    }

    fn files(&self) -> String {
        self.path.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follower(dir: &std::path::Path) -> ClientsConfig {
        let default = egress_discovery::admission::DEFAULT_BUDGET;
        ClientsConfig {
            path: dir.join("clients.yaml").display().to_string(),
            default,
            admission: Admission::new(Budgets::uniform(default), 16, AdmissionMetrics::default()),
            scopes: Scopes::default(),
            applied: None,
        }
    }

    #[test]
    fn concurrency_and_requests_at_once_default_by_store_unless_given() {
        let mut o = Options::default();
        assert_eq!(budget(&o).1, 4);
        assert_eq!(budget(&o).0.concurrency, 4);
        o.lease_store = "redis://127.0.0.1:6379".into();
        assert_eq!((budget(&o).0.concurrency, budget(&o).1), (64, 64));
        o.discovery_budget.concurrency = 3;
        o.discovery_max_in_flight = 5;
        assert_eq!((budget(&o).0.concurrency, budget(&o).1), (3, 5));
    }

    #[test]
    fn a_good_file_is_put_in_force_and_a_bad_one_keeps_the_last_good_one() {
        let dir = egress_testkit::ScratchDir::new("clients-config");
        let mut file = follower(dir.path());
        let write = |text: &str| std::fs::write(dir.path().join("clients.yaml"), text).unwrap();
        write("clients:\n  team-a:\n    requestsPerSecond: 10\n    scope: {pools: [eu]}\n");
        assert_eq!(file.check(), Ok(true));
        assert_eq!(file.admission.budgets().of("team-a").requests_per_second, 10);
        let eu_only = file.scopes.of("team-a").expect("team-a is scoped");
        assert!(eu_only.allows_pool("crawlers/eu") && !eu_only.allows_pool("crawlers/us"));
        assert_eq!(file.check(), Ok(false), "unchanged");
        write("clients:\n  team-a:\n    rate: 10\n");
        let problem = file.check().unwrap_err();
        assert_eq!(problem.flag, "--discovery-clients-config");
        assert!(problem.why.contains("rate"), "{}", problem.why);
        assert_eq!(file.admission.budgets().of("team-a").requests_per_second, 10, "kept");
        write("clients:\n  team-a:\n    requestsPerSecond: 20\n    scope: {pools: []}\n");
        let problem = file.check().unwrap_err();
        assert!(
            problem.why.contains("client \"team-a\": scope.pools is empty"),
            "{}",
            problem.why
        );
        assert_eq!(file.scopes.of("team-a"), Some(eu_only.clone()), "the scope is kept");
        assert_eq!(
            file.admission.budgets().of("team-a").requests_per_second,
            10,
            "and the budget"
        );
        std::fs::remove_file(dir.path().join("clients.yaml")).unwrap();
        assert!(file.check().is_err(), "a missing file keeps the budgets too");
        assert_eq!(file.admission.budgets().of("team-a").requests_per_second, 10);
        assert_eq!(file.scopes.of("team-a"), Some(eu_only));
        write("clients:\n  team-a:\n    scope: {pools: [us]}\n");
        assert_eq!(file.check(), Ok(true));
        assert!(file.scopes.of("team-a").is_some_and(|s| s.allows_pool("crawlers/us")));
        write("clients:\n  team-a: {}\n");
        assert_eq!(file.check(), Ok(true));
        assert_eq!(file.scopes.of("team-a"), None, "a scope taken out: every proxy");
    }
}
