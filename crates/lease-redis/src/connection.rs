//! The connection under the store: to one Redis server, or to a Redis Cluster, plain or over
//! TLS, made again when it stops answering, and replaced when the TLS files change; the store
//! URL's own parameter (`wait`); the URL as logs may show it.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;

use crate::tls::{Tls, certificates};
use crate::{CALL_BUDGET, CLUSTER_SCHEME, TLS_CLUSTER_SCHEME};

/// The connection a store's calls use, which new settings replace (a client certificate
/// renewed, a CA rotated, a password changed): each call takes the one in use when it starts and
/// ends on it. No `Debug`: it holds the password.
pub(crate) struct Current {
    /// The URL without the store's own parameters: what a replacement connects to.
    url: String,
    /// The TLS settings and the password (when it is not in the URL) of the connection in use.
    settings: std::sync::Mutex<(Tls, Option<String>)>,
    in_use: std::sync::RwLock<Connection>,
}

impl Current {
    /// Connects lazily to `url` as `tls` says (see [`Connection::open`]), with `password` when
    /// given (the URL must then hold none).
    pub(crate) fn open(url: &str, tls: &Tls, password: Option<&str>) -> Result<Self, String> {
        let connection = Connection::open(&with_password(url, password)?, tls)?;
        Ok(Self {
            url: url.to_owned(),
            settings: std::sync::Mutex::new((tls.clone(), password.map(str::to_owned))),
            in_use: std::sync::RwLock::new(connection),
        })
    }

    /// The connection in use.
    pub(crate) fn get(&self) -> Connection {
        self.in_use
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether it is to a Redis Cluster.
    pub(crate) fn on_cluster(&self) -> bool {
        matches!(self.get(), Connection::Cluster(_))
    }

    /// Replaces the connection in use with one made with `tls`, or with `password`, the other
    /// setting as it was. Calls on their way end on the one they started on; the old
    /// connection closes when the last of them has. On an error the connection in use stays.
    pub(crate) fn replace(&self, tls: Option<&Tls>, password: Option<&str>) -> Result<(), String> {
        let mut settings = self.settings.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let tls = tls.cloned().unwrap_or_else(|| settings.0.clone());
        let password = password.map(str::to_owned).or_else(|| settings.1.clone());
        let renewed = Connection::open(&with_password(&self.url, password.as_deref())?, &tls)?;
        *self.in_use.write().unwrap_or_else(std::sync::PoisonError::into_inner) = renewed;
        *settings = (tls, password);
        Ok(())
    }
}

/// `url` with `password` as its credentials' password (percent-encoded; the user, if any,
/// kept): what a password given apart from the URL becomes. A URL that holds a password
/// already is refused: the password would be in two places.
pub(crate) fn with_password(url: &str, password: Option<&str>) -> Result<String, String> {
    let Some(password) = password else {
        return Ok(url.to_owned());
    };
    let (scheme, rest) = url.split_once("://").ok_or("not a URL")?;
    // The credentials end at the last '@' before the path (a password may hold '@' encoded).
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (user, hosts) = match rest[..authority_end].rsplit_once('@') {
        Some((credentials, _)) if credentials.contains(':') => {
            return Err("the URL holds a password already: give it in one place".to_owned());
        }
        Some((user, _)) => (user, &rest[user.len() + 1..]),
        None => ("", rest),
    };
    let encoded = percent_encoding::utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC);
    Ok(format!("{scheme}://{user}:{encoded}@{hosts}"))
}

/// A connection to one Redis server, or to a Redis Cluster (MOVED and ASK answers followed, the
/// slot map refreshed after a failover, by the client library).
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(Arc<ClusterHandle>),
}

/// The connection one call runs on, whole: a script and what follows it in a pipeline go on it
/// together.
#[derive(Clone)]
pub(crate) enum Live {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Live {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// A Redis Cluster connection that is made again when a call on it gets no answer in time or
/// finds it broken: under load through a master's failover, the client library's connection was
/// seen to stop answering for good (every call timing out while the cluster served again), where
/// a new one worked at once.
pub(crate) struct ClusterHandle {
    client: redis::cluster::ClusterClient,
    /// The connection in use, its generation (so that many calls failing on one connection
    /// replace it once) and when it was made (at most one a second).
    current: std::sync::Mutex<(u64, ClusterConnection, std::time::Instant)>,
}

impl ClusterHandle {
    fn connect(client: &redis::cluster::ClusterClient) -> ClusterConnection {
        let config = ClusterConfig::new()
            .set_connection_timeout(CALL_BUDGET)
            .set_response_timeout(CALL_BUDGET);
        client.get_pending_async_connection_with_config(config)
    }

