//! Where an image download may go, checked as the download sees it: the URL parsed by the
//! parser the HTTP client uses (`reqwest::Url`), its host judged by name or literal address,
//! and every address a name resolves to judged inside the resolver the client connects with,
//! so nothing is checked on one answer and connected on another. Redirects go through the same
//! checks.
//!
//! ```text
//!  placement.image ─► Url::parse ─► UrlHosts::refusal(host)     (names, literals: at placement)
//!  client.get(url) ─► redirect policy ─► UrlHosts::refusal       (each hop)
//!                  └► GuardedResolver ─► Lookup ─► UrlHosts::address_refusal ─► connect
//! ```
//!
//! An IP literal is never handed to a resolver, which is why the host check comes first; and
//! the client ignores `HTTP(S)_PROXY` (a proxy would resolve the name instead of us).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use egress_netguard::{Guard, Internal};

/// Where the image URLs of one client may lead.
#[derive(Debug, Clone)]
pub enum UrlHosts {
    /// The operator's own catalogue (`images`): any host, but a redirect never to a link-local
    /// address or a cloud metadata service.
    Catalogue,
    /// The URLs Proxies give, with `imageUrlHosts` empty: none.
    Off,
    /// The URLs Proxies give, with `imageUrlHosts` listing these hosts: those only, whatever
    /// address they have (the operator's word).
    Listed(Vec<String>),
    /// The URLs Proxies give, with `imageUrlHosts` absent: any host that is not internal by its
    /// name, and resolves to no internal address (the shared list, `egress-netguard`).
    Public(Guard),
}

/// A download refused by these checks: a permanent failure, the URL being what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl UrlHosts {
    /// The hosts for the URLs Proxies give, from an entry's `imageUrlHosts`; `guard` judges
    /// what is internal when it is absent.
    pub fn for_proxies(image_url_hosts: Option<&[String]>, guard: Guard) -> Self {
        match image_url_hosts {
            None => Self::Public(guard),
            Some([]) => Self::Off,
            Some(list) => Self::Listed(list.to_vec()),
        }
    }

    /// Why a download will not go to `url`, judged on its scheme and host as written (a name,
    /// or an address in any spelling); `None` when it may (a name is judged again once
    /// resolved, [`UrlHosts::address_refusal`]).
    pub fn refusal(&self, url: &reqwest::Url) -> Option<String> {
        if !matches!(url.scheme(), "http" | "https") {
            return Some(format!("a {} URL, not http or https", url.scheme()));
        }
        let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
            return Some("a URL without a host".to_owned());
        };
        match self {
            Self::Off => Some("URL images are off for this entry (imageUrlHosts is empty)".to_owned()),
            Self::Listed(list) if !host_listed(list, host) => Some(format!("host {host} is not in imageUrlHosts")),
            Self::Listed(_) => None,
            Self::Catalogue => metadata(Guard::default().host(host)).map(|why| format!("host {host} is {why}")),
            Self::Public(guard) => guard.host(host).map(|why| {
                format!(
                    "host {host} is {}; list it in imageUrlHosts to fetch from it",
                    why.describe()
                )
            }),
        }
    }

    /// Why a download will not connect to `name` now that it resolved to `addresses`: one
    /// internal address is enough (a name need not be trusted to keep to its public ones).
    pub fn address_refusal(&self, name: &str, addresses: &[IpAddr]) -> Option<String> {
        let judge = |guard: &Guard, only_metadata: bool| {
            addresses.iter().find_map(|ip| {
                let why = guard.address(*ip);
                let why = if only_metadata {
                    metadata(why)
                } else {
                    why.map(Internal::describe)
                };
                why.map(|why| format!("host {name} resolves to {ip}, {why}"))
            })
        };
        match self {
            Self::Public(guard) => judge(guard, false),
            Self::Catalogue => judge(&Guard::default(), true),
            Self::Off | Self::Listed(_) => None,
        }
    }
}

/// What a catalogue download may not reach: a link-local address or a metadata service.
fn metadata(why: Option<Internal>) -> Option<&'static str> {
    why.filter(|w| matches!(w, Internal::LinkLocal | Internal::Metadata))
        .map(Internal::describe)
}

/// Whether URL host `host` is one of `list` (case-insensitive, a trailing dot ignored; IPv6
/// with or without brackets).
pub fn host_listed(list: &[String], host: &str) -> bool {
    let bare = |h: &str| {
        h.trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase()
    };
    let host = bare(host);
    list.iter().any(|l| bare(l) == host)
}

