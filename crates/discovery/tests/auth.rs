//! Token rotation through a Secret volume laid out as the kubelet lays it out: the key's file is
//! a symlink through `..data`, itself a symlink to a timestamped directory that the kubelet
//! swaps in whole (a rename over `..data`) when the Secret changes. The API follows it without a
//! restart, through the same file-following task the operator runs. The same volume holds the
//! named clients, one key each.

mod common;
use egress_testkit::secret_volume;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{info, serve_on_loopback};
use egress_discovery::{Auth, ClientFiles, ClientName, DiscoveryApi, FileTokens, TokenSet, read_token_file};
use egress_lease::{MemoryStore, SystemClock};
use secret_volume::Volume;
use tokio_util::sync::CancellationToken;

/// A bound on waiting for the follower to see a change; a liveness bound, not a speed check.
const LIVENESS: Duration = Duration::from_secs(20);

async fn status(url: &str, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{url}/v1/proxies"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Waits (bounded) until `token` gets `want` from the API.
async fn until_status(url: &str, token: &str, want: u16) {
    let waited = tokio::time::timeout(LIVENESS, async {
        while status(url, token).await != want {
            // NB: the follower reads the file on its own schedule; poll its effect.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{token} never got {want}");
}

async fn serve(set: Arc<TokenSet>) -> (String, tokio_util::sync::DropGuard) {
    serve_on_loopback(DiscoveryApi {
        directory: Arc::new(common::Fixed::new(vec![info("ns/a", true, 1, 1, &[])])),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: Auth::Tokens(set),
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    })
    .await
}

#[tokio::test]
async fn a_rotated_secret_volume_reaches_the_api_without_a_restart() {
    let mut volume = Volume::new("rotate", "old-token\n");
    let path = volume.token_file();
    let set = Arc::new(TokenSet::default());
    let mut files = ClientFiles::default().token_file(path);
    files.reload(&set);
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    tokio::spawn(files.follow(set.clone(), Duration::from_millis(20), shutdown.clone()));
    let (url, _server) = serve(set.clone()).await;
    assert_eq!(status(&url, "old-token").await, 200);
    assert_eq!(status(&url, "new-token").await, 401);

    // The overlap: both tokens for a while.
    volume.update("new-token\nold-token\n");
    until_status(&url, "new-token", 200).await;
    assert_eq!(status(&url, "old-token").await, 200);
    // The old token goes.
    volume.update("new-token\n");
    until_status(&url, "old-token", 401).await;
    assert_eq!(status(&url, "new-token").await, 200);

    // The follower goes on past an empty and an unusable file (that they leave the tokens in
    // force is a unit test of the follower: a pass that changes nothing cannot be waited for).
    volume.update("\n");
    volume.update("two tokens on one line\n");
    volume.update("newest-token\n");
    until_status(&url, "newest-token", 200).await;
    assert_eq!(status(&url, "new-token").await, 401);
}

#[tokio::test]
async fn an_empty_set_refuses_everything_and_a_missing_file_reads_as_missing() {
    let set = Arc::new(TokenSet::default());
    let (url, _server) = serve(set.clone()).await;
    assert_eq!(status(&url, "").await, 401);
    assert_eq!(status(&url, "anything").await, 401);
    assert_eq!(
        read_token_file(Path::new("/nonexistent/egress/token")),
        FileTokens::Missing
    );
}

/// A pipe or a directory where the token file should be is refused at once: nothing waits for
/// a writer (nextest's timeout fails a read that hangs).
#[tokio::test]
async fn a_token_path_that_is_no_regular_file_is_unusable_at_once() {
    let scratch = egress_testkit::ScratchDir::new("token-fifo");
    let (dir, pipe) = (scratch.path().to_owned(), scratch.path().join("token"));
    egress_testkit::make_fifo(&pipe);
    for path in [&pipe, &dir] {
        let read = read_token_file(path);
        assert_eq!(
            read,
            FileTokens::Unusable(format!("{} is not a regular file", path.display()))
        );
    }
}

fn client_of(set: &TokenSet, token: &str) -> Option<String> {
    set.client(token.as_bytes()).map(|c| c.to_string())
}

#[tokio::test]
async fn clients_of_a_secret_volume_are_added_changed_and_a_shared_token_is_refused_for_both() {
    let mut volume = Volume::with_keys(
        "clients",
        &[("token", "default-token\n"), ("team-a", "a1\n"), ("Team_C", "c1\n")],
    );
    let token_file = volume.token_file();
    let dir = token_file.parent().unwrap().to_owned();
    let set = Arc::new(TokenSet::default());
    let mut files = ClientFiles::default().token_file(&token_file).token_dir(&dir);
    files.reload(&set);
    // The kubelet's `..data` and timestamped entries, and a key that is no DNS label, are no
    // clients; the token file is the default client's, not a client `token`.
    assert_eq!((set.clients(), set.len()), (2, 2), "{set:?}");
    assert_eq!(client_of(&set, "default-token").as_deref(), Some(ClientName::DEFAULT));
    assert_eq!(client_of(&set, "a1").as_deref(), Some("team-a"));
    assert_eq!(client_of(&set, "c1"), None);

    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    tokio::spawn(files.follow(set.clone(), Duration::from_millis(20), shutdown.clone()));
    let (url, _server) = serve(set.clone()).await;
    assert_eq!(status(&url, "a1").await, 200);
    assert_eq!(status(&url, "c1").await, 401);

    // A new key is a new client.
    volume.update_keys(&[("team-b", "b1\nshared-token\n")]);
    until_status(&url, "b1", 200).await;
    assert_eq!(status(&url, "shared-token").await, 200, "one client holds it yet");
    assert_eq!(client_of(&set, "b1").as_deref(), Some("team-b"));

    // A changed key replaces that client's tokens.
    volume.update_keys(&[("team-a", "a2\n")]);
    until_status(&url, "a1", 401).await;
    assert_eq!(status(&url, "a2").await, 200);
    assert_eq!(client_of(&set, "a2").as_deref(), Some("team-a"));

    // A token in two clients' keys is refused for both; their other tokens stay.
    volume.update_keys(&[("team-a", "a2\nshared-token\n")]);
    until_status(&url, "shared-token", 401).await;
    for token in ["a2", "b1", "default-token"] {
        assert_eq!(status(&url, token).await, 200, "{token}");
    }
    assert_eq!(set.clients(), 3);
}

#[tokio::test]
async fn a_token_dir_that_does_not_exist_holds_no_client() {
    let set = TokenSet::default();
    let mut files = ClientFiles::default()
        .token_dir("/nonexistent/egress/discovery")
        .fixed_tokens(vec!["env-token".into()]);
    assert!(files.reload(&set).is_some());
    assert_eq!((set.clients(), set.len()), (1, 1));
    assert_eq!(client_of(&set, "env-token").as_deref(), Some(ClientName::DEFAULT));
}