    fn connection(&self) -> (u64, ClusterConnection) {
        let current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (current.0, current.1.clone())
    }

    /// Replaces the connection of `generation`, unless that was done already or the last one is
    /// less than a second old (a failing call is then tried on it again by the next caller).
    fn renew(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.0 == generation && current.2.elapsed() >= Duration::from_secs(1) {
            *current = (generation + 1, Self::connect(&self.client), std::time::Instant::now());
            tracing::info!("Redis Cluster connection made again after a call failed on it");
        }
    }
}

impl Connection {
    /// Connects lazily to what `url` names: `redis://…`, or `redis+cluster://[user:password@]
    /// host:port[,host:port…]` (any nodes of the cluster; it finds the rest); over TLS with
    /// `rediss://` and `rediss+cluster://`, as `tls` says.
    pub(crate) fn open(url: &str, tls: &Tls) -> Result<Self, String> {
        let certificates = certificates(url, tls)?;
        let cluster = url
            .strip_prefix(CLUSTER_SCHEME)
            .map(|rest| ("redis://", rest))
            .or_else(|| url.strip_prefix(TLS_CLUSTER_SCHEME).map(|rest| ("rediss://", rest)));
        if let Some((node_scheme, rest)) = cluster {
            let mut builder = ClusterClientBuilder::new(cluster_nodes(node_scheme, rest)?)
                .retries(2)
                .max_retry_wait(500);
            if let Some(certificates) = certificates {
                builder = builder.certs(certificates);
            }
            let client = builder.build().map_err(|e| e.to_string())?;
            let connection = ClusterHandle::connect(&client);
            return Ok(Self::Cluster(Arc::new(ClusterHandle {
                client,
                current: std::sync::Mutex::new((0, connection, std::time::Instant::now())),
            })));
        }
        let client = match certificates {
            Some(certificates) => redis::Client::build_with_tls(url, certificates),
            None => redis::Client::open(url),
        }
        .map_err(|e| e.to_string())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CALL_BUDGET))
            .set_response_timeout(Some(CALL_BUDGET))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let manager = ConnectionManager::new_lazy_with_config(client, config).map_err(|e| e.to_string())?;
        Ok(Self::Single(manager))
    }

    /// Runs `call` on the connection in use within `budget`; `None` when it got no answer in
    /// time. A cluster connection that timed out or failed as a connection is made again (a
    /// single server's reconnects by itself).
    pub(crate) async fn within<T, F, Fut>(&self, budget: Duration, call: F) -> Option<redis::RedisResult<T>>
    where
        F: FnOnce(Live) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let (generation, live) = match self {
            Self::Single(c) => (0, Live::Single(c.clone())),
            Self::Cluster(h) => {
                let (generation, c) = h.connection();
                (generation, Live::Cluster(c))
            }
        };
        let answer = tokio::time::timeout(budget, call(live)).await.ok();
        let broken = match &answer {
            None => true,
            Some(Err(e)) => e.is_io_error() || e.is_connection_dropped(),
            Some(Ok(_)) => false,
        };
        if broken && let Self::Cluster(h) = self {
            h.renew(generation);
        }
        answer
    }
}

/// The URL of each node that `rest`, a cluster URL after its scheme, names:
/// `[user:password@]host:port[,host:port…][/db][?query]`, each with `node_scheme`. The
/// credentials and what follows the last host (the client library's parameters, such as
/// `protocol`) go to every node: the client library refuses nodes that differ in them.
fn cluster_nodes(node_scheme: &str, rest: &str) -> Result<Vec<String>, String> {
    let (credentials, hosts) = match rest.rsplit_once('@') {
        Some((c, h)) => (format!("{c}@"), h),
        None => (String::new(), rest),
    };
    let (hosts, tail) = hosts.find(['/', '?']).map_or((hosts, ""), |at| hosts.split_at(at));
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{node_scheme}{credentials}{h}{tail}"))
        .collect();
    if nodes.is_empty() {
        return Err("no cluster node named".to_owned());
    }
    Ok(nodes)
}

