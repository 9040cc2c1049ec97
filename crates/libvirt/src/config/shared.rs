//! The check the `kvm` and `kvm2` entries share at load: entries whose hosts share a storage
//! pool must not give one base volume name to two images (review H4).

use egress_provider::config::go_quote;

use super::{KvmConfig, KvmHost, KvmImage};
use crate::generation::Generation;

/// One name an entry's image cache may give a base volume on one pool.
struct CacheName<'a> {
    /// The entry's index in the file, and its name.
    index: usize,
    entry: &'a str,
    /// The host it is reached as, and its daemon and pool.
    host: &'a KvmHost,
    pool: (String, String, String),
    /// A catalogue image's base name and image; or, for the images Proxies give by URL, the
    /// prefix and hex length of their base names.
    name: Named<'a>,
}

enum Named<'a> {
    Catalogue {
        key: &'a str,
        base: String,
        image: &'a KvmImage,
    },
    ByUrl {
        prefix: String,
        hex: usize,
    },
}

/// Whether `base` is a name the URL images of `prefix` and `hex` digits can take.
fn url_name_matches(prefix: &str, hex: usize, base: &str) -> bool {
    let Some(rest) = base.strip_prefix(prefix) else {
        return false;
    };
    let Some((digits, format)) = rest.split_once('.') else {
        return false;
    };
    digits.len() == hex && digits.bytes().all(|b| b.is_ascii_hexdigit()) && matches!(format, "qcow2" | "raw")
}

/// The check the `kvm` and `kvm2` types share at load ([`egress_provider::ProviderType::sharing`]):
/// two entries whose hosts share a storage pool must not give one base volume name to two
/// images, as the cache would serve one entry the other's image (H4). kvm names its bases by
/// key alone and kvm2 by entry and key, so `base-a-b-c.qcow2` is both kvm2 entry `a`'s key `b-c`
/// and entry `a-b`'s key `c`. The same image under one name is no conflict: its writers are
/// fenced from each other by the fill leases.
///
/// # Errors
/// The later entry of the first clash, with the message tail.
pub fn shared_pools(entries: &[(usize, &egress_provider::config::ProviderConfig)]) -> Result<(), (usize, String)> {
    let mut names: Vec<CacheName<'_>> = Vec::new();
    let blocks: Vec<(usize, &str, Generation, KvmConfig)> = entries
        .iter()
        .filter_map(|(i, e)| {
            let generation = match e.type_name.as_str() {
                "kvm" => Generation::Kvm,
                "kvm2" => Generation::Kvm2,
                _ => return None,
            };
            // A block that does not read was refused by its own rules already.
            let cfg = e.block::<KvmConfig>().ok().flatten()?;
            Some((*i, e.name.as_str(), generation, cfg))
        })
        .collect();
    for (index, entry, generation, cfg) in &blocks {
        for host in &cfg.hosts {
            let (address, socket) = host.daemon();
            let pool = (address, socket, host.effective_pool().to_owned());
            let url_names = match generation {
                Generation::Kvm => Named::ByUrl {
                    prefix: "base-".to_owned(),
                    hex: 16,
                },
                Generation::Kvm2 => Named::ByUrl {
                    prefix: format!("base-{entry}-url-"),
                    hex: 32,
                },
            };
            let catalogue = cfg.images.iter().map(|(key, image)| Named::Catalogue {
                key,
                base: generation.base_name(entry, key, image.effective_format()),
                image,
            });
            for name in catalogue.chain([url_names]) {
                names.push(CacheName {
                    index: *index,
                    entry,
                    host,
                    pool: pool.clone(),
                    name,
                });
            }
        }
    }
    for ours in &names {
        let Named::Catalogue { key, base, image } = &ours.name else {
            continue;
        };
        for theirs in &names {
            if theirs.index == ours.index || theirs.pool != ours.pool {
                continue;
            }
            let (clash, what) = match &theirs.name {
                // Each pair of catalogue images is looked at once.
                Named::Catalogue {
                    key: k,
                    base: b,
                    image: i,
                } => (
                    theirs.index < ours.index && b == base && (i.url != image.url || i.sha256 != image.sha256),
                    format!("image {} (another URL or digest)", go_quote(k)),
                ),
                Named::ByUrl { prefix, hex } => (
                    url_name_matches(prefix, *hex, base),
                    "an image its Proxies give by URL".to_owned(),
                ),
            };
            if !clash {
                continue;
            }
            let (address, socket, pool) = &ours.pool;
            return Err((
                ours.index.max(theirs.index),
                format!(
                    "base volume {} in pool {} of {} ({socket}) would hold both image {} of providers[{}] {} \
                     (host {}) and {what} of providers[{}] {}; rename the key or one of the entries",
                    go_quote(base),
                    go_quote(pool),
                    go_quote(address),
                    go_quote(key),
                    ours.index,
                    go_quote(ours.entry),
                    go_quote(&ours.host.name),
                    theirs.index,
                    go_quote(theirs.entry),
                ),
            ));
        }
    }
    Ok(())
}
