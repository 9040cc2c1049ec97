//! The clients' token files, followed while the API serves: `--discovery-token-file` and the
//! token dir's files are read again every few seconds by the one file follower
//! ([`egress_files::Follower`]), and what they give is put in force when it changed. Each file
//! keeps what it last gave ([`egress_files::Kept`]). Problems are logged once each, naming files
//! and clients, never a token.
//!
//! ```text
//!  --discovery-token-file ─┐
//!  <dir>/default ──────────┼─► client `default` ─┐
//!  DISCOVERY_TOKEN ────────┘                      ├─► a token two clients hold is refused ─► TokenSet
//!  <dir>/<name> (≤ 63) ───────► client <name> ────┘
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_files::{Follower, Kept};
use tokio_util::sync::CancellationToken;

use super::name::{ClientName, Entry, entry};
use super::table::{Sharing, Table, TokenSet};
use super::token_file::{FileTokens, read_token_file};

/// The most clients served, the default client included.
pub const MAX_CLIENTS: usize = 64;

/// How long a token file may be missing or empty before its tokens are revoked, unless told
/// otherwise (`--token-revoke-grace`): the kubelet updates a Secret volume by swapping files, so
/// a short gap is not a removal.
pub const DEFAULT_REVOKE_GRACE: Duration = Duration::from_secs(30);

/// One file as followed: the tokens it last gave, which stay in force while it is unusable and,
/// for the grace, while it is missing or empty; and the problem last logged about it.
#[derive(Default)]
struct Followed {
    kept: Kept<Vec<String>, String>,
    /// Since when the file has been missing or empty while its tokens were in force.
    gone_since: Option<Instant>,
}

/// What a pass over one file has to say.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// A new problem: the file cannot be used (its tokens stay).
    Unusable(String),
    /// The file has just gone missing or empty: its tokens go once the grace has passed.
    Going,
    /// The grace has passed: its tokens are revoked.
    Revoked,
}

impl Followed {
    /// The tokens kept (none before the file gave any).
    fn kept(&self) -> &[String] {
        self.kept.value().map_or(&[], Vec::as_slice)
    }

    /// Takes what the file gave at `now`: tokens replace those kept; a problem keeps them; a
    /// missing or empty file keeps them for `grace`, then revokes them.
    fn take(&mut self, read: FileTokens, now: Instant, grace: Duration) -> Option<Event> {
        let tokens = match read {
            FileTokens::Tokens(tokens) if !tokens.is_empty() => tokens,
            FileTokens::Unusable(why) => {
                self.gone_since = None;
                return self.kept.take(Err(why)).cloned().map(Event::Unusable);
            }
            FileTokens::Tokens(_) | FileTokens::Missing => {
                self.kept.take(Ok(None));
                if self.kept().is_empty() {
                    return None;
                }
                let since = *self.gone_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= grace {
                    *self = Self::default();
                    return Some(Event::Revoked);
                }
                return (since == now).then_some(Event::Going);
            }
        };
        self.gone_since = None;
        self.kept.take(Ok(Some(tokens)));
        None
    }
}

/// The default client's tokens: those of each of its files in turn, then the fixed ones
/// (`DISCOVERY_TOKEN`), each once.
fn default_tokens(files: &[&[String]], fixed: &[String]) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for token in files.iter().copied().flatten().chain(fixed) {
        if !all.contains(token) {
            all.push(token.clone());
        }
    }
    all
}

/// The named clients served, in name order, and those past the cap ([`MAX_CLIENTS`], of which
/// the default client takes one).
fn within_cap(names: BTreeSet<ClientName>) -> (Vec<ClientName>, Vec<ClientName>) {
    let mut served: Vec<ClientName> = names.into_iter().collect();
    let skipped = served.split_off(served.len().min(MAX_CLIENTS - 1));
    (served, skipped)
}

/// What the token dir's names stand for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Listing {
    /// A file `default` is there (its tokens are the default client's).
    default: bool,
    clients: BTreeSet<ClientName>,
    /// Names no client may have, skipped with a warning.
    not_labels: BTreeSet<OsString>,
}