/// `url` without a password.
pub fn shown_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://[credentials]@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// `url` without its `wait=<replicas>` query parameter (others are the client library's), and
/// that number (0 without one).
pub(crate) fn split_wait(url: &str) -> Result<(String, usize), String> {
    // The query starts after the credentials: a password may hold a '?'.
    let hosts_at = url.rfind('@').map_or(0, |at| at + 1);
    let Some(mark) = url[hosts_at..].find('?').map(|i| hosts_at + i) else {
        return Ok((url.to_owned(), 0));
    };
    let (base, query) = (&url[..mark], &url[mark + 1..]);
    let mut wait = 0;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.strip_prefix("wait=") {
            Some(n) => {
                wait = n
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=16).contains(n))
                    .ok_or("wait must be a number of replicas from 1 to 16")?;
            }
            None => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_given_apart_goes_into_the_url_once() {
        let put = |url: &str| with_password(url, Some("p@ss:w/rd"));
        assert_eq!(
            put("redis://10.0.0.1:6379/0").unwrap(),
            "redis://:p%40ss%3Aw%2Frd@10.0.0.1:6379/0"
        );
        assert_eq!(
            put("rediss://app@redis:6380").unwrap(),
            "rediss://app:p%40ss%3Aw%2Frd@redis:6380"
        );
        assert_eq!(
            put("redis+cluster://a:7000,b:7001/?protocol=resp3").unwrap(),
            "redis+cluster://:p%40ss%3Aw%2Frd@a:7000,b:7001/?protocol=resp3"
        );
        for twice in ["redis://:old@10.0.0.1", "redis://app:old@10.0.0.1/0"] {
            assert_eq!(
                put(twice).unwrap_err(),
                "the URL holds a password already: give it in one place"
            );
        }
        assert_eq!(with_password("redis://:old@h", None).unwrap(), "redis://:old@h");
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            shown_url("redis://:s3cret@10.0.0.1:6379/0"),
            "redis://[credentials]@10.0.0.1:6379/0"
        );
        assert_eq!(shown_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn every_cluster_node_gets_the_credentials_and_the_parameters() {
        assert_eq!(
            cluster_nodes("redis://", "u:pw@a:1, b:2?protocol=resp3"),
            Ok(vec![
                "redis://u:pw@a:1?protocol=resp3".to_owned(),
                "redis://u:pw@b:2?protocol=resp3".to_owned(),
            ])
        );
        assert_eq!(
            cluster_nodes("redis://", "a:1,b:2/0"),
            Ok(vec!["redis://a:1/0".to_owned(), "redis://b:2/0".to_owned()])
        );
        assert_eq!(cluster_nodes("redis://", "a:1"), Ok(vec!["redis://a:1".to_owned()]));
        assert_eq!(
            cluster_nodes("rediss://", ":pw@a:1,b:2"),
            Ok(vec!["rediss://:pw@a:1".to_owned(), "rediss://:pw@b:2".to_owned()])
        );
        for none in ["", " , ", "?protocol=resp3", "u:pw@"] {
            assert!(cluster_nodes("redis://", none).is_err(), "{none}");
        }
    }

    #[tokio::test]
    async fn a_cluster_url_with_parameters_opens() {
        // The client library refused nodes whose protocols differ, as when the query went to the
        // last node alone.
        let opened = Connection::open(
            "redis+cluster://127.0.0.1:1,127.0.0.1:2?protocol=resp3",
            &Tls::default(),
        );
        assert!(opened.is_ok(), "{:?}", opened.err());
    }

    #[test]
    fn wait_is_read_from_the_url_and_other_parameters_kept() {
        assert_eq!(split_wait("redis://h:1/0"), Ok(("redis://h:1/0".to_owned(), 0)));
        assert_eq!(
            split_wait("redis+cluster://a:1,b:2?wait=1"),
            Ok(("redis+cluster://a:1,b:2".to_owned(), 1))
        );
        assert_eq!(
            split_wait("redis://h:1?protocol=resp3&wait=2"),
            Ok(("redis://h:1?protocol=resp3".to_owned(), 2))
        );
        for bad in ["redis://h:1?wait=0", "redis://h:1?wait=x", "redis://h:1?wait=17"] {
            assert!(split_wait(bad).is_err(), "{bad}");
        }
        // A password with a '?' in it is no query, and no message repeats a value.
        assert_eq!(
            split_wait("redis://:pa?wait=5@h:1"),
            Ok(("redis://:pa?wait=5@h:1".to_owned(), 0))
        );
        let e = split_wait("redis://:s3cret@h:1?wait=s3cret").expect_err("not a number");
        assert!(!e.contains("s3cret"), "{e}");
    }
}
