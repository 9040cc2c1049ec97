//! The `egress-gateway` program: its flags (Go-style, one table) and its life on the runtime
//! crate: both fronts, probes, metrics behind a token, and a drain at SIGTERM.
//!
//! It needs no Kubernetes API access: leases come from the discovery API with each client's
//! own token, and its metrics take a bearer token from a file (`--metrics-token-file`), not a
//! TokenReview.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_discovery::client::Client;
use egress_runtime::flags::{Flag, Kind, log_flags, parse_bool, parse_duration, positive, whole};
use egress_runtime::logging::LogOptions;
use egress_runtime::{Fatal, Program, ProgramOptions, serve};
use tokio_util::sync::CancellationToken;

use crate::tls_front::{self, CurrentTls, TlsFiles, TlsFollower};
use crate::{Gateway, Settings, http_front, leases::Leases, socks_front};
use egress_files::Follower;

/// Who the program is.
pub const PROGRAM: Program = Program {
    name: "egress-gateway",
    service: "egress-gateway",
    commit: egress_runtime::COMMIT,
    rust_version: egress_runtime::RUSTC_VERSION,
    span_keys: &[],
};

/// The discovery API's Service in the default install.
pub const DEFAULT_DISCOVERY_URL: &str =
    "https://egress-proxies-operator-controller-manager-discovery-service.egress-proxies-operator-system.svc:8090";

/// The command line, parsed.
#[derive(Debug)]
pub struct Options {
    log: LogOptions,
    version: bool,
    listen: String,
    socks_listen: String,
    tls_listen: String,
    tls_cert_file: Option<PathBuf>,
    tls_key_file: Option<PathBuf>,
    health: String,
    metrics: String,
    metrics_token_file: Option<PathBuf>,
    discovery_url: String,
    discovery_ca_file: Option<PathBuf>,
    api_timeout: Duration,
    drain_timeout: Duration,
    settings: Settings,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            log: LogOptions::default(),
            version: false,
            listen: ":8080".into(),
            socks_listen: ":1080".into(),
            tls_listen: "0".into(),
            tls_cert_file: None,
            tls_key_file: None,
            health: ":8081".into(),
            metrics: "0".into(),
            metrics_token_file: None,
            discovery_url: DEFAULT_DISCOVERY_URL.into(),
            discovery_ca_file: None,
            api_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            settings: Settings::default(),
        }
    }
}

impl Options {
    /// How long open tunnels may finish at SIGTERM.
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout
    }
}

impl ProgramOptions for Options {
    fn log(&mut self) -> &mut LogOptions {
        &mut self.log
    }

    fn version(&self) -> bool {
        self.version
    }
}

fn duration(value: &str) -> Result<Duration, String> {
    positive(parse_duration(value)?)
}

fn count(value: &str) -> Result<usize, String> {
    whole(value, 1, 1_000_000).map(|n| n as usize)
}

/// The statuses of `--ban-statuses`: a comma-separated list of 100..=599.
fn statuses(value: &str) -> Result<Vec<u16>, String> {
    egress_runtime::flags::list(value)
        .iter()
        .map(|s| {
            s.parse::<u16>()
                .ok()
                .filter(|n| (100..=599).contains(n))
                .ok_or_else(|| format!("{s:?} is not an HTTP status"))
        })
        .collect()
}