/// Sorts the token dir's entry names; `own` is the name of `--discovery-token-file` when that
/// file lies in the dir: it is the default client's, not a client of its own.
fn sort_entries(names: impl IntoIterator<Item = OsString>, own: Option<&OsStr>) -> Listing {
    let mut listing = Listing::default();
    for name in names {
        if own == Some(name.as_os_str()) {
            continue;
        }
        match entry(&name) {
            Entry::Hidden => {}
            Entry::Client(client) if client.as_str() == ClientName::DEFAULT => listing.default = true,
            Entry::Client(client) => {
                listing.clients.insert(client);
            }
            Entry::NotALabel => {
                listing.not_labels.insert(name);
            }
        }
    }
    listing
}

/// What was logged already, so each problem is logged once (until it changes).
#[derive(Default)]
struct Logged {
    dir_problem: Option<String>,
    not_labels: BTreeSet<OsString>,
    over_cap: Vec<ClientName>,
    shared: BTreeSet<Sharing>,
}

fn joined(names: &[ClientName]) -> String {
    names.iter().map(ClientName::as_str).collect::<Vec<_>>().join(", ")
}

/// Where the clients' tokens come from, and what each file last gave. [`reload`](Self::reload)
/// reads them all once; [`follow`](Self::follow) does it on a schedule. Its `Debug` shows paths
/// and names, never a token.
pub struct ClientFiles {
    token_file: Option<PathBuf>,
    dir: Option<PathBuf>,
    fixed: Vec<String>,
    revoke_grace: Duration,
    from_token_file: Followed,
    from_default_file: Followed,
    named: BTreeMap<ClientName, Followed>,
    logged: Logged,
    /// What this follower last put in force: a pass that gives the same changes nothing (and
    /// leaves a token the manager made in force while no file gives one).
    last: Arc<Table>,
}

impl Default for ClientFiles {
    fn default() -> Self {
        Self {
            token_file: None,
            dir: None,
            fixed: Vec::new(),
            revoke_grace: DEFAULT_REVOKE_GRACE,
            from_token_file: Followed::default(),
            from_default_file: Followed::default(),
            named: BTreeMap::new(),
            logged: Logged::default(),
            last: Arc::default(),
        }
    }
}

