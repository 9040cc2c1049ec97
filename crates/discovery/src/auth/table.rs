//! The tokens in force, each with its client: a map from a token's SHA-256 digest to the name of
//! the client it belongs to, replaced whole when the token files change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock};

use sha2::{Digest as _, Sha256};

use super::name::ClientName;
use super::token_file::MAX_TOKEN_BYTES;

type Digest = [u8; 32];

fn digest(token: &[u8]) -> Digest {
    Sha256::digest(token).into()
}

/// Every token in force, by digest.
///
/// NB: a request's token is hashed and the digest looked up, so finding its client is one hash
/// and one map probe however many clients and tokens there are, and the comparisons the map
/// makes see digests only: how long they take says nothing about how much of a token a guess
/// got right.
#[derive(Default, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    by_digest: HashMap<Digest, ClientName>,
    /// Whether a source gave some token, served or refused (then the manager makes none).
    configured: bool,
}

/// Clients that hold one same token, at least two, in name order.
pub(crate) type Sharing = Vec<ClientName>;

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Table({} tokens, {} clients)", self.tokens(), self.clients())
    }
}

impl Table {
    /// The table of `clients`' tokens, in which a token that two or more clients hold is served
    /// to none of them; and each group of clients that shared a token (once per group, however
    /// many tokens it shares).
    pub(crate) fn build(clients: &BTreeMap<ClientName, Vec<String>>) -> (Self, BTreeSet<Sharing>) {
        let mut holders: HashMap<Digest, Sharing> = HashMap::new();
        // In name order, so each group of holders comes out sorted.
        for (name, tokens) in clients {
            for token in tokens {
                let names = holders.entry(digest(token.as_bytes())).or_default();
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        let mut shared = BTreeSet::new();
        let mut by_digest = HashMap::with_capacity(holders.len());
        for (d, names) in holders {
            match <[ClientName; 1]>::try_from(names) {
                Ok([only]) => {
                    by_digest.insert(d, only);
                }
                Err(names) => {
                    shared.insert(names);
                }
            }
        }
        let configured = clients.values().any(|t| !t.is_empty());
        (Self { by_digest, configured }, shared)
    }

    /// The table of the default client's `tokens` alone.
    pub(crate) fn of_default(tokens: Vec<String>) -> Self {
        Self::build(&BTreeMap::from([(ClientName::default(), tokens)])).0
    }

    fn client(&self, given: &[u8]) -> Option<ClientName> {
        self.by_digest.get(&digest(given)).cloned()
    }

    pub(crate) fn tokens(&self) -> usize {
        self.by_digest.len()
    }

    pub(crate) fn clients(&self) -> usize {
        self.by_digest.values().collect::<BTreeSet<_>>().len()
    }

    fn by_client(&self) -> BTreeMap<&ClientName, BTreeSet<&Digest>> {
        let mut clients: BTreeMap<_, BTreeSet<_>> = BTreeMap::new();
        for (d, name) in &self.by_digest {
            clients.entry(name).or_default().insert(d);
        }
        clients
    }

    /// The clients whose tokens differ between `before` and this table (added, changed or
    /// gone), in name order: what a reload's log line names.
    pub(crate) fn changed_since(&self, before: &Self) -> Vec<ClientName> {
        let (now, then) = (self.by_client(), before.by_client());
        let names: BTreeSet<&ClientName> = now.keys().chain(then.keys()).copied().collect();
        names
            .into_iter()
            .filter(|name| now.get(name) != then.get(name))
            .cloned()
            .collect()
    }
}

/// The tokens in force, each with its client, replaced whole when their sources change. An
/// empty set refuses everything. Its `Debug` shows counts only.
#[derive(Default)]
pub struct TokenSet {
    table: RwLock<Arc<Table>>,
}

impl fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.current();
        write!(f, "TokenSet({} tokens, {} clients)", table.tokens(), table.clients())
    }
}

impl TokenSet {
    /// A set holding `tokens`, all of them the client `default`'s.
    pub fn new(tokens: Vec<String>) -> Self {
        let set = Self::default();
        set.put(Arc::new(Table::of_default(tokens)));
        set
    }

    /// A set holding each client's tokens; a token two clients hold is refused for both.
    pub fn of_clients(clients: &BTreeMap<ClientName, Vec<String>>) -> Self {
        let set = Self::default();
        set.put(Arc::new(Table::build(clients).0));
        set
    }

    /// The client whose token `given` is, if any.
    pub fn client(&self, given: &[u8]) -> Option<ClientName> {
        // No token in force is longer, and a token's length is no secret: spare the hash.
        if given.len() > MAX_TOKEN_BYTES {
            return None;
        }
        self.table.read().unwrap_or_else(|p| p.into_inner()).client(given)
    }

    /// How many tokens are in force, all clients together.
    pub fn len(&self) -> usize {
        self.current().tokens()
    }