const GATEWAY_FLAGS: &[Flag<Options>] = &[
    Flag::new(
        "listen",
        Kind::Text,
        ":8080",
        "Address of the HTTP front (CONNECT and plain-HTTP forwarding).",
        |o, v| {
            o.listen = v.into();
            Ok(())
        },
    ),
    Flag::new(
        "socks-listen",
        Kind::Text,
        ":1080",
        "Address of the SOCKS5 front; 0 turns it off.",
        |o, v| {
            o.socks_listen = v.into();
            Ok(())
        },
    ),
    Flag::new(
        "tls-listen",
        Kind::Text,
        "0",
        "Address of the HTTP front over TLS (an https:// proxy URL), with --tls-cert-file and --tls-key-file; 0 turns it off.",
        |o, v| {
            o.tls_listen = v.into();
            Ok(())
        },
    ),
    Flag::new(
        "tls-cert-file",
        Kind::Text,
        "",
        "PEM certificate chain of the TLS front (read at start and every 10s).",
        |o, v| {
            o.tls_cert_file = Some(v.into());
            Ok(())
        },
    ),
    Flag::new(
        "tls-key-file",
        Kind::Text,
        "",
        "PEM private key of the TLS front (read at start and every 10s).",
        |o, v| {
            o.tls_key_file = Some(v.into());
            Ok(())
        },
    ),
    Flag::new(
        "health-probe-bind-address",
        Kind::Text,
        ":8081",
        "Address of /healthz and /readyz.",
        |o, v| {
            o.health = v.into();
            Ok(())
        },
    ),
    Flag::new(
        "metrics-bind-address",
        Kind::Text,
        "0",
        "Address of /metrics (HTTPS, for callers presenting --metrics-token-file's token); 0 turns it off.",
        |o, v| {
            o.metrics = v.into();
            Ok(())
        },
    ),
    Flag::new(
        "metrics-token-file",
        Kind::Text,
        "",
        "File holding the bearer token /metrics asks for (read at start); needed when metrics are served.",
        |o, v| {
            o.metrics_token_file = Some(v.into());
            Ok(())
        },
    ),
    Flag::new(
        "discovery-url",
        Kind::Text,
        DEFAULT_DISCOVERY_URL,
        "The discovery API the leases come from.",
        |o: &mut Options, v| {
            o.discovery_url = v.into();
            Ok(())
        },
    )
    .hidden(),
    Flag::new(
        "discovery-ca-file",
        Kind::Text,
        "",
        "PEM file of the CA certificates an https:// discovery API's certificate must chain to, instead of the system's (the ca.crt of the Secret discovery-tls).",
        |o: &mut Options, v| {
            o.discovery_ca_file = (!v.is_empty()).then(|| v.into());
            Ok(())
        },
    ),
    Flag::new(
        "discovery-timeout",
        Kind::Duration,
        "10s",
        "Budget of each call to the discovery API.",
        |o, v| {
            o.api_timeout = duration(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "max-lease-ttl",
        Kind::Duration,
        "1h0m0s",
        "The longest ttl a username may ask for (the operator's --max-lease-ttl).",
        |o, v| {
            o.settings.max_ttl = duration(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "max-connections",
        Kind::Text,
        "4096",
        "Client connections at once, at most; more are closed as they come.",
        |o, v| {
            o.settings.max_connections = count(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "max-connections-per-client",
        Kind::Text,
        "1024",
        "Tunnels and plain-HTTP requests of one client at once, at most.",
        |o, v| {
            o.settings.per_client = count(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "idle-timeout",
        Kind::Duration,
        "5m0s",
        "A tunnel neither side sent a byte on for this long is closed.",
        |o, v| {
            o.settings.idle_timeout = duration(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "head-timeout",
        Kind::Duration,
        "10s",
        "Time a client has to send its request head or SOCKS5 handshake.",
        |o, v| {
            o.settings.head_timeout = duration(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "backend-timeout",
        Kind::Duration,
        "10s",
        "Time a backend proxy has to answer the gateway's CONNECT or request.",
        |o, v| {
            o.settings.chain.budget = duration(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "drain-timeout",
        Kind::Duration,
        "30s",
        "At SIGTERM: how long open tunnels may finish before they are closed.",
        |o, v| {
            o.drain_timeout = duration(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "ban-statuses",
        Kind::Text,
        "403,429",
        "Plain-HTTP answer statuses reported as bans for their host and proxy.",
        |o, v| {
            o.settings.ban_statuses = statuses(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "access-log",
        Kind::Bool,
        "false",
        "One log line per tunnel and request (client, destination, proxy, bytes, duration, outcome).",
        |o, v| {
            o.settings.access_log = parse_bool(v)?;
            Ok(())
        },
    ),
    Flag::new(
        "version",
        Kind::Bool,
        "false",
        "Print the commit this binary was built from and exit.",
        |o, v| {
            o.version = parse_bool(v)?;
            Ok(())
        },
    ),
];

/// Every flag: the gateway's, then the `--zap-*` ones.
pub fn flags() -> Vec<Flag<Options>> {
    GATEWAY_FLAGS.iter().copied().chain(log_flags()).collect()
}

/// The whole program, from its command line to its exit code.
pub fn main() -> std::process::ExitCode {
    egress_runtime::process::main(&PROGRAM, &flags(), run)
}

/// `--name=value` as an address to bind; `None` for `0`.
fn address(flag: &str, value: &str) -> Result<Option<SocketAddr>, Fatal> {
    if value == "0" {
        return Ok(None);
    }
    serve::bind_address(flag, value).map(Some).map_err(Fatal::plain)
}

/// The discovery API's client: its certificate checked against `--discovery-ca-file` when
/// given (read at start), else the system's CAs.
fn discovery_client(o: &Options) -> Result<Client, Fatal> {
    const FAILED: &str = "Failed to set up the discovery API client";
    let Some(path) = &o.discovery_ca_file else {
        return Client::with_timeout(&o.discovery_url, None, o.api_timeout).map_err(|e| Fatal::new(FAILED, e));
    };
    let ca = egress_runtime::files::read_regular_file(path, 1024 * 1024)
        .map_err(|e| Fatal::new(FAILED, format!("--discovery-ca-file {}: {}", path.display(), e.problem)))?;
    Client::with_ca(&o.discovery_url, None, o.api_timeout, &ca).map_err(|e| Fatal::new(FAILED, e))
}

/// Serves until `shutdown`, then drains.
///
/// # Errors
/// A listener that cannot be bound, a metrics token that cannot be read, a discovery URL the
/// client refuses.
pub async fn run(o: Options, shutdown: CancellationToken) -> Result<(), Fatal> {
    let api = discovery_client(&o)?;
    let gateway = Arc::new(Gateway::new(Leases::new(api), o.settings.clone()));
    let limits = egress_http::Limits::default();
    if let Some(addr) = address("health-probe-bind-address", &o.health)? {
        let bound = serve::probes(addr, limits, shutdown.clone()).await;
        let bound = bound.map_err(|e| Fatal::new("Failed to serve the health probes", e))?;
        tracing::info!(address = %bound, "Serving health probes");
    }
    if let Some(addr) = address("metrics-bind-address", &o.metrics)? {
        serve_metrics(&gateway, addr, o.metrics_token_file.as_ref(), limits, &shutdown).await?;
    }
    let fronts = [
        ("listen", &o.listen, Front::Http),
        ("socks-listen", &o.socks_listen, Front::Socks),
        ("tls-listen", &o.tls_listen, Front::Tls),
    ];
    let tls = tls_front_files(&o)?.map(load_tls).transpose()?;
    for (flag, value, front) in fronts {
        let Some(addr) = address(flag, value)? else { continue };
        let listener = serve::listen(addr)
            .await
            .map_err(|e| Fatal::new(format!("Failed to bind --{flag}={value}"), e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Fatal::new("Failed to read a bound address", e))?;
        tracing::info!(address = %bound, front = front.name(), "Serving");
        let gateway = gateway.clone();
        match (front, &tls) {
            (Front::Http, _) => tokio::spawn(http_front::serve(listener, gateway)),
            (Front::Socks, _) => tokio::spawn(socks_front::serve(listener, gateway)),
            (Front::Tls, Some((current, _))) => tokio::spawn(http_front::serve_tls(listener, gateway, current.clone())),
            (Front::Tls, None) => unreachable!("tls_front_files refuses --tls-listen without its files"),
        };
    }
    if let Some((_, follower)) = tls {
        tokio::spawn(follower.run(TLS_FOLLOW, shutdown.clone()));
    }
    shutdown.cancelled().await;
    tracing::info!(budget = ?o.drain_timeout, "Draining: no new connections; open tunnels may finish");
    let finished = gateway.drain(o.drain_timeout).await;
    tracing::info!(closed_early = !finished, "Drained");
    Ok(())
}

/// Which front a listener serves.
#[derive(Debug, Clone, Copy)]
enum Front {
    Http,
    Socks,
    Tls,
}

impl Front {
    fn name(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Socks => "socks5",
            Self::Tls => "https",
        }
    }
}

/// How often the TLS front's files are read again.
const TLS_FOLLOW: Duration = Duration::from_secs(10);

/// The TLS front's files, when it is on.
///
/// # Errors
/// `--tls-listen` without both files, or files without `--tls-listen`.
fn tls_front_files(o: &Options) -> Result<Option<TlsFiles>, Fatal> {
    let on = o.tls_listen != "0";
    match (on, &o.tls_cert_file, &o.tls_key_file) {
        (true, Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        })),
        (false, None, None) => Ok(None),
        (true, _, _) => Err(Fatal::plain("--tls-listen needs --tls-cert-file and --tls-key-file")),
        (false, _, _) => Err(Fatal::plain(
            "--tls-cert-file and --tls-key-file are for the TLS front: set --tls-listen too",
        )),
    }
}

/// The TLS front's certificate in force, and its follower.
fn load_tls(files: TlsFiles) -> Result<(CurrentTls, Follower<TlsFollower>), Fatal> {
    let (current, follower) =
        tls_front::load(files).map_err(|e| Fatal::new("Failed to load the TLS front's files", e))?;
    Ok((current, Follower::new(follower)))
}

/// `/metrics` over HTTPS for callers presenting the token in `token_file`.
async fn serve_metrics(
    gateway: &Gateway,
    addr: SocketAddr,
    token_file: Option<&PathBuf>,
    limits: egress_http::Limits,
    shutdown: &CancellationToken,
) -> Result<(), Fatal> {
    let Some(path) = token_file else {
        return Err(Fatal::plain(
            "--metrics-bind-address needs --metrics-token-file: the gateway serves no open endpoint",
        ));
    };
    let token = egress_runtime::files::read_regular_file(path, 4096)
        .map_err(|e| Fatal::new("Failed to read --metrics-token-file", e))?;
    let token = String::from_utf8_lossy(&token).trim().to_owned();
    if token.is_empty() {
        return Err(Fatal::plain("--metrics-token-file is empty"));
    }
    let mut registry = prometheus_client::registry::Registry::default();
    gateway.metrics().register(&mut registry);
    let guard = Some(serve::Guard::token(&token));
    let registry = Arc::new(Mutex::new(registry));
    let bound = serve::metrics(addr, registry, guard, false, limits, shutdown.clone())
        .await
        .map_err(|e| Fatal::new("Failed to serve metrics", e))?;
    tracing::info!(address = %bound, "Serving metrics");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Result<Options, egress_runtime::flags::FlagError> {
        let mut o = Options::default();
        egress_runtime::flags::parse(&flags(), &mut o, args.iter().copied()).map(|_| o)
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let o = parsed(&[]).unwrap();
        assert_eq!(
            (o.listen.as_str(), o.socks_listen.as_str(), o.metrics.as_str()),
            (":8080", ":1080", "0")
        );
        assert_eq!(o.settings.ban_statuses, [403, 429]);
        assert_eq!(o.settings.idle_timeout, Duration::from_secs(300));
        assert!(!o.settings.access_log);
    }

    #[test]
    fn flags_set_what_they_name_and_bad_values_are_refused() {
        let o = parsed(&[
            "--ban-statuses=403, 451",
            "--idle-timeout=90s",
            "--max-connections-per-client=8",
            "--access-log",
            "--socks-listen=0",
        ])
        .unwrap();
        assert_eq!(o.settings.ban_statuses, [403, 451]);
        assert_eq!(o.settings.idle_timeout, Duration::from_secs(90));
        assert_eq!(o.settings.per_client, 8);
        assert!(o.settings.access_log);
        assert_eq!(o.socks_listen, "0");
        for bad in [
            "--ban-statuses=700",
            "--idle-timeout=0s",
            "--max-connections=0",
            "--max-lease-ttl=soon",
        ] {
            assert!(parsed(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_tls_front_needs_both_files_and_files_need_the_front() {
        let files = |args: &[&str]| tls_front_files(&parsed(args).unwrap()).map_err(|e| e.message);
        assert_eq!(files(&[]), Ok(None));
        let on = files(&["--tls-listen=:8443", "--tls-cert-file=/c", "--tls-key-file=/k"]).unwrap();
        assert_eq!(on.map(|f| (f.cert, f.key)), Some(("/c".into(), "/k".into())));
        assert!(
            files(&["--tls-listen=:8443", "--tls-cert-file=/c"])
                .unwrap_err()
                .contains("needs")
        );
        assert!(
            files(&["--tls-cert-file=/c", "--tls-key-file=/k"])
                .unwrap_err()
                .contains("set --tls-listen")
        );
    }
}
