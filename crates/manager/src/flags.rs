//! The operator's command line: every flag's Go name, default, help and setter in one table,
//! parsed as Go's `flag` package parses it (`egress_runtime::flags`).

use std::time::Duration;

use std::sync::LazyLock;

use egress_runtime::ProgramOptions;
use egress_runtime::flags::{self, Flag, Kind, Parsed, list, log_flags, parse_bool, positive, whole};
pub use egress_runtime::flags::{FlagError, parse_duration};
use egress_runtime::logging::LogOptions;

/// The probe target when a Proxy names none (the Go operator's manual check).
pub const DEFAULT_HEALTH_CHECK_URL: &str = "https://www.gstatic.com/generate_204";

/// Where the Deployment mounts the `discovery-token` Secret's key `token`.
pub const DEFAULT_DISCOVERY_TOKEN_FILE: &str = "/etc/proxy-operator/discovery/token";
/// Where the Deployment mounts the `discovery-token` Secret: one key, one file, per client.
pub const DEFAULT_DISCOVERY_TOKEN_DIR: &str = "/etc/proxy-operator/discovery";

/// How the discovery API authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryAuth {
    /// Bearer tokens of named clients from the token dir, of the client `default` from the token
    /// file (and `DISCOVERY_TOKEN`), or one the operator makes.
    Token,
    /// Nobody is asked for anything: only for a network nobody else reaches (logged at start).
    None,
}

/// Whether the discovery API serves TLS when no certificate files are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryTls {
    /// The certificate files given, else the Secret `discovery-tls` (made when missing).
    Auto,
    /// Plain HTTP: only where something else encrypts, or nobody else listens (logged).
    Off,
}

/// The Service the discovery API is reached by in the shipped install, whose names the
/// certificate the manager makes holds.
pub const DEFAULT_DISCOVERY_SERVICE: &str = "egress-proxies-operator-controller-manager-discovery-service";

/// Every flag's value after parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub metrics_bind_address: String,
    pub metrics_secure: bool,
    pub enable_http2: bool,
    pub health_probe_bind_address: String,
    pub leader_elect: bool,
    pub providers_config: String,
    /// A kubeconfig file to reach the API server with; empty: as kube infers it (`KUBECONFIG`
    /// or `~/.kube/config`, else the in-cluster service account).
    pub kubeconfig: String,
    /// `--proxy-namespace`: the namespaces served; empty: the operator's own; `["*"]`: every
    /// namespace.
    pub proxy_namespaces: Vec<String>,
    pub provider_check_interval: Duration,
    pub provider_check_timeout: Duration,
    pub gc_interval: Duration,
    pub gc_min_age: Duration,
    /// `--provisioning-timeout`: how long an instance may go without an address before it is
    /// replaced; `None` (flag value 0) never.
    pub provisioning_timeout: Option<Duration>,
    pub installation_id: String,
    /// `--cluster-cidrs`: the cluster's Pod and Service ranges, refused to External Proxies
    /// beside the fixed list of internal destinations.
    pub cluster_cidrs: Vec<String>,
    /// `--allowed-internal-destinations`: hosts, addresses or ranges External Proxies may point
    /// at although internal (tests and development setups on 127.0.0.1).
    pub allowed_internal_destinations: Vec<String>,
    /// `--external-proxy-namespaces`: where External Proxies are accepted; empty: the
    /// operator's own namespace; `["*"]`: every namespace it serves.
    pub external_proxy_namespaces: Vec<String>,
    pub discovery_addr: String,
    /// `--discovery-auth`: bearer tokens (the default) or none.
    pub discovery_auth: DiscoveryAuth,
    /// Where the discovery tokens are read from, one per line (the Secret volume's file).
    pub discovery_token_file: String,
    /// The dir whose files are the discovery clients, each named as its file (the Secret volume).
    pub discovery_token_dir: String,
    /// `--token-revoke-grace`: how long a token file may be missing or empty before its
    /// tokens are revoked.
    pub token_revoke_grace: Duration,
    /// `--discovery-tls`, `--discovery-tls-cert-file`, `--discovery-tls-key-file` and
    /// `--discovery-tls-service`.
    pub discovery_tls: DiscoveryTls,
    pub discovery_tls_cert_file: String,
    pub discovery_tls_key_file: String,
    pub discovery_tls_service: String,
    /// Every discovery client's budget unless the clients config gives it another
    /// (`--discovery-client-rate`, `--discovery-client-burst`, `--discovery-client-concurrency`;
    /// a concurrency of 0: the store's default).
    pub discovery_budget: egress_discovery::Budget,
    /// `--discovery-max-in-flight`: requests the discovery API serves at once, across clients;
    /// 0: the store's default.
    pub discovery_max_in_flight: usize,
    /// `--discovery-clients-config`: per-client budgets and scopes; empty: none.
    pub discovery_clients_config: String,
    pub max_lease_ttl: Duration,
    /// `--max-sessions-per-client`: live sessions one discovery client may hold.
    pub max_sessions_per_client: usize,
    /// `--lease-index-attributes`: the attribute keys whose values acquires are indexed by,
    /// beside `pool`.
    pub lease_index_attributes: Vec<String>,
    /// Connections each HTTP server (discovery, metrics, health probes) serves at once.
    pub max_connections: usize,
    /// `--max-connections-per-source`: of those, from one source address.
    pub max_connections_per_source: usize,
    /// `memory`, or a `redis://`, `redis+cluster://`, `rediss://` or `rediss+cluster://` URL.
    pub lease_store: String,
    /// PEM file of the CA certificates a TLS lease store's certificate must chain to, instead
    /// of the system's (empty: the system's).
    pub lease_store_ca_file: String,
    /// `--lease-store-password-file`: the Redis password, kept out of `--lease-store`.
    pub lease_store_password_file: String,
    /// PEM files of the certificate and the private key the store shows a TLS lease store that
    /// asks for one (both or neither).
    pub lease_store_client_cert_file: String,
    pub lease_store_client_key_file: String,
    /// `--lease-store-shards`: shards the unpooled proxies' lease state is spread over on
    /// Redis (each pool has one of its own).
    pub lease_store_shards: u16,
    pub lease_cooldown: Duration,
    pub health_workers: usize,
    pub trace_health_probes: bool,
    pub gcp_wire_log_full_payloads: bool,
    pub health_check_url: String,
    pub health_check_ca_file: String,
    /// `--exit-check-url`: the echo each proxy's exit is checked with; empty: no exit checks.
    pub exit_check_url: String,
    pub exit_check_interval: Duration,
    pub exit_policy: egress_controller::exit_policy::ExitPolicy,
    /// MaxMind DB files for the exits' country and ASN; empty: none.
    pub geoip_country_file: String,
    pub geoip_asn_file: String,
    pub version: bool,
    pub log: LogOptions,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            metrics_bind_address: "0".into(),
            metrics_secure: true,
            enable_http2: false,
            health_probe_bind_address: ":8081".into(),
            leader_elect: false,
            providers_config: String::new(),
            kubeconfig: String::new(),
            proxy_namespaces: Vec::new(),
            provider_check_interval: Duration::from_secs(60),
            provider_check_timeout: Duration::ZERO,
            gc_interval: Duration::from_secs(600),
            gc_min_age: Duration::from_secs(600),
            provisioning_timeout: Some(egress_controller::proxy::decide::DEFAULT_ADDRESS_BUDGET),
            installation_id: String::new(),
            cluster_cidrs: Vec::new(),
            allowed_internal_destinations: Vec::new(),
            external_proxy_namespaces: Vec::new(),
            discovery_addr: ":8090".into(),
            discovery_auth: DiscoveryAuth::Token,
            discovery_token_file: DEFAULT_DISCOVERY_TOKEN_FILE.into(),
            discovery_token_dir: DEFAULT_DISCOVERY_TOKEN_DIR.into(),
            token_revoke_grace: Duration::from_secs(30),
            discovery_tls: DiscoveryTls::Auto,
            discovery_tls_cert_file: String::new(),
            discovery_tls_key_file: String::new(),
            discovery_tls_service: DEFAULT_DISCOVERY_SERVICE.into(),
            discovery_budget: egress_discovery::Budget {
                concurrency: 0,
                ..egress_discovery::admission::DEFAULT_BUDGET
            },
            discovery_max_in_flight: 0,
            discovery_clients_config: String::new(),
            max_lease_ttl: Duration::from_secs(3600),
            max_sessions_per_client: egress_discovery::DEFAULT_MAX_SESSIONS,
            lease_index_attributes: egress_discovery::DEFAULT_INDEXED_KEYS.map(String::from).to_vec(),
            max_connections: 1024,
            max_connections_per_source: 64,
            lease_store: "memory".into(),
            lease_store_ca_file: String::new(),
            lease_store_password_file: String::new(),
            lease_store_client_cert_file: String::new(),
            lease_store_client_key_file: String::new(),
            lease_store_shards: 1,
            lease_cooldown: Duration::from_secs(900),
            health_workers: 10,
            trace_health_probes: false,
            gcp_wire_log_full_payloads: false,
            health_check_url: DEFAULT_HEALTH_CHECK_URL.into(),
            health_check_ca_file: String::new(),
            exit_check_url: String::new(),
            exit_check_interval: egress_health::DEFAULT_EXIT_INTERVAL,
            exit_policy: egress_controller::exit_policy::ExitPolicy::Observe,
            geoip_country_file: String::new(),
            geoip_asn_file: String::new(),
            version: false,
            log: LogOptions::default(),
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(Box<Options>),
    /// `-h`, `-help` or `--help`: print [`usage`] and exit 0.
    Help,
}