impl fmt::Debug for ClientFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientFiles")
            .field("token_file", &self.token_file)
            .field("dir", &self.dir)
            .field("fixed", &self.fixed.len())
            .field("named", &self.named.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ClientFiles {
    /// The default client's own file (`--discovery-token-file`).
    #[must_use]
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// The dir whose files are clients (`--discovery-token-dir`). One that does not exist
    /// holds no client.
    #[must_use]
    pub fn token_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.dir = Some(path.into());
        self
    }

    /// How long a file may be missing or empty before its tokens are revoked
    /// ([`DEFAULT_REVOKE_GRACE`] unless told); 0 revokes at the first pass that finds it so.
    #[must_use]
    pub fn revoke_grace(mut self, grace: Duration) -> Self {
        self.revoke_grace = grace;
        self
    }

    /// Tokens of the default client that never change (`DISCOVERY_TOKEN`).
    #[must_use]
    pub fn fixed_tokens(mut self, tokens: Vec<String>) -> Self {
        self.fixed = tokens;
        self
    }

    /// Reads every file once and puts what they give in `set` when it differs from what this
    /// follower put there last. Answers the clients whose tokens changed when it did (possibly
    /// none: every token given was refused). Blocking: it lists the token dir and reads files.
    pub fn reload(&mut self, set: &TokenSet) -> Option<Vec<ClientName>> {
        self.read_files();
        let (table, shared) = Table::build(&self.clients());
        self.log_shared(shared);
        if table == *self.last {
            return None;
        }
        let table = Arc::new(table);
        let changed = table.changed_since(&self.last);
        set.put(table.clone());
        self.last = table;
        Some(changed)
    }

    /// Reads the token file, then the token dir's files of the clients served: a file the dir
    /// no longer lists is missing. When the dir cannot be listed, its clients stay as they are.
    fn read_files(&mut self) {
        let (now, grace) = (Instant::now(), self.revoke_grace);
        let default = ClientName::default();
        if let Some(path) = &self.token_file {
            let event = self.from_token_file.take(read_token_file(path), now, grace);
            say(event, &default, path, grace);
        }
        let Some(listing) = self.list_dir() else { return };
        let served = self.serve_within_cap(&listing.clients);
        let Some(dir) = &self.dir else { return };
        let read = |listed: bool, path: &Path| {
            if listed {
                read_token_file(path)
            } else {
                FileTokens::Missing
            }
        };
        let path = dir.join(ClientName::DEFAULT);
        let event = self.from_default_file.take(read(listing.default, &path), now, grace);
        say(event, &default, &path, grace);
        for name in served {
            let path = dir.join(name.as_str());
            let event = self.named.entry(name.clone()).or_default().take(
                read(listing.clients.contains(&name), &path),
                now,
                grace,
            );
            say(event, &name, &path, grace);
        }
    }

    /// Reloads every `every` until `shutdown` (with the one follower, each pass on a thread that
    /// may block), logging each change by count and client name: a rotation or a new client
    /// reaches the API without a restart.
    pub async fn follow(self, set: Arc<TokenSet>, every: Duration, shutdown: CancellationToken) {
        Follower::new(Following { files: self, set }).run(every, shutdown).await;
    }

    /// The name of `--discovery-token-file` when it lies in the token dir. The dirs are
    /// compared resolved when they exist, so `./secret/token` lies in `secret`: were it taken
    /// for a client of its own, the default client's tokens would be refused as shared.
    fn own_name(&self) -> Option<OsString> {
        let (file, dir) = (self.token_file.as_deref()?, self.dir.as_deref()?);
        let parent = file.parent()?;
        let resolved = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
        let same = parent == dir || resolved(parent) == resolved(dir);
        same.then(|| file.file_name().map(OsStr::to_owned)).flatten()
    }

    /// The token dir's entries, sorted out; none when there is no dir or it is missing, and
    /// `None` when it cannot be listed (then the clients read before stay).
    fn list_dir(&mut self) -> Option<Listing> {
        let Some(dir) = self.dir.clone() else {
            return Some(Listing::default());
        };
        let names = match read_names(&dir) {
            Ok(names) => names,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                let why = format!("listing {}: {}", dir.display(), e.kind());
                if self.logged.dir_problem.as_ref() != Some(&why) {
                    tracing::warn!(target: "discovery", problem = %why, "the discovery token dir cannot be listed; the clients in force stay");
                    self.logged.dir_problem = Some(why);
                }
                return None;
            }
        };
        self.logged.dir_problem = None;
        let listing = sort_entries(names, self.own_name().as_deref());
        for name in listing.not_labels.difference(&self.logged.not_labels) {
            tracing::warn!(
                target: "discovery",
                file = %dir.join(name).display(),
                "a file in the discovery token dir is not named as a client (a DNS label: at most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit); skipped"
            );
        }
        self.logged.not_labels.clone_from(&listing.not_labels);
        Some(listing)
    }

    /// The named clients to serve: those listed now and those served before whose file went
    /// away (their tokens stay), within the cap in name order. Forgets the others.
    fn serve_within_cap(&mut self, listed: &BTreeSet<ClientName>) -> Vec<ClientName> {
        let before = self.named.iter().filter(|(_, f)| !f.kept().is_empty()).map(|(n, _)| n);
        let (served, skipped) = within_cap(listed.iter().chain(before).cloned().collect());
        if skipped != self.logged.over_cap && !skipped.is_empty() {
            tracing::warn!(
                target: "discovery",
                skipped = %joined(&skipped),
                "more than {MAX_CLIENTS} discovery clients (the default one counts): the files of the last in name order are skipped"
            );
        }
        self.logged.over_cap = skipped;
        self.named.retain(|name, _| served.contains(name));
        served
    }

    /// Every client's tokens, before shared ones are refused.
    fn clients(&self) -> BTreeMap<ClientName, Vec<String>> {
        let default = default_tokens(
            &[self.from_token_file.kept(), self.from_default_file.kept()],
            &self.fixed,
        );
        let named = self.named.iter().map(|(name, f)| (name.clone(), f.kept().to_vec()));
        std::iter::once((ClientName::default(), default))
            .chain(named)
            .filter(|(_, tokens)| !tokens.is_empty())
            .collect()
    }

    fn log_shared(&mut self, shared: BTreeSet<Sharing>) {
        for group in shared.difference(&self.logged.shared) {
            tracing::warn!(
                target: "discovery",
                clients = %joined(group),
                "a discovery token is in more than one client's file: it is refused for each of them"
            );
        }
        self.logged.shared = shared;
    }
}

