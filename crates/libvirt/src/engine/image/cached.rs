//! What the cache holds for an image on a host, read without changing anything: a complete base
//! (its marker present and, where one is configured, holding the configured digest), or nothing
//! usable.

use egress_provider::{OpCtx, redact};

use crate::engine::Generation;
use crate::engine::failure::{Context as _, OpFailure};
use crate::engine::placement::Image;
use crate::host::{Host, code};
use crate::names;

/// How much of a marker is read (a digest is 64 bytes).
const MARKER_READ_MAX: usize = 1024;

/// One image on one host's pool.
#[derive(Clone, Debug)]
pub struct Cached<'a> {
    /// Whose cache (names, spans).
    pub generation: Generation,
    /// The host's configured name.
    pub host: &'a str,
    /// The pool.
    pub pool: &'a str,
    /// The image.
    pub image: &'a Image,
    /// The base volume's name.
    pub base: String,
    /// The marker volume's name.
    pub marker: String,
    /// What the create still needs on the pool beside the image (overlay and seed), so the
    /// download's own length is checked against the whole (review M11).
    pub room_after: u64,
    /// Who fills the base, as its fill leases name it: one id per provider instance.
    pub writer: &'a str,
}

impl<'a> Cached<'a> {
    /// `image` of entry `entry` in `pool` on `host`, filled (when it must be) by `writer`.
    pub fn new(
        generation: Generation,
        entry: &str,
        host: &'a str,
        pool: &'a str,
        image: &'a Image,
        writer: &'a str,
    ) -> Self {
        let base = generation.base_name(entry, &image.key, &image.format);
        let marker = names::marker(&base);
        Self {
            generation,
            host,
            pool,
            image,
            base,
            marker,
            room_after: 0,
            writer,
        }
    }

    /// The URL as messages and logs show it (credentials removed).
    pub(super) fn url(&self) -> String {
        redact(&self.image.url)
    }
}

/// What the cache holds for an image on a host.
#[derive(Debug)]
pub(super) enum Found {
    /// The base, complete: its path.
    Complete(String),
    /// Nothing usable: no marker (a download that died, or one under way), a marker that holds
    /// no digest, or a marker whose base is gone. What is there is cleared under a fill lease,
    /// never here.
    Incomplete,
}

/// What the cache holds for `img`; reads only.
pub(super) async fn cached(cx: &OpCtx, host: &dyn Host, img: &Cached<'_>) -> Result<Found, OpFailure> {
    match host.volume_path(cx, img.pool, &img.marker).await {
        Ok(_) => {}
        Err(e) if e.is(code::NO_STORAGE_VOL) => return Ok(Found::Incomplete),
        Err(e) => return Err(OpFailure::call(format!("looking up marker {}", img.marker), e)),
    }
    if img.generation == Generation::Kvm {
        return cached_kvm(cx, host, img).await;
    }
    let raw = host
        .download(cx, img.pool, &img.marker, MARKER_READ_MAX)
        .await
        .doing(|| format!("reading marker {}", img.marker))?;
    let Some(digest) = marker_digest(&raw) else {
        tracing::debug!(volume = %img.marker, "base image marker holds no digest; refetching");
        return Ok(Found::Incomplete);
    };
    if let Some(want) = &img.image.sha256
        && *want != digest
    {
        return Err(digest_refused(img, &digest, want));
    }
    base_under_marker(cx, host, img).await
}

/// A cached base whose marker holds `held` (as the message shows it) where `want` is configured:
/// refused, never fetched over (overlays may use the base).
fn digest_refused(img: &Cached<'_>, held: &str, want: &str) -> OpFailure {
    let message = format!(
        "base image {} is cached with sha256 {held} but {want} is configured; add the image under a new \
         key and move Proxies to it, or delete the Proxies using it and evict the base by hand",
        img.base
    );
    // Normal-level: an operator must act, and nothing will change by itself.
    tracing::info!(volume = %img.base, "{message}");
    OpFailure::permanent(message)
}

/// The base under a marker that is trusted: incomplete when the base itself is gone (the
/// marker is removed before the fetch).
async fn base_under_marker(cx: &OpCtx, host: &dyn Host, img: &Cached<'_>) -> Result<Found, OpFailure> {
    match host.volume_path(cx, img.pool, &img.base).await {
        Ok(path) => Ok(Found::Complete(path)),
        Err(e) if e.is(code::NO_STORAGE_VOL) => Ok(Found::Incomplete),
        Err(e) => Err(OpFailure::call(format!("looking up base volume {}", img.base), e)),
    }
}

/// The first generation's trust in a marker (spec/kvm.md §6.2): its presence completes the base;
/// its content is read only against a configured `sha256` (its first word, trimmed, any case:
/// `sha256sum` output is accepted), and a mismatch is refused, never fetched over the base that
/// the Go operator's overlays may use. A marker with no word at all was created and never
/// written (its writer died between the two calls): the base is incomplete.
async fn cached_kvm(cx: &OpCtx, host: &dyn Host, img: &Cached<'_>) -> Result<Found, OpFailure> {
    if let Some(want) = &img.image.sha256 {
        let raw = host
            .download(cx, img.pool, &img.marker, MARKER_READ_MAX)
            .await
            .doing(|| format!("reading marker {}", img.marker))?;
        let text = String::from_utf8_lossy(&raw);
        let held = text
            .split(|c: char| c.is_whitespace() || c == '\0')
            .find(|w| !w.is_empty())
            .unwrap_or_default()
            .to_ascii_lowercase();
        if held.is_empty() {
            tracing::debug!(volume = %img.marker, "base image marker is empty; refetching");
            return Ok(Found::Incomplete);
        }
        if held != *want {
            return Err(digest_refused(img, &format!("{held:?}"), want));
        }
    }
    base_under_marker(cx, host, img).await
}

/// The digest a marker holds: trailing NUL, space, CR, LF and TAB stripped, lowercased, and
/// exactly 64 hex digits; `None` otherwise.
pub fn marker_digest(raw: &[u8]) -> Option<String> {
    let end = raw
        .iter()
        .rposition(|b| !matches!(b, 0 | b' ' | b'\r' | b'\n' | b'\t'))
        .map_or(0, |i| i + 1);
    let text = std::str::from_utf8(&raw[..end]).ok()?.to_ascii_lowercase();
    (text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_holds_a_digest_or_nothing() {
        let d = "AB".repeat(32);
        assert_eq!(marker_digest(d.as_bytes()), Some("ab".repeat(32)));
        assert_eq!(
            marker_digest(format!("{d}\n\0\0 \t\r").as_bytes()),
            Some("ab".repeat(32))
        );
        for bad in ["", "ab", &"zz".repeat(32), &format!(" {d}"), &format!("{d}00")] {
            assert_eq!(marker_digest(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(marker_digest(&[0xff; 64]), None);
    }
}