/// The future of one name's addresses.
pub type Addresses = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;

/// Name resolution for the downloads: the system's, or a test's.
pub trait Lookup: Send + Sync + std::fmt::Debug + 'static {
    /// The addresses `name` resolves to.
    fn lookup(&self, name: &str) -> Addresses;
}

/// The system's resolver (getaddrinfo, as reqwest's default resolver uses it).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, name: &str) -> Addresses {
        let name = name.to_owned();
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
            Ok(found.map(|a| a.ip()).collect())
        })
    }
}

/// The resolver the download client connects with: `lookup`'s answer, refused when one
/// address is one the hosts may not reach.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    pub hosts: Arc<UrlHosts>,
    pub lookup: Arc<dyn Lookup>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (hosts, lookup) = (self.hosts.clone(), self.lookup.clone());
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let addresses = lookup.lookup(&name).await?;
            if let Some(why) = hosts.address_refusal(&name, &addresses) {
                return Err(Box::new(Refused(why)) as Box<dyn std::error::Error + Send + Sync>);
            }
            // The port is the URL's: the connector sets it.
            let addrs: reqwest::dns::Addrs = Box::new(addresses.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).unwrap()
    }

    #[test]
    fn by_default_every_internal_spelling_and_name_is_refused() {
        let hosts = UrlHosts::for_proxies(None, Guard::default());
        for refused in [
            "http://169.254.169.254/x",
            "http://2852039166/x",
            "http://0xa9fea9fe/x",
            "http://169.254.169.254./x",
            "http://[::ffff:169.254.169.254]/x",
            "http://[64:ff9b::a9fe:a9fe]/x",
            "http://metadata.google.internal/x",
            "http://10.1.2.3/x",
            "http://192.168.0.7/x",
            "http://127.0.0.1:8080/x",
            "http://localhost/x",
            "http://mirror.default.svc/x",
            "http://mirror.ns.svc.cluster.local/x",
            "http://mirror/x",
            "ftp://mirror.example/x",
        ] {
            assert!(hosts.refusal(&url(refused)).is_some(), "{refused}");
        }
        assert_eq!(hosts.refusal(&url("https://mirror.example/x.qcow2")), None);
        assert_eq!(hosts.refusal(&url("http://93.184.215.14/x")), None);
        // The parser the client uses reads a backslash as a slash: the host is the address.
        assert!(
            hosts
                .refusal(&url("http://169.254.169.254\\@mirror.example/x"))
                .is_some()
        );
    }

    #[test]
    fn a_name_is_refused_for_any_internal_address_it_resolves_to() {
        let hosts = UrlHosts::for_proxies(None, Guard::default());
        let public: IpAddr = "93.184.215.14".parse().unwrap();
        let private: IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(hosts.address_refusal("mirror.example", &[public]), None);
        assert_eq!(
            hosts.address_refusal("mirror.example", &[public, private]).as_deref(),
            Some("host mirror.example resolves to 10.0.0.5, a private address")
        );
        // The catalogue's hosts only keep off metadata services; listed hosts are trusted.
        assert_eq!(UrlHosts::Catalogue.address_refusal("mirror.lan", &[private]), None);
        let metadata: IpAddr = "169.254.169.254".parse().unwrap();
        assert!(UrlHosts::Catalogue.address_refusal("x.example", &[metadata]).is_some());
        let listed = UrlHosts::for_proxies(Some(&["mirror.lan".to_owned()]), Guard::default());
        assert_eq!(listed.address_refusal("mirror.lan", &[private]), None);
    }

    #[test]
    fn listed_hosts_and_url_images_off() {
        let listed = UrlHosts::for_proxies(
            Some(&["Mirror.Example".to_owned(), "[fd00::5]".to_owned()]),
            Guard::default(),
        );
        assert_eq!(listed.refusal(&url("https://mirror.example./y")), None);
        assert_eq!(listed.refusal(&url("http://[fd00::5]:8080/y")), None);
        assert_eq!(
            listed.refusal(&url("http://169.254.169.254/x")).as_deref(),
            Some("host 169.254.169.254 is not in imageUrlHosts")
        );
        let off = UrlHosts::for_proxies(Some(&[]), Guard::default());
        assert!(off.refusal(&url("https://mirror.example/y")).is_some());
        // An allowlisted range (a development setup's) is let through.
        let dev = Guard::new(&[], &["127.0.0.0/8".to_owned()]).unwrap();
        assert_eq!(UrlHosts::Public(dev).refusal(&url("http://127.0.0.1:9/x")), None);
    }
}