/// The operator's own flags, in the order the help lists them; the `--zap-*` ones follow.
const OPERATOR_FLAGS: &[Flag<Options>] = &[
    Flag::new(
        "metrics-bind-address",
        Kind::Text,
        "0",
        "Address the metrics endpoint binds to: :8443 serves HTTPS, :8080 HTTP, 0 disables it.",
        |o, value| {
                o.metrics_bind_address = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "metrics-secure",
        Kind::Bool,
        "true",
        "Serve metrics over HTTPS (a self-signed certificate made at start), allowing only callers the API server authenticates and authorises for GET /metrics.",
        |o, value| {
                o.metrics_secure = parse_bool(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "enable-http2",
        Kind::Bool,
        "false",
        "Allow HTTP/2 on the metrics server (off by default: HTTP/2 rapid-reset exposure).",
        |o, value| {
                o.enable_http2 = parse_bool(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "health-probe-bind-address",
        Kind::Text,
        ":8081",
        "Address of /healthz and /readyz; 0 disables them.",
        |o, value| {
                o.health_probe_bind_address = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "leader-elect",
        Kind::Bool,
        "false",
        "Run the reconciler, orphan GC and provider checks only while holding the leader Lease.",
        |o, value| {
                o.leader_elect = parse_bool(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "providers-config",
        Kind::Text,
        "",
        "Path of the providers YAML file (required).",
        |o, value| {
                o.providers_config = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "kubeconfig",
        Kind::Text,
        "",
        "A kubeconfig file to reach the API server with, when running outside a cluster; empty: KUBECONFIG or ~/.kube/config, else the in-cluster service account.",
        |o, value| {
                o.kubeconfig = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "proxy-namespace",
        Kind::Text,
        "",
        "Namespaces, comma-separated (at most 32), whose Proxies and pools the operator serves; empty: its own namespace; *: every namespace (needs deploy/cluster-wide's grants).",
        |o, value| {
                o.proxy_namespaces = namespaces(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "provider-check-interval",
        Kind::Duration,
        "1m0s",
        "How often provider targets are checked; 0 turns checks off, otherwise at least 10s.",
        |o, value| {
                o.provider_check_interval = parse_duration(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "provider-check-timeout",
        Kind::Duration,
        "0s",
        "Budget of one check round; 0 means min(15s, interval), otherwise at most the interval.",
        |o, value| {
                o.provider_check_timeout = parse_duration(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "gc-interval",
        Kind::Duration,
        "10m0s",
        "Time between orphan GC sweeps (more than 0).",
        |o, value| {
                let d = parse_duration(value)?;
                if d.is_zero() {
                    return Err("must be more than 0".into());
                }
                o.gc_interval = d;
                Ok(())
            },
    ),
    Flag::new(
        "gc-min-age",
        Kind::Duration,
        "10m0s",
        "Orphan GC never deletes an instance younger than this.",
        |o, value| {
                o.gc_min_age = parse_duration(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "provisioning-timeout",
        Kind::Duration,
        "15m0s",
        "How long an instance may go without an address (one that never got one, or lost it) before it is deleted and created again; 0 never, otherwise at least 30s.",
        |o, value| {
                let d = parse_duration(value)?;
                // Shorter than the address grace would replace a healthy proxy whose guest agent
                // restarts (spec/kvm.md item 54).
                if !d.is_zero() && d < Duration::from_secs(30) {
                    return Err("must be 0 or at least 30s".into());
                }
                o.provisioning_timeout = (!d.is_zero()).then_some(d);
                Ok(())
            },
    ),
    Flag::new(
        "installation-id",
        Kind::Text,
        "",
        "Marks new instances with this installation, lets orphan GC collect only instances carrying it (two operators sharing a backend), and prefixes the Redis keys; empty: derived from the cluster's kube-system namespace and the operator's namespace.",
        |o, value| {
                o.installation_id = installation_id(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "cluster-cidrs",
        Kind::Text,
        "",
        "The cluster's Pod and Service ranges, comma-separated (10.244.0.0/16,10.96.0.0/12): External Proxies may not point at them, as at any other internal destination.",
        |o, value| {
                o.cluster_cidrs = cluster_cidrs(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "allowed-internal-destinations",
        Kind::Text,
        "",
        "Hosts, addresses or ranges, comma-separated, that External Proxies may point at although internal (127.0.0.1 for proxies on this machine in development).",
        |o, value| {
                o.allowed_internal_destinations = allowed_destinations(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "external-proxy-namespaces",
        Kind::Text,
        "",
        "Namespaces, comma-separated (at most 32), where External Proxies are accepted; empty: the operator's own namespace; *: every namespace it serves.",
        |o, value| {
                o.external_proxy_namespaces = namespaces(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "discovery-addr",
        Kind::Text,
        ":8090",
        "Address of the discovery and lease API (served by every replica).",
        |o, value| {
                o.discovery_addr = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "lease-store",
        Kind::Text,
        "memory",
        "Where leases and cooldowns live: memory (this process; run one replica), redis://[user:password@]host:port[/db] to share them between replicas and keep them over restarts, or redis+cluster://[user:password@]host:port[,host:port...] for a Redis Cluster; rediss:// and rediss+cluster:// for either over TLS; add ?wait=N to answer each grant only once N replicas have it.",
        |o: &mut Options, value| {
                o.lease_store = lease_store(value)?;
                Ok(())
            },
    )
    // A password never reaches the error line: a lease store URL is not shown at all (a
    // malformed one may hide its password from any pattern).
    .hidden(),
    Flag::new(
        "lease-store-password-file",
        Kind::Text,
        "",
        "File whose first line is the Redis lease store's password, so that --lease-store need not hold it (nor the process list show it); read at start and every 10s. A password in --lease-store as well is an error.",
        |o, value| {
                o.lease_store_password_file = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "lease-store-ca-file",
        Kind::Text,
        "",
        "PEM file of the CA certificates a rediss:// lease store's certificate must chain to, instead of the system's (read at start and every 10s).",
        |o, value| {
                o.lease_store_ca_file = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "lease-store-client-cert-file",
        Kind::Text,
        "",
        "PEM file of the certificate (and its chain) shown to a rediss:// lease store that asks for one; needs --lease-store-client-key-file (read at start and every 10s).",
        |o, value| {
                o.lease_store_client_cert_file = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "lease-store-shards",
        Kind::Text,
        "1",
        "Shards the unpooled proxies' leases are spread over on a Redis lease store (1 to 256; each pool has a shard of its own); on a Redis Cluster each shard may land on another master. Every replica must be given the same.",
        |o, value| {
                o.lease_store_shards = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=egress_lease_redis::MAX_UNPOOLED_SHARDS).contains(n))
                    .ok_or_else(|| "must be a whole number from 1 to 256".to_string())?;
                Ok(())
            },
    ),
    Flag::new(
        "lease-store-client-key-file",
        Kind::Text,
        "",
        "PEM file of the private key of --lease-store-client-cert-file (read at start and every 10s).",
        |o, value| {
                o.lease_store_client_key_file = value.into();
                Ok(())
            },
    ),
    // Zero is a window of no length, as Go's time arithmetic made it: nothing rests.
    Flag::new(
        "discovery-auth",
        Kind::Text,
        "token",
        "How the discovery API authenticates: token (bearer tokens from --discovery-token-dir, --discovery-token-file and DISCOVERY_TOKEN; without any, the manager makes one and stores it in the Secret discovery-token of its namespace) or none (serves anyone who can reach it).",
        |o, value| {
                o.discovery_auth = match value {
                    "token" => DiscoveryAuth::Token,
                    "none" => DiscoveryAuth::None,
                    _ => return Err("must be token or none".into()),
                };
                Ok(())
            },
    ),
    Flag::new(
        "discovery-token-file",
        Kind::Text,
        DEFAULT_DISCOVERY_TOKEN_FILE,
        "The discovery API's bearer tokens of the client default, one per line, re-read every 10s (a Secret volume's file rotates without a restart).",
        |o, value| {
            o.discovery_token_file = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "discovery-token-dir",
        Kind::Text,
        DEFAULT_DISCOVERY_TOKEN_DIR,
        "The discovery API's named clients: each file is a client named as the file (a DNS label; at most 64 clients with default), holding its bearer tokens one per line, re-read every 10s. A missing dir has no clients; empty: none.",
        |o, value| {
            o.discovery_token_dir = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "discovery-tls",
        Kind::Text,
        "auto",
        "TLS on the discovery API: auto (the certificate files when given, else the Secret discovery-tls of the manager's namespace, made with a CA of its own when missing; clients trust its ca.crt) or off (plain HTTP: tokens and proxy passwords in clear).",
        |o, value| {
            o.discovery_tls = match value {
                "auto" => DiscoveryTls::Auto,
                "off" => DiscoveryTls::Off,
                _ => return Err("must be auto or off".to_string()),
            };
            Ok(())
        },
    ),
    Flag::new(
        "discovery-tls-cert-file",
        Kind::Text,
        "",
        "PEM file of the discovery API's certificate (its chain after it), with --discovery-tls-key-file; read at start and every 10s, a renewal serving the next connection.",
        |o, value| {
            o.discovery_tls_cert_file = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "discovery-tls-key-file",
        Kind::Text,
        "",
        "PEM file of the discovery API certificate's private key, with --discovery-tls-cert-file.",
        |o, value| {
            o.discovery_tls_key_file = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "discovery-tls-service",
        Kind::Text,
        DEFAULT_DISCOVERY_SERVICE,
        "The Service clients reach the discovery API by: the certificate the manager makes names it in the manager's namespace (NAME, NAME.NS, NAME.NS.svc, NAME.NS.svc.cluster.local), and localhost.",
        |o, value| {
            if value.is_empty() {
                return Err("must name a Service".to_string());
            }
            o.discovery_tls_service = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "token-revoke-grace",
        Kind::Duration,
        "30s",
        "How long a discovery token file (the token file, or a client's file in the token dir) may be missing or empty before its tokens are revoked; a Secret update swaps files, so a short gap is no removal. 0: at once. DISCOVERY_TOKEN is never revoked.",
        |o, value| {
            o.token_revoke_grace = parse_duration(value)?;
            Ok(())
        },
    ),
    Flag::new(
        "discovery-client-rate",
        Kind::Text,
        "200000",
        "Requests a second each discovery client may make on average (1 to 1000000), unless --discovery-clients-config gives it another; beyond its budget a request gets 429 rate_limited with Retry-After.",
        |o, value| {
                o.discovery_budget.requests_per_second = whole(value, 1, 1_000_000)?;
                Ok(())
            },
    ),
    Flag::new(
        "discovery-client-burst",
        Kind::Text,
        "200000",
        "Requests each discovery client may make at once above its rate (1 to 1000000).",
        |o, value| {
                o.discovery_budget.burst = whole(value, 1, 1_000_000)?;
                Ok(())
            },
    ),
    Flag::new(
        "discovery-client-concurrency",
        Kind::Text,
        "0",
        "Requests of one discovery client served at once (1 to 1024); more wait their turn, at most 5s. 0: 4 with the in-memory lease store, 64 with Redis.",
        |o, value| {
                o.discovery_budget.concurrency = whole(value, 0, 1024)?;
                Ok(())
            },
    ),
    Flag::new(
        "discovery-max-in-flight",
        Kind::Text,
        "0",
        "Requests the discovery API serves at once across clients (1 to 4096); a freed slot goes to the waiting client with the fewest requests in flight. 0: 4 with the in-memory lease store, 64 with Redis.",
        |o, value| {
                o.discovery_max_in_flight = whole(value, 0, 4096)? as usize;
                Ok(())
            },
    ),
    Flag::new(
        "discovery-clients-config",
        Kind::Text,
        "",
        "A YAML file of per-client budgets and scopes (clients: <name>: requestsPerSecond, burst, concurrency, scope: {namespaces, pools}), re-read every 10s; a file that cannot be used keeps the budgets and scopes in force. Empty: every client on the defaults, seeing every proxy.",
        |o, value| {
                o.discovery_clients_config = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "max-lease-ttl",
        Kind::Duration,
        "1h0m0s",
        "The longest lease a client may ask for (ttlSeconds).",
        |o, value| {
                o.max_lease_ttl = positive(parse_duration(value)?)?;
                Ok(())
            },
    ),
    Flag::new(
        "max-sessions-per-client",
        Kind::Text,
        "1000",
        "Live sticky sessions (an acquire's session) one discovery client may hold; starting one more is answered 409 too_many_sessions.",
        |o, value| {
                o.max_sessions_per_client = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=1_000_000).contains(n))
                    .ok_or_else(|| "must be a whole number from 1 to 1000000".to_string())?;
                Ok(())
            },
    ),
    Flag::new(
        "lease-index-attributes",
        Kind::Text,
        "geo,tier",
        "Attribute keys, comma-separated (at most 16), whose values lease selectors are answered from an index by (pool always is); a selector on another key reads at most 10000 proxies.",
        |o, value| {
                o.lease_index_attributes = attribute_keys(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "max-connections",
        Kind::Text,
        "1024",
        "Connections each HTTP server (discovery, metrics, health probes) serves at once; one more is answered 503 and closed (over TLS, closed).",
        |o, value| {
                o.max_connections = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=65_536).contains(n))
                    .ok_or_else(|| "must be a whole number from 1 to 65536".to_string())?;
                Ok(())
            },
    ),
    Flag::new(
        "max-connections-per-source",
        Kind::Text,
        "64",
        "Connections each HTTP server serves at once from one source address, before any authentication (clients behind one SNAT address share it); one more is answered 503 and closed (over TLS, closed).",
        |o, value| {
                o.max_connections_per_source = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=65_536).contains(n))
                    .ok_or_else(|| "must be a whole number from 1 to 65536".to_string())?;
                Ok(())
            },
    ),
    Flag::new(
        "lease-cooldown",
        Kind::Duration,
        "15m0s",
        "How long a proxy rests for a target after a rate_limited or banned report; also how long an ended lease stays reportable. 0: reports rest nothing.",
        |o, value| {
                o.lease_cooldown = parse_duration(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "health-workers",
        Kind::Text,
        "10",
        "Health probes in flight at most.",
        |o, value| {
                o.health_workers = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=10_000).contains(n))
                    .ok_or_else(|| "must be a whole number from 1 to 10000".to_string())?;
                Ok(())
            },
    ),
    Flag::new(
        "trace-health-probes",
        Kind::Bool,
        "false",
        "One health.probe span per probe (with tracing on; about one per proxy per second).",
        |o, value| {
                o.trace_health_probes = parse_bool(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "gcp-wire-log-full-payloads",
        Kind::Bool,
        "false",
        "In the gcp wire log (--zap-log-level=5 and up), show JSON strings over 1 KiB whole instead of eliding them. User-data and tokens are never shown.",
        |o, value| {
                o.gcp_wire_log_full_payloads = parse_bool(value)?;
                Ok(())
            },
    ),
    Flag::new(
        "health-check-url",
        Kind::Text,
        DEFAULT_HEALTH_CHECK_URL,
        "What probes fetch through each proxy when its spec.healthCheck.url is unset (http:// or https://).",
        |o, value| {
            egress_health::check_url(value).map_err(|e| e.to_string())?;
            o.health_check_url = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "health-check-ca-file",
        Kind::Text,
        "",
        "PEM file of CA certificates probes trust in addition to the system's (a private target; read at start and every 10s).",
        |o, value| {
                o.health_check_ca_file = value.into();
                Ok(())
            },
    ),
    Flag::new(
        "exit-check-url",
        Kind::Text,
        "",
        "An echo URL answering its caller's IP address: each proxy's exit is checked through it after its first passing probe and every --exit-check-interval (empty: no exit checks; prefer https).",
        |o, value| {
            if !value.is_empty() {
                egress_health::check_url(value).map_err(|e| e.to_string())?;
            }
            o.exit_check_url = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "exit-check-interval",
        Kind::Duration,
        "10m0s",
        "Time between two exit checks of one proxy, and between the operator's checks of its own exit (at least 10s).",
        |o, value| {
            let d = parse_duration(value)?;
            if d < Duration::from_secs(10) {
                return Err("must be at least 10s".into());
            }
            o.exit_check_interval = d;
            Ok(())
        },
    ),
    Flag::new(
        "exit-policy",
        Kind::Text,
        "observe",
        "observe: a proxy whose exit is Shared, the operator's own or Unexpected is still leased (its ExitVerified condition says so); enforce: it is not, and a ProxyPool replaces it.",
        |o, value| {
            use egress_controller::exit_policy::ExitPolicy;
            o.exit_policy = match value {
                "observe" => ExitPolicy::Observe,
                "enforce" => ExitPolicy::Enforce,
                _ => return Err("expected observe or enforce".into()),
            };
            Ok(())
        },
    ),
    Flag::new(
        "geoip-country-file",
        Kind::Text,
        "",
        "A MaxMind DB file of countries (GeoLite2 or DB-IP country, at most 32 MiB): each exit's country, read at start and when it changes.",
        |o, value| {
            o.geoip_country_file = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "geoip-asn-file",
        Kind::Text,
        "",
        "A MaxMind DB file of autonomous systems (GeoLite2 or DB-IP ASN, at most 32 MiB): each exit's ASN and organisation, read at start and when it changes.",
        |o, value| {
            o.geoip_asn_file = value.into();
            Ok(())
        },
    ),
    Flag::new(
        "version",
        Kind::Bool,
        "false",
        "Print the commit this binary was built from and exit.",
        |o, value| {
                o.version = parse_bool(value)?;
                Ok(())
            },
    ),
];

/// Every flag: the operator's, then the `--zap-*` ones.
static FLAGS: LazyLock<Vec<Flag<Options>>> =
    LazyLock::new(|| OPERATOR_FLAGS.iter().copied().chain(log_flags()).collect());

/// The help text, listing every flag with its default.
pub fn usage() -> String {
    flags::usage("egress-operator", &FLAGS)
}

/// Parses the arguments after the program name.
///
/// # Errors
///
/// The first unusable argument, worded as Go's `flag` package words it.
pub fn parse<I, S>(args: I) -> Result<Command, FlagError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut options = Options::default();
    Ok(match flags::parse(&FLAGS, &mut options, args)? {
        Parsed::Run => Command::Run(Box::new(options)),
        Parsed::Help => Command::Help,
    })
}

/// Every flag, for [`egress_runtime::process::main`].
pub fn all() -> &'static [Flag<Options>] {
    &FLAGS
}

impl ProgramOptions for Options {
    fn log(&mut self) -> &mut LogOptions {
        &mut self.log
    }

    fn version(&self) -> bool {
        self.version
    }
}

fn lease_store(value: &str) -> Result<String, String> {
    let names_a_host = |scheme: &str| value.strip_prefix(scheme).is_some_and(|rest| !rest.is_empty());
    let schemes = ["redis://", "redis+cluster://", "rediss://", "rediss+cluster://"];
    if value == "memory" || schemes.into_iter().any(names_a_host) {
        Ok(value.to_owned())
    } else {
        Err("must be memory, or a redis://, redis+cluster://, rediss:// or rediss+cluster:// URL".to_owned())
    }
}

/// The installation mark becomes a label value on every backend (a Kubernetes label, a Compute
/// Engine label), so it takes only what both accept; empty means none.
fn installation_id(value: &str) -> Result<String, String> {
    let b = value.as_bytes();
    let inner_ok = b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'_');
    let ends_ok = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if value.is_empty() || (b.len() <= 63 && inner_ok && ends_ok(b.first()) && ends_ok(b.last())) {
        Ok(value.to_owned())
    } else {
        Err("must be at most 63 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit (it becomes a label value on every backend)".to_owned())
    }
}

fn cluster_cidrs(value: &str) -> Result<Vec<String>, String> {
    let ranges = list(value);
    for r in &ranges {
        egress_netguard::Range::parse(r)?;
    }
    Ok(ranges)
}

fn allowed_destinations(value: &str) -> Result<Vec<String>, String> {
    let items = list(value);
    for i in &items {
        if i.contains('/') {
            egress_netguard::Range::parse(i)?;
        } else if i.contains(char::is_whitespace) {
            return Err(format!("{i:?} is not a host, an address or a range"));
        }
    }
    Ok(items)
}

/// A list of namespaces (`--proxy-namespace`, `--external-proxy-namespaces`): names, or `*`
/// alone for every namespace.
/// Indexed attribute keys: at most 16, each 1 to 63 of `A-Z`, `a-z`, `0-9`, `.`, `_`, `-`
/// and `/` (an index is named `key=value`, so no `=`).
fn attribute_keys(value: &str) -> Result<Vec<String>, String> {
    let keys = list(value);
    if keys.len() > 16 {
        return Err("at most 16 attribute keys".into());
    }
    let key = |k: &str| {
        (1..=63).contains(&k.len())
            && k.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'/'))
    };
    match keys.iter().find(|k| !key(k)) {
        Some(bad) => Err(format!(
            "{bad:?} is not an attribute key (1 to 63 of A-Z a-z 0-9 . _ - /)"
        )),
        None => Ok(keys),
    }
}

fn namespaces(value: &str) -> Result<Vec<String>, String> {
    let names = list(value);
    if names == ["*"] {
        return Ok(names);
    }
    if names.len() > egress_api::served::MAX_NAMESPACES {
        return Err(format!("at most {} namespaces", egress_api::served::MAX_NAMESPACES));
    }
    let label = |n: &str| {
        n.len() <= 63
            && n.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && !n.starts_with('-')
            && !n.ends_with('-')
    };
    match names.iter().find(|n| !label(n)) {
        Some(bad) => Err(format!(
            "{bad:?} is not a namespace name (or * alone, for every namespace)"
        )),
        None => Ok(names),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Options {
        match parse(args.iter().copied()) {
            Ok(Command::Run(o)) => *o,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn the_lease_store_is_memory_or_a_redis_url_with_a_host() {
        for ok in [
            "memory",
            "redis://127.0.0.1:6379",
            "redis+cluster://10.0.0.1:6379,10.0.0.2:6379?wait=1",
            "rediss://redis.example:6380",
            "rediss+cluster://10.0.0.1:6379,10.0.0.2:6379",
        ] {
            assert_eq!(lease_store(ok).as_deref(), Ok(ok));
        }
        for bad in [
            "",
            "redis://",
            "redis+cluster://",
            "rediss://",
            "rediss+cluster://",
            "etcd://x",
        ] {
            assert!(lease_store(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn go_durations_parse_as_go_parses_them() {
        let ok = [
            ("0", 0),
            ("1h30m", 5_400_000_000_000),
            ("1.5h", 5_400_000_000_000),
            ("300ms", 300_000_000),
            ("2h45m10.5s", 9_910_500_000_000),
            ("1µs", 1_000),
            ("1us", 1_000),
            ("10ns", 10),
            ("+5s", 5_000_000_000),
            (".5s", 500_000_000),
            ("1.s", 1_000_000_000),
            ("-0s", 0),
        ];
        for (text, nanos) in ok {
            assert_eq!(parse_duration(text), Ok(Duration::from_nanos(nanos)), "{text}");
        }
        let bad = [
            ("", "time: invalid duration \"\""),
            ("5", "time: missing unit in duration \"5\""),
            ("1d", "time: unknown unit \"d\" in duration \"1d\""),
            ("abc", "time: invalid duration \"abc\""),
            ("1h-5m", "time: unknown unit \"h-\" in duration \"1h-5m\""),
            (".s", "time: invalid duration \".s\""),
            ("-1m", "must not be negative"),
            ("9999999999h", "time: invalid duration \"9999999999h\""),
        ];
        for (text, message) in bad {
            assert_eq!(parse_duration(text), Err(message.to_string()), "{text}");
        }
    }

    #[test]
    fn both_dash_styles_both_value_styles_and_the_last_value_wins() {
        let o = run(&[
            "-leader-elect",
            "--providers-config",
            "/etc/p.yaml",
            "-provider-check-interval=1h30m",
            "--metrics-secure=false",
            "-gc-min-age",
            "5m",
            "-gc-min-age=7m",
        ]);
        assert!(o.leader_elect);
        assert!(!o.metrics_secure);
        assert_eq!(o.providers_config, "/etc/p.yaml");
        assert_eq!(o.provider_check_interval, Duration::from_secs(5400));
        assert_eq!(o.gc_min_age, Duration::from_secs(420));
        assert_eq!(run(&[]), Options::default());
    }

    #[test]
    fn unusable_command_lines_are_named() {
        let cases: [(&[&str], &str); 19] = [
            (&["--nope"], "flag provided but not defined: -nope"),
            (&["--providers-config"], "flag needs an argument: -providers-config"),
            (
                &["--provider-check-interval=soon"],
                "invalid value \"soon\" for flag -provider-check-interval: time: invalid duration \"soon\"",
            ),
            (
                &["--leader-elect=yes"],
                "invalid value \"yes\" for flag -leader-elect: parse error",
            ),
            (
                &["--leader-elect", "false"],
                "unexpected argument \"false\": every setting is a flag (a boolean takes its value as -flag=false)",
            ),
            (&["---x"], "bad flag syntax: ---x"),
            (
                &["--gc-interval=0"],
                "invalid value \"0\" for flag -gc-interval: must be more than 0",
            ),
            (
                &["--provisioning-timeout=10s"],
                "invalid value \"10s\" for flag -provisioning-timeout: must be 0 or at least 30s",
            ),
            (
                &["--installation-id=Blue"],
                "invalid value \"Blue\" for flag -installation-id: must be at most 63 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit (it becomes a label value on every backend)",
            ),
            (
                &["--installation-id=blue.green"],
                "invalid value \"blue.green\" for flag -installation-id: must be at most 63 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit (it becomes a label value on every backend)",
            ),
            (
                &["--installation-id=-blue"],
                "invalid value \"-blue\" for flag -installation-id: must be at most 63 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit (it becomes a label value on every backend)",
            ),
            (
                &["--lease-index-attributes=geo,ge=o"],
                "invalid value \"geo,ge=o\" for flag -lease-index-attributes: \"ge=o\" is not an attribute key (1 to 63 of A-Z a-z 0-9 . _ - /)",
            ),
            (
                &["--lease-index-attributes=a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q"],
                "invalid value \"a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q\" for flag -lease-index-attributes: at most 16 attribute keys",
            ),
            (
                &["--lease-store-shards=0"],
                "invalid value \"0\" for flag -lease-store-shards: must be a whole number from 1 to 256",
            ),
            (
                &["--lease-store-shards=257"],
                "invalid value \"257\" for flag -lease-store-shards: must be a whole number from 1 to 256",
            ),
            (
                &["--max-sessions-per-client=0"],
                "invalid value \"0\" for flag -max-sessions-per-client: must be a whole number from 1 to 1000000",
            ),
            (
                &["--max-sessions-per-client=many"],
                "invalid value \"many\" for flag -max-sessions-per-client: must be a whole number from 1 to 1000000",
            ),
            (
                &["--zap-encoder=xml"],
                "invalid value \"xml\" for flag -zap-encoder: invalid encoder value \"xml\"",
            ),
            (
                &["--zap-log-level=loud"],
                "invalid value \"loud\" for flag -zap-log-level: invalid log level \"loud\"",
            ),
        ];
        for (args, message) in cases {
            let err = parse(args.iter().copied()).expect_err(message);
            assert_eq!(err.to_string(), message);
        }
    }

    #[test]
    fn namespace_lists_are_names_or_a_lone_star() {
        let pick = |o: &Options, flag: &str| match flag {
            "proxy-namespace" => o.proxy_namespaces.clone(),
            _ => o.external_proxy_namespaces.clone(),
        };
        for flag in ["proxy-namespace", "external-proxy-namespaces"] {
            let Ok(Command::Run(o)) = parse([format!("--{flag}=crawlers, team-b").as_str()]) else {
                panic!("refused");
            };
            assert_eq!(pick(&o, flag), ["crawlers", "team-b"]);
            let Ok(Command::Run(o)) = parse([format!("--{flag}=*").as_str()]) else {
                panic!("refused");
            };
            assert_eq!(pick(&o, flag), ["*"]);
            let Ok(Command::Run(o)) = parse([format!("--{flag}=").as_str()]) else {
                panic!("refused");
            };
            assert!(pick(&o, flag).is_empty(), "empty: the default");
            let many: Vec<String> = (0..33).map(|i| format!("ns{i}")).collect();
            for bad in ["*,crawlers".to_owned(), "Crawlers".to_owned(), many.join(",")] {
                assert!(parse([format!("--{flag}={bad}").as_str()]).is_err(), "{flag}={bad}");
            }
        }
    }

    #[test]
    fn destination_lists_are_trimmed_and_ranges_must_parse() {
        let Ok(Command::Run(o)) = parse([
            "--cluster-cidrs= 10.96.0.0/12, fd00:10::/64,",
            "--allowed-internal-destinations=127.0.0.1, proxy.lan ,10.8.0.0/16",
        ]) else {
            panic!("refused");
        };
        assert_eq!(o.cluster_cidrs, ["10.96.0.0/12", "fd00:10::/64"]);
        assert_eq!(
            o.allowed_internal_destinations,
            ["127.0.0.1", "proxy.lan", "10.8.0.0/16"]
        );
        for bad in [
            "--cluster-cidrs=10.96.0.1/12",
            "--cluster-cidrs=cluster.local",
            "--allowed-internal-destinations=10.8.0.0/33",
        ] {
            assert!(parse([bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_exit_check_flags_take_what_they_say_and_refuse_the_rest() {
        use egress_controller::exit_policy::ExitPolicy;
        let Ok(Command::Run(o)) = parse([
            "--exit-check-url=https://echo.example/ip",
            "--exit-check-interval=30s",
            "--exit-policy=enforce",
            "--geoip-country-file=/geo/country.mmdb",
            "--geoip-asn-file=/geo/asn.mmdb",
        ]) else {
            panic!("refused");
        };
        assert_eq!(o.exit_check_url, "https://echo.example/ip");
        assert_eq!(o.exit_check_interval, Duration::from_secs(30));
        assert_eq!(o.exit_policy, ExitPolicy::Enforce);
        assert_eq!(
            (o.geoip_country_file.as_str(), o.geoip_asn_file.as_str()),
            ("/geo/country.mmdb", "/geo/asn.mmdb")
        );
        let Ok(Command::Run(defaults)) = parse::<[&str; 0], &str>([]) else {
            panic!("refused");
        };
        assert_eq!(defaults.exit_check_url, "", "off unless asked");
        assert_eq!(defaults.exit_policy, ExitPolicy::Observe);
        assert_eq!(defaults.exit_check_interval, egress_health::DEFAULT_EXIT_INTERVAL);
        for bad in [
            "--exit-check-url=ftp://echo.example/ip",
            "--exit-check-url=https://user:pw@echo.example/ip",
            "--exit-check-interval=5s",
            "--exit-check-interval=soon",
            "--exit-policy=strict",
        ] {
            assert!(parse([bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_installation_id_is_a_label_value_every_backend_takes() {
        for ok in ["", "blue", "prod_eu-1", &"a".repeat(63)] {
            let Ok(Command::Run(o)) = parse([format!("--installation-id={ok}")]) else {
                panic!("refused {ok:?}");
            };
            assert_eq!(o.installation_id, ok);
        }
        for bad in [&"a".repeat(64), "blue-", "blue green", "ü"] {
            assert!(parse([format!("--installation-id={bad}")]).is_err(), "{bad:?}");
        }
    }

    /// 0 turns the provisioning timeout off (Go's behaviour: an instance waits for its address
    /// for good); any other value is the budget.
    #[test]
    fn a_zero_provisioning_timeout_means_never() {
        for (text, budget) in [("0", None), ("45s", Some(Duration::from_secs(45)))] {
            let Ok(Command::Run(o)) = parse([format!("--provisioning-timeout={text}")]) else {
                panic!("refused {text}");
            };
            assert_eq!(o.provisioning_timeout, budget, "{text}");
        }
    }

    /// Go's duration flags took 0; for the cooldown it is a window of no length.
    #[test]
    fn a_zero_lease_cooldown_means_no_cooldown() {
        let Ok(Command::Run(o)) = parse(["--lease-cooldown=0"]) else {
            panic!("refused");
        };
        assert_eq!(o.lease_cooldown, Duration::ZERO);
    }

    #[test]
    fn the_discovery_clients_are_read_where_the_deployment_mounts_the_token_secret() {
        let o = run(&[]);
        assert_eq!(o.discovery_token_dir, "/etc/proxy-operator/discovery");
        assert!(
            o.discovery_token_file
                .starts_with(&format!("{}/", o.discovery_token_dir))
        );
        assert_eq!(run(&["--discovery-token-dir="]).discovery_token_dir, "");
        assert_eq!(
            run(&["--discovery-token-dir", "/run/clients"]).discovery_token_dir,
            "/run/clients"
        );
    }

    #[test]
    fn the_discovery_budget_flags_default_to_the_documented_budget_and_are_bounded() {
        // Each flag's shown default, set as given, is the default the options start from.
        let mut o = Options::default();
        for f in FLAGS
            .iter()
            .filter(|f| f.name.starts_with("discovery-client-") || f.name == "discovery-max-in-flight")
        {
            (f.set)(&mut o, f.default).unwrap();
        }
        let (rate, burst) = (o.discovery_budget.requests_per_second, o.discovery_budget.burst);
        let default = egress_discovery::admission::DEFAULT_BUDGET;
        assert_eq!((rate, burst), (default.requests_per_second, default.burst));
        // Concurrency and requests at once: the store's defaults.
        assert_eq!((o.discovery_budget.concurrency, o.discovery_max_in_flight), (0, 0));
        assert_eq!(o, Options::default());
        let o = run(&[
            "--discovery-client-rate=5",
            "--discovery-client-burst=7",
            "--discovery-client-concurrency=2",
        ]);
        assert_eq!(
            o.discovery_budget,
            egress_discovery::Budget {
                requests_per_second: 5,
                burst: 7,
                concurrency: 2
            }
        );
        for bad in [
            "--discovery-client-rate=0",
            "--discovery-client-concurrency=1025",
            "--discovery-max-in-flight=x",
            "--discovery-max-in-flight=4097",
        ] {
            assert!(parse([bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn help_is_a_command_and_lists_every_flag() {
        assert_eq!(parse(["-h"]), Ok(Command::Help));
        assert_eq!(parse(["--help"]), Ok(Command::Help));
        let text = usage();
        for f in FLAGS.iter() {
            assert!(text.contains(&format!("-{}", f.name)), "{}", f.name);
        }
    }

    #[test]
    fn every_flag_takes_a_well_formed_value() {
        for f in FLAGS.iter() {
            let value = match f.kind {
                Kind::Bool => "true",
                Kind::Duration => "1m",
                Kind::Text if f.name.starts_with("zap-") => match f.name {
                    "zap-encoder" => "json",
                    "zap-log-level" => "info",
                    "zap-stacktrace-level" => "error",
                    _ => "rfc3339",
                },
                Kind::Text
                    if f.name == "health-workers"
                        || f.name == "max-connections"
                        || f.name == "max-connections-per-source"
                        || f.name == "max-sessions-per-client"
                        || f.name == "lease-store-shards" =>
                {
                    "4"
                }
                Kind::Text if f.name.starts_with("discovery-client-") || f.name == "discovery-max-in-flight" => "4",
                Kind::Text if f.name == "discovery-addr" => ":0",
                Kind::Text if f.name == "discovery-auth" => "none",
                Kind::Text if f.name == "discovery-tls" => "off",
                Kind::Text if f.name == "health-check-url" || f.name == "exit-check-url" => "https://x.test/",
                Kind::Text if f.name == "exit-policy" => "enforce",
                Kind::Text if f.name == "lease-store" => "redis://127.0.0.1:6379",
                Kind::Text if f.name == "cluster-cidrs" => "10.96.0.0/12",
                Kind::Text if f.name == "lease-index-attributes" => "geo,example.com/tier",
                Kind::Text => "x",
            };
            (f.set)(&mut Options::default(), value).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        }
    }
}