/// The client files as the one follower follows them. A pass never fails as a whole: each
/// file's problem is logged by the pass, naming its client, and that file's tokens stay.
struct Following {
    files: ClientFiles,
    set: Arc<TokenSet>,
}

impl egress_files::Followed for Following {
    type Change = Vec<ClientName>;
    type Problem = std::convert::Infallible;

    fn check(&mut self) -> Result<Option<Vec<ClientName>>, Self::Problem> {
        Ok(self.files.reload(&self.set))
    }

    fn changed(&self, changed: &Vec<ClientName>) {
        tracing::info!(
            target: "discovery",
            tokens = self.set.len(),
            clients = self.set.clients(),
            changed = %joined(changed),
            "discovery tokens reloaded"
        );
    }

    fn unusable(&self, problem: &Self::Problem) {
        match *problem {}
    }
}

/// Logs what a pass over `client`'s file `path` found, if anything.
fn say(event: Option<Event>, client: &ClientName, path: &Path, grace: Duration) {
    match event {
        None => {}
        Some(Event::Unusable(why)) => {
            tracing::warn!(target: "discovery", problem = %why, client = %client, "the discovery token file cannot be used; the tokens in force stay")
        }
        Some(Event::Going) => {
            tracing::info!(target: "discovery", client = %client, file = %path.display(), grace = ?grace, "a discovery token file is missing or empty: its tokens are revoked once the grace has passed, unless it comes back")
        }
        Some(Event::Revoked) => {
            tracing::warn!(target: "discovery", client = %client, file = %path.display(), "a discovery token file was removed or emptied: its tokens are revoked")
        }
    }
}