    /// Whether no token is in force (every request is refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many clients have a token in force.
    pub fn clients(&self) -> usize {
        self.current().clients()
    }

    /// Whether some source gave a token, even one refused because two clients hold it: then
    /// the manager makes no token of its own.
    pub fn is_configured(&self) -> bool {
        self.current().configured
    }

    /// Puts `tokens` in force for the client `default`, unless a source gave a token meanwhile
    /// (checked and replaced under one lock, so what another task just put in force stays).
    pub fn replace_if_unconfigured(&self, tokens: Vec<String>) {
        let mut current = self.table.write().unwrap_or_else(|p| p.into_inner());
        if !current.configured {
            *current = Arc::new(Table::of_default(tokens));
        }
    }

    pub(crate) fn current(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn put(&self, table: Arc<Table>) {
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = table;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> ClientName {
        ClientName::parse(n).unwrap()
    }

    fn clients(of: &[(&str, &[&str])]) -> BTreeMap<ClientName, Vec<String>> {
        of.iter()
            .map(|(n, tokens)| (name(n), tokens.iter().map(|t| (*t).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn tokens_compare_whole() {
        let set = TokenSet::new(vec!["secret".into()]);
        assert!(set.client(b"secret").is_some());
        assert!(set.client(b"secreT").is_none());
        assert!(set.client(b"secret2").is_none());
        assert!(set.client(b"secre").is_none());
        assert!(set.client(b"").is_none());
        assert!(set.client(&vec![b'x'; MAX_TOKEN_BYTES + 1]).is_none());
    }

    #[test]
    fn a_token_names_the_client_that_holds_it() {
        let (table, shared) = Table::build(&clients(&[
            ("default", &["d1"]),
            ("team-a", &["a1", "a2"]),
            ("team-b", &["b1"]),
        ]));
        assert!(shared.is_empty());
        assert_eq!(table.client(b"d1"), Some(ClientName::default()));
        assert_eq!(table.client(b"a2"), Some(name("team-a")));
        assert_eq!(table.client(b"b1"), Some(name("team-b")));
        assert_eq!(table.client(b"a1b1"), None);
        assert_eq!((table.tokens(), table.clients()), (4, 3));
    }

    #[test]
    fn a_token_two_clients_hold_is_refused_for_both_and_the_pair_is_named() {
        let (table, shared) = Table::build(&clients(&[
            ("team-a", &["a1", "both", "all"]),
            ("team-b", &["both", "b1", "all", "also-both"]),
            ("team-c", &["all", "c1"]),
            ("default", &["also-both"]),
        ]));
        for refused in ["both", "all", "also-both"] {
            assert_eq!(table.client(refused.as_bytes()), None, "{refused}");
        }
        for (token, client) in [("a1", "team-a"), ("b1", "team-b"), ("c1", "team-c")] {
            assert_eq!(table.client(token.as_bytes()), Some(name(client)));
        }
        let groups: Vec<Vec<&str>> = shared
            .iter()
            .map(|g| g.iter().map(ClientName::as_str).collect())
            .collect();
        assert_eq!(
            groups,
            vec![
                vec!["default", "team-b"],
                vec!["team-a", "team-b"],
                vec!["team-a", "team-b", "team-c"],
            ]
        );
        assert!(table.configured, "refused tokens were still configured");
    }

    #[test]
    fn a_token_repeated_within_one_client_is_no_duplicate() {
        let (table, shared) = Table::build(&clients(&[("default", &["t", "t"])]));
        assert!(shared.is_empty());
        assert_eq!(table.client(b"t"), Some(ClientName::default()));
    }

    #[test]
    fn a_reload_names_the_clients_it_changed() {
        let before = Table::build(&clients(&[("team-a", &["a1"]), ("team-b", &["b1"]), ("gone", &["g"])])).0;
        let after = Table::build(&clients(&[("team-a", &["a1"]), ("team-b", &["b2"]), ("new", &["n"])])).0;
        let changed: Vec<String> = after.changed_since(&before).iter().map(ToString::to_string).collect();
        assert_eq!(changed, ["gone", "new", "team-b"]);
        assert!(after.changed_since(&after).is_empty());
    }

    #[test]
    fn the_made_token_stays_out_when_a_source_gave_one() {
        let set = TokenSet::default();
        assert!(!set.is_configured());
        set.replace_if_unconfigured(vec!["made".into()]);
        assert_eq!(set.client(b"made"), Some(ClientName::default()));
        set.put(Arc::new(
            Table::build(&clients(&[("team-a", &["x"]), ("team-b", &["x"])])).0,
        ));
        assert!(set.is_empty() && set.is_configured());
        set.replace_if_unconfigured(vec!["made".into()]);
        assert!(set.is_empty(), "a shared token refused is still a token configured");
    }
}