/// The names in `dir`.
fn read_names(dir: &Path) -> std::io::Result<Vec<OsString>> {
    std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> ClientName {
        ClientName::parse(n).unwrap()
    }

    fn tokens(of: &[&str]) -> Vec<String> {
        of.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn a_file_that_is_unusable_keeps_its_tokens() {
        let mut file = Followed::default();
        let (now, grace) = (Instant::now(), Duration::ZERO);
        let mut take = |read| file.take(read, now, grace);
        let bad = |why: &str| Some(Event::Unusable(why.into()));
        assert_eq!(take(FileTokens::Tokens(tokens(&["f1"]))), None);
        assert_eq!(take(FileTokens::Unusable("bad".into())), bad("bad"));
        assert_eq!(take(FileTokens::Unusable("bad".into())), None, "logged once");
        assert_eq!(take(FileTokens::Unusable("worse".into())), bad("worse"));
        assert_eq!(take(FileTokens::Tokens(tokens(&["f2"]))), None);
        assert_eq!(
            take(FileTokens::Unusable("bad".into())),
            bad("bad"),
            "a problem back is new again"
        );
        assert_eq!(file.kept(), tokens(&["f2"]));
    }

    #[test]
    fn a_file_missing_or_empty_past_the_grace_is_revoked_not_before() {
        let grace = Duration::from_secs(30);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut file = Followed::default();
        assert_eq!(file.take(FileTokens::Tokens(tokens(&["f1"])), at(0), grace), None);
        assert_eq!(file.take(FileTokens::Missing, at(1), grace), Some(Event::Going));
        assert_eq!(file.take(FileTokens::Tokens(Vec::new()), at(20), grace), None);
        assert_eq!(file.kept(), tokens(&["f1"]), "kept within the grace");
        // Back within the grace: the count starts again at the next gap.
        assert_eq!(file.take(FileTokens::Tokens(tokens(&["f1"])), at(25), grace), None);
        assert_eq!(file.take(FileTokens::Missing, at(40), grace), Some(Event::Going));
        assert_eq!(file.take(FileTokens::Missing, at(69), grace), None);
        assert_eq!(file.take(FileTokens::Missing, at(70), grace), Some(Event::Revoked));
        assert!(file.kept().is_empty());
        assert_eq!(file.take(FileTokens::Missing, at(80), grace), None, "said once");
        // A grace of 0 revokes at the first pass that finds the file gone.
        let mut file = Followed::default();
        file.take(FileTokens::Tokens(tokens(&["f1"])), at(0), Duration::ZERO);
        assert_eq!(
            file.take(FileTokens::Missing, at(0), Duration::ZERO),
            Some(Event::Revoked)
        );
    }

    #[test]
    fn the_default_client_has_its_files_tokens_first_then_the_fixed_ones_each_once() {
        let fixed = tokens(&["env-token"]);
        assert_eq!(
            default_tokens(&[&tokens(&["f1", "env-token"]), &[]], &fixed),
            tokens(&["f1", "env-token"])
        );
        assert_eq!(
            default_tokens(&[&tokens(&["f1"]), &tokens(&["d1", "f1"])], &fixed),
            tokens(&["f1", "d1", "env-token"])
        );
        assert_eq!(default_tokens(&[&[], &[]], &fixed), fixed);
        assert!(default_tokens(&[&[], &[]], &[]).is_empty());
    }

    #[test]
    fn at_most_64_clients_are_served_the_first_in_name_order() {
        let names: BTreeSet<ClientName> = (0..70).map(|i| name(&format!("c{i:02}"))).collect();
        let (served, skipped) = within_cap(names);
        assert_eq!(served.len(), MAX_CLIENTS - 1, "the default client counts");
        assert_eq!(served.first().map(ClientName::as_str), Some("c00"));
        assert_eq!(served.last().map(ClientName::as_str), Some("c62"));
        let skipped: Vec<&str> = skipped.iter().map(ClientName::as_str).collect();
        assert_eq!(skipped, ["c63", "c64", "c65", "c66", "c67", "c68", "c69"]);
        let (served, skipped) = within_cap([name("a")].into());
        assert_eq!((served.len(), skipped.len()), (1, 0));
    }

    #[test]
    fn the_token_dir_s_entries_are_sorted_out_by_name() {
        let names = [
            "..data",
            "..2026_12_01_00_00_01.1001",
            "token",
            "default",
            "team-a",
            "Team-B",
            "notes.txt",
        ]
        .map(OsString::from);
        let listing = sort_entries(names.clone(), Some(OsStr::new("token")));
        assert_eq!(
            listing,
            Listing {
                default: true,
                clients: [name("team-a")].into(),
                not_labels: [OsString::from("Team-B"), OsString::from("notes.txt")].into(),
            }
        );
        // A token file elsewhere: a file `token` in the dir is a client like any other.
        assert!(sort_entries(names, None).clients.contains(&name("token")));
    }

    #[test]
    fn the_token_file_is_the_default_client_s_only_when_it_lies_in_the_dir() {
        fn own(file: impl Into<PathBuf>, dir: impl Into<PathBuf>) -> Option<String> {
            let files = ClientFiles::default().token_file(file).token_dir(dir);
            files.own_name().map(|n| n.to_string_lossy().into_owned())
        }
        assert_eq!(own("/etc/d/token", "/etc/d").as_deref(), Some("token"));
        assert_eq!(own("/etc/d/token", "/etc/d/").as_deref(), Some("token"));
        assert_eq!(own("/etc/other/token", "/etc/d"), None);
        assert_eq!(own("/etc/d/sub/token", "/etc/d"), None);
        // The same dir written two ways, resolved.
        let here = std::env::current_dir().unwrap();
        assert_eq!(own("./token", &here).as_deref(), Some("token"));
        assert_eq!(own(here.join("token"), ".").as_deref(), Some("token"));
    }

    #[test]
    fn nothing_shows_a_token() {
        let mut files = ClientFiles::default()
            .token_file("/nonexistent/token")
            .fixed_tokens(tokens(&["sentinel-fixed-token"]));
        files.named.insert(
            name("team-a"),
            Followed {
                kept: Kept::holding(tokens(&["sentinel-team-token"])),
                gone_since: None,
            },
        );
        let (table, _) = Table::build(&files.clients());
        let shown = format!("{files:?} {table:?}");
        assert!(!shown.contains("sentinel"), "{shown}");
        assert!(shown.contains("team-a"), "{shown}");
        assert_eq!(table.tokens(), 2);
    }
}
