//! The base-image cache (spec/kvm.md §6.1, §6.3-6.6): each image is downloaded once per host and
//! entry, streamed from HTTP through a SHA-256 into a libvirt upload on a connection of its own,
//! and completed by a marker volume holding its digest, written last. A base without its marker
//! is incomplete and is fetched again; a marker whose digest differs from the configured one is
//! refused, never replaced under the overlays that use the base (H4).
//!
//! Whoever clears what is left of an incomplete base or fills it holds a fill lease on the pool
//! first ([`super::fence`]), so no writer of this operator, in any entry or replica, deletes a
//! base another one is filling (H4; docs/providers/kvm2.md, "The image cache's fence").
//!
//! Long file: the base-image cache is one protocol (lock, lease, download, verify, upload,
//! marker last) whose steps depend on each other's guarantees.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::host::{Host, LibvirtError, code};
use crate::{VolumeSpec, transfer_budget};
use bytes::Bytes;
use egress_provider::{OpCtx, redact};
use futures::StreamExt as _;
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use tracing::Instrument as _;
use tracing::field::Empty;

use super::failure::{Context as _, OpFailure};
use super::fence::{self, Lease};
use super::locks::KeyedLocks;
use super::placement::Image;
use super::url_host::{host_listed, is_metadata_host};
use crate::generation::Generation;
use crate::names;

/// The precheck's HEAD (or GET) budget, and the download's until its headers arrive.
pub const PROBE_BUDGET: Duration = Duration::from_secs(30);
/// How far inside the transfer budget ([`transfer_budget`] of the image's size, from the
/// headers to the marker) the HTTP body's own deadline falls: a mirror that stops sending
/// fails the body read first, and the upload ends as a clean, short stream.
pub const BODY_MARGIN: Duration = Duration::from_secs(60);
/// Cleaning up a failed base: bounded, and not cut short by the caller.
pub const DISCARD_BUDGET: Duration = Duration::from_secs(30);
/// The largest image the operator accepts (review M11): far above any cloud image, far below
/// what a lying `Content-Length` could claim.
pub const MAX_IMAGE_BYTES: u64 = 64 << 30;
/// How much of a marker is read (a digest is 64 bytes).
const MARKER_READ_MAX: usize = 1024;
/// Chunks in flight between the HTTP body and the upload.
const CHUNKS_IN_FLIGHT: usize = 4;

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
    fn url(&self) -> String {
        redact(&self.image.url)
    }
}

/// The HTTP client of the image downloads: no overall timeout (each request carries its own),
/// identity encoding (a decompressed body would hide `Content-Length`), and redirects that stay
/// on http(s), never downgrade from https and never lead to a link-local or cloud metadata address (a cloud
/// metadata service). With `allowed` (an entry's `imageUrlHosts`, for the URLs Proxies give),
/// a redirect must also stay on a listed host.
///
/// # Errors
/// The client cannot be built (no TLS roots, say).
pub fn http_client(allowed: Option<Vec<String>>) -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a default crypto provider; ring is the workspace's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            let refused = redirect_refusal(attempt.previous().last(), attempt.url(), allowed.as_deref());
            match refused {
                Some(why) => attempt.error(why),
                None if attempt.previous().len() >= 10 => attempt.error("more than 10 redirects"),
                None => attempt.follow(),
            }
        }))
        .build()
}

/// Why a redirect from `from` to `to` is refused, if it is (`allowed`: the hosts it may lead to).
fn redirect_refusal(from: Option<&reqwest::Url>, to: &reqwest::Url, allowed: Option<&[String]>) -> Option<String> {
    if !matches!(to.scheme(), "http" | "https") {
        return Some(format!("redirect to a {} URL refused", to.scheme()));
    }
    if from.is_some_and(|f| f.scheme() == "https") && to.scheme() == "http" {
        return Some("redirect from https to http refused".to_owned());
    }
    let host = to.host_str().unwrap_or_default();
    match allowed {
        Some(list) if !host_listed(list, host) => {
            Some(format!("redirect to {host}, a host not in imageUrlHosts, refused"))
        }
        Some(_) => None,
        None if is_metadata_host(host) => Some("redirect to a link-local or cloud metadata address refused".to_owned()),
        None => None,
    }
}

/// What the pool-space checks keep free: a twentieth of the pool (a filesystem's usual root
/// reserve, which libvirt counts as available but QEMU cannot write to).
pub fn pool_headroom(capacity: u64) -> u64 {
    capacity / 20
}

/// The verdict on an image response (§6.4): its length, or why it cannot be used.
///
/// # Errors
/// 429 and 5xx Transient; other 4xx Permanent; anything else that is not 2xx Transient; a 2xx
/// without a usable `Content-Length` Permanent.
pub fn check_response(url: &str, status: StatusCode, length: Option<u64>) -> Result<u64, OpFailure> {
    let shown = status_text(status);
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return Err(OpFailure::transient(format!("image {url}: HTTP {shown}")));
    }
    if status.is_client_error() {
        return Err(OpFailure::permanent(format!("image {url}: HTTP {shown}")));
    }
    if !status.is_success() {
        return Err(OpFailure::transient(format!("image {url}: unexpected HTTP {shown}")));
    }
    match length {
        None => Err(OpFailure::permanent(format!(
            "image {url}: response has no Content-Length; the volume capacity must be known before upload"
        ))),
        Some(0) => Err(OpFailure::permanent(format!(
            "image {url}: response is empty (Content-Length 0)"
        ))),
        Some(n) => Ok(n),
    }
}

/// The `Content-Length` a response declares. Read from the header: for a HEAD response the
/// body's own length is 0 whatever the header says.
fn declared_length(response: &reqwest::Response) -> Option<u64> {
    response
        .headers()
        .get(reqwest::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `404 Not Found`: the code and its reason phrase.
fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// A transport failure of an image request. A redirect the policy refused is Permanent: the
/// mirror sends the operator where it will not go, and asking again changes nothing.
fn fetch_error(url: &str, e: &reqwest::Error) -> OpFailure {
    let message = format!("fetching image {url}: {}", http_error_text(e));
    if e.is_redirect() {
        OpFailure::permanent(message)
    } else {
        OpFailure::transient(message)
    }
}

/// reqwest's error with its causes (connection refused, a certificate...), the URL left out:
/// messages show it once, without credentials.
fn http_error_text(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(u) = e.url() {
        text = text.replace(u.as_str(), "<url>");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    redact(&text)
}

/// The format of an image given by URL (review L7): the one its cached base has on the host,
/// else what its first bytes say (qcow2's magic `QFI\xfb`, anything else raw), read with a
/// ranged GET whose body is dropped after four bytes.
///
/// # Errors
/// A base lookup's error; the response's verdict; a request that took over 30 s.
pub async fn url_format(
    cx: &OpCtx,
    host: &dyn Host,
    http: &reqwest::Client,
    generation: Generation,
    entry: &str,
    pool: &str,
    image: &Image,
) -> Result<String, OpFailure> {
    for format in ["qcow2", "raw"] {
        let marker = names::marker(&generation.base_name(entry, &image.key, format));
        match host.volume_path(cx, pool, &marker).await {
            Ok(_) => return Ok(format.to_owned()),
            Err(e) if e.is(code::NO_STORAGE_VOL) => {}
            Err(e) if e.is(code::NO_STORAGE_POOL) => {
                return Err(OpFailure::call(format!("looking up storage pool {pool}"), e));
            }
            Err(e) => return Err(OpFailure::call(format!("looking up marker {marker}"), e)),
        }
    }
    let url = redact(&image.url);
    let first_bytes = async {
        let response = http
            .get(&image.url)
            .header(reqwest::header::ACCEPT_ENCODING, "identity")
            .header(reqwest::header::RANGE, "bytes=0-3")
            .timeout(PROBE_BUDGET)
            .send()
            .await
            .map_err(|e| fetch_error(&url, &e))?;
        // A server that ignores the range answers 200 with the whole image: only its start is read.
        check_response(&url, response.status(), Some(1))?;
        let mut body = response.bytes_stream();
        let mut head = Vec::new();
        while head.len() < 4 {
            match body.next().await {
                Some(Ok(chunk)) => head.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(fetch_error(&url, &e)),
                None => break,
            }
        }
        Ok(head)
    };
    let head = cx
        .run_within(PROBE_BUDGET, first_bytes)
        .await
        .map_err(|why| OpFailure::transient(format!("reading the first bytes of {url}: {why}")))??;
    Ok(if head.starts_with(b"QFI\xfb") { "qcow2" } else { "raw" }.to_owned())
}

/// How many bytes the image still needs on the pool: 0 when its marker is there (taken at face
/// value here), else the size the server announces. HEAD first; when HEAD gives no usable
/// length (mirrors refuse HEAD, or answer it without a length), a GET whose body is dropped
/// unread decides (review M9).
///
/// # Errors
/// The marker lookup's error; the response's verdict; a request that took over 30 s.
pub async fn size_if_uncached(
    cx: &OpCtx,
    host: &dyn Host,
    http: &reqwest::Client,
    img: &Cached<'_>,
) -> Result<u64, OpFailure> {
    match host.volume_path(cx, img.pool, &img.marker).await {
        Ok(_) => return Ok(0),
        Err(e) if e.is(code::NO_STORAGE_VOL) => {}
        Err(e) if e.is(code::NO_STORAGE_POOL) => {
            return Err(OpFailure::call(format!("looking up storage pool {}", img.pool), e));
        }
        Err(e) => return Err(OpFailure::call(format!("looking up marker {}", img.marker), e)),
    }
    let url = img.url();
    let ask = |method: reqwest::Method| async {
        let response = http
            .request(method, &img.image.url)
            .header(reqwest::header::ACCEPT_ENCODING, "identity")
            .timeout(PROBE_BUDGET)
            .send()
            .await
            .map_err(|e| fetch_error(&url, &e))?;
        // Dropped unread: only the headers count.
        Ok::<_, OpFailure>((response.status(), declared_length(&response)))
    };
    let within = |fut| async {
        cx.run_within(PROBE_BUDGET, fut)
            .await
            .map_err(|why| OpFailure::transient(format!("asking {url} for the image size: {why}")))?
    };
    let (status, length) = within(ask(reqwest::Method::HEAD)).await?;
    if status.is_success() && length.is_some_and(|n| n > 0) {
        return Ok(length.unwrap_or_default());
    }
    let (status, length) = within(ask(reqwest::Method::GET)).await?;
    check_response(&url, status, length)
}

/// The path of the image's base volume on the host, downloading it first when it is not
/// cached. Callers for one image on one host take turns: the first downloads, the others find
/// the marker.
///
/// # Errors
/// Waiting for the image past the caller; the cache's refusals; another writer filling the
/// base (Transient); the download's failures.
pub async fn ensure(
    cx: &OpCtx,
    host: &dyn Host,
    http: &reqwest::Client,
    locks: &KeyedLocks,
    img: &Cached<'_>,
) -> Result<String, OpFailure> {
    let key = format!("{}/{}", img.host, img.base);
    let _held = locks
        .acquire(cx, &key)
        .await
        .map_err(|why| OpFailure::transient(format!("waiting for image {} on host {}: {why}", img.base, img.host)))?;
    if let Found::Complete(path) = cached(cx, host, img).await? {
        return Ok(path);
    }
    let span = if !img.generation.spans() {
        tracing::Span::none()
    } else {
        tracing::info_span!(
            "kvm2.download",
            otel.kind = "client",
            kvm2.host = %img.host,
            kvm2.volume = %img.base,
            kvm2.url_host = %url_host(&img.image.url),
            kvm2.sha256_configured = img.image.sha256.is_some(),
            kvm2.bytes = Empty,
            otel.status_code = Empty,
            otel.status_description = Empty,
        )
    };
    // What this fetch made (a lease, a base): only that is removed afterwards. Shared, as the
    // fetch may be dropped at its budget.
    let fill = Arc::new(Fill::default());
    let fetched = fetch(cx, host, http, img, &fill).instrument(span.clone()).await;
    match &fetched {
        Ok(_) => span.record("otel.status_code", "ok"),
        Err(e) => span
            .record("otel.status_code", "error")
            .record("otel.status_description", e.to_string()),
    };
    fill.clean_up(host, img, fetched.is_err()).await;
    match fetched? {
        Some(path) => Ok(path),
        None => host
            .volume_path(cx, img.pool, &img.base)
            .await
            .doing(|| format!("reading the path of base volume {}", img.base)),
    }
}

/// What one fetch made on the pool, so that it (and nothing else) is removed afterwards.
#[derive(Debug, Default)]
struct Fill {
    /// The fetch created the base volume.
    made_base: AtomicBool,
    /// The fill lease it holds.
    lease: Mutex<Option<String>>,
}

impl Fill {
    /// Removes the lease, and after a failure the base first: not cut short by the caller, as a
    /// half-written base must not be left when it can be removed; bounded all the same. What
    /// cannot be removed stays fenced by the lease until its deadline, or until this writer
    /// comes back to the base.
    async fn clean_up(&self, host: &dyn Host, img: &Cached<'_>, failed: bool) {
        let cleanup = OpCtx::background().with_timeout(DISCARD_BUDGET);
        if failed
            && self.made_base.load(Ordering::SeqCst)
            && let Err(d) = discard_patiently(&cleanup, host, img.pool, &img.base).await
        {
            tracing::debug!(volume = %img.base, error = %d, "incomplete base volume left behind; the next attempt removes it");
        }
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(lease) = lease
            && let Err(d) = discard_patiently(&cleanup, host, img.pool, &lease).await
        {
            tracing::debug!(volume = %lease, error = %d, "fill lease left behind; it is removed once it is seen again");
        }
    }
}

/// The URL's host part only (span attributes carry nothing more).
fn url_host(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_default()
}

/// What the cache holds for an image on a host.
#[derive(Debug)]
enum Found {
    /// The base, complete: its path.
    Complete(String),
    /// Nothing usable: no marker (a download that died, or one under way), a marker that holds
    /// no digest, or a marker whose base is gone. What is there is cleared under a fill lease,
    /// never here.
    Incomplete,
}

/// What the cache holds for `img`; reads only.
async fn cached(cx: &OpCtx, host: &dyn Host, img: &Cached<'_>) -> Result<Found, OpFailure> {
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

/// Deletes `volume`; one already gone is fine.
async fn discard(cx: &OpCtx, host: &dyn Host, pool: &str, volume: &str) -> Result<(), LibvirtError> {
    match host.delete_volume(cx, pool, volume).await {
        Err(e) if !e.is(code::NO_STORAGE_VOL) => Err(e),
        _ => Ok(()),
    }
}

/// [`discard`], tried again over a new connection while the connection is what fails (a
/// libvirtd restart takes a second or so, and an upload it cut short is cleaned up once the
/// daemon is back), until `cx` ends. An answer of the daemon is final.
async fn discard_patiently(cx: &OpCtx, host: &dyn Host, pool: &str, volume: &str) -> Result<(), LibvirtError> {
    let mut pause = Duration::from_millis(100);
    loop {
        match discard(cx, host, pool, volume).await {
            Err(e) if e.transport && cx.interrupted().is_none() => {
                tracing::debug!(volume = %volume, error = %e, retry_in = ?pause, "removing a volume failed on the connection; trying again");
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    _ = cx.done() => return Err(e),
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

/// A task aborted when its handle goes, also when the future holding it is dropped (a transfer
/// that ran out of its budget).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the upload's source saw: bytes handed out, their digest, and the body's first error.
#[derive(Default)]
struct Tally {
    read: u64,
    hasher: Sha256,
    error: Option<String>,
}

/// The HTTP body as the upload reads it (on a blocking thread): chunks arrive over a bounded
/// channel, so at most a few chunks are ever held. Counting and hashing happen here, on what
/// was actually handed to libvirt.
struct BodyReader {
    chunks: tokio::sync::mpsc::Receiver<Result<Bytes, String>>,
    current: Bytes,
    tally: Arc<Mutex<Tally>>,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.current.is_empty() {
                let n = buf.len().min(self.current.len());
                let chunk = self.current.split_to(n);
                buf[..n].copy_from_slice(&chunk);
                let mut tally = self.tally.lock().unwrap_or_else(|p| p.into_inner());
                tally.read += n as u64;
                tally.hasher.update(&chunk);
                return Ok(n);
            }
            match self.chunks.blocking_recv() {
                None => return Ok(0),
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => {
                    let mut tally = self.tally.lock().unwrap_or_else(|p| p.into_inner());
                    tally.error.get_or_insert_with(|| e.clone());
                    return Err(std::io::Error::other(e));
                }
            }
        }
    }
}

/// Asks for the image and, within the transfer budget of the size it announces, fills the
/// base ([`fill_base`]). `Some` path when another writer completed the base meanwhile.
async fn fetch(
    cx: &OpCtx,
    host: &dyn Host,
    http: &reqwest::Client,
    img: &Cached<'_>,
    fill: &Fill,
) -> Result<Option<String>, OpFailure> {
    let url = img.url();
    let request = http
        .get(&img.image.url)
        .header(reqwest::header::ACCEPT_ENCODING, "identity")
        .send();
    let response = cx
        .run_within(PROBE_BUDGET, request)
        .await
        .map_err(|why| OpFailure::transient(format!("fetching image {url}: no response: {why}")))?
        .map_err(|e| fetch_error(&url, &e))?;
    let size = check_response(&url, response.status(), declared_length(&response))?;
    tracing::Span::current().record("kvm2.bytes", size);
    tracing::debug!(url = %url, bytes = size, "fetching base image into host pool");
    // The GET's length is what gets written: check it now (review M11).
    if size > MAX_IMAGE_BYTES {
        return Err(OpFailure::permanent(format!(
            "image {url} is {size} bytes, over the {MAX_IMAGE_BYTES}-byte limit"
        )));
    }
    let budget = transfer_budget(size);
    let body_deadline = tokio::time::Instant::now() + budget.saturating_sub(BODY_MARGIN);
    // By then this writer has given up and cleaned up, whatever happened.
    let lease_deadline = fence::unix_seconds(SystemTime::now() + budget + DISCARD_BUDGET);
    let job = Job {
        response,
        size,
        body_deadline,
        lease_deadline,
    };
    cx.run_within(budget, fill_base(cx, host, img, fill, job))
        .await
        .unwrap_or_else(|why| {
            Err(OpFailure::transient(format!(
                "fetching image {url} into {}: {why}",
                img.base
            )))
        })
}

/// A download under way: the response whose body is the image, and its deadlines.
struct Job {
    response: reqwest::Response,
    size: u64,
    /// When the body must have arrived.
    body_deadline: tokio::time::Instant,
    /// The fill lease's deadline (Unix seconds).
    lease_deadline: u64,
}

/// Checks the pool's room, takes the fill lease, clears what is left of the base and fills it:
/// the upload, the pool refresh and the marker all on a connection of its own (a cancelled call
/// on the shared connection cannot cut the transfer off, nor lose a verified download: review
/// M10). `Some` path when another writer completed the base before the lease was taken.
async fn fill_base(
    cx: &OpCtx,
    host: &dyn Host,
    img: &Cached<'_>,
    fill: &Fill,
    job: Job,
) -> Result<Option<String>, OpFailure> {
    let started = Instant::now();
    let size = job.size;
    let info = host
        .pool_info(cx, img.pool)
        .await
        .doing(|| format!("reading storage pool {}", img.pool))?;
    let needed = size.saturating_add(img.room_after);
    let usable = info.available.saturating_sub(pool_headroom(info.capacity));
    if usable < needed {
        return Err(OpFailure::quota(format!(
            "storage pool {} has {} bytes available ({usable} once 5% of the pool is kept free), {needed} needed \
             for image {} ({size} bytes) and the volumes made from it",
            img.pool, info.available, img.base
        )));
    }
    take_lease(cx, host, img, job.lease_deadline, fill).await?;
    // Another writer may have completed the base between the first look and the lease.
    if let Found::Complete(path) = cached(cx, host, img).await? {
        return Ok(Some(path));
    }
    // What is left of an earlier fill: the marker first, then the base (the eviction order).
    discard(cx, host, img.pool, &img.marker)
        .await
        .map_err(|e| OpFailure::call(format!("removing the marker {} of an incomplete base", img.marker), e))?;
    discard(cx, host, img.pool, &img.base)
        .await
        .map_err(|e| OpFailure::call(format!("removing incomplete base volume {}", img.base), e))?;
    let own = host
        .dedicated(cx)
        .await
        .doing(|| format!("dialling host {} for the image upload", img.host))?;
    let outcome = upload(cx, own.as_ref(), job, img, &fill.made_base).await;
    let outcome = match outcome {
        Ok(digest) => write_marker(cx, own.as_ref(), img, &digest).await.map(|()| digest),
        Err(e) => Err(e),
    };
    // Closed before anything else, so libvirt has let go of the upload's file when a failed
    // base is removed (by the caller).
    own.close().await;
    let digest = outcome?;
    tracing::debug!(volume = %img.base, bytes = size, duration = ?started.elapsed(), sha256 = %digest, "base image cached");
    Ok(None)
}

/// The fill leases on `img`'s base.
async fn leases(cx: &OpCtx, host: &dyn Host, img: &Cached<'_>) -> Result<Vec<Lease>, OpFailure> {
    let names = host
        .volume_names(cx, img.pool)
        .await
        .doing(|| format!("listing storage pool {} for fill leases", img.pool))?;
    Ok(fence::leases_among(&img.base, &names))
}

/// Takes the fill lease on `img`'s base until `deadline`, after removing the leases of writers
/// that are gone. Two writers that take theirs at the same moment both see the other's
/// afterwards and both give way; one that comes later sees the first.
///
/// # Errors
/// Another writer's live lease (Transient: it is filling the base, or was until lately).
async fn take_lease(
    cx: &OpCtx,
    host: &dyn Host,
    img: &Cached<'_>,
    deadline: u64,
    fill: &Fill,
) -> Result<(), OpFailure> {
    let now = || fence::unix_seconds(SystemTime::now());
    let verdict = fence::judge(leases(cx, host, img).await?, img.writer, now());
    for dead in &verdict.dead {
        discard(cx, host, img.pool, &dead.volume).await.map_err(|e| {
            OpFailure::call(
                format!("removing fill lease {} of a writer that is gone", dead.volume),
                e,
            )
        })?;
    }
    if let Some(other) = verdict.live.first() {
        return Err(filled_elsewhere(img, other));
    }
    let name = fence::lease_name(&img.base, deadline, img.writer);
    let xml = VolumeSpec {
        name: name.clone(),
        capacity_bytes: 1,
        format: "raw".to_owned(),
        backing: None,
    }
    .to_xml(img.generation)
    .map_err(|e| OpFailure::permanent(e.to_string()))?;
    host.create_volume(cx, img.pool, &xml)
        .await
        .doing(|| format!("creating fill lease {name}"))?;
    *fill.lease.lock().unwrap_or_else(|p| p.into_inner()) = Some(name);
    // Its own lease reads as dead to the writer: only the others' count here.
    let verdict = fence::judge(leases(cx, host, img).await?, img.writer, now());
    match verdict.live.first() {
        Some(other) => Err(filled_elsewhere(img, other)),
        None => Ok(()),
    }
}

/// Another writer holds a live lease on the base.
fn filled_elsewhere(img: &Cached<'_>, other: &Lease) -> OpFailure {
    OpFailure::transient(format!(
        "base image {} is being filled by another writer (fill lease {} runs to Unix time {}); trying again later",
        img.base, other.volume, other.deadline
    ))
}

/// Hands the body's chunks to the upload until it ends, fails or misses `deadline` (spec H2: a
/// minute inside the transfer budget, so that a body that stops arriving leaves the fill time
/// to clean up); a failure is the last thing sent.
async fn forward_body(
    mut body: impl futures::Stream<Item = Result<Bytes, String>> + Unpin,
    deadline: tokio::time::Instant,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, String>>,
) {
    loop {
        let chunk = match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(None) => break,
            Ok(Some(chunk)) => chunk,
            Err(_) => Err("the body did not arrive within its deadline".to_owned()),
        };
        let failed = chunk.is_err();
        if tx.send(chunk).await.is_err() || failed {
            break;
        }
    }
}

/// Creates the base volume and streams the body into it; the digest of what was uploaded.
async fn upload(
    cx: &OpCtx,
    own: &dyn Host,
    job: Job,
    img: &Cached<'_>,
    made: &AtomicBool,
) -> Result<String, OpFailure> {
    let url = img.url();
    let Job {
        response,
        size,
        body_deadline,
        ..
    } = job;
    let xml = VolumeSpec {
        name: img.base.clone(),
        capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        format: img.image.format.clone(),
        backing: None,
    }
    .to_xml(img.generation)
    .map_err(|e| OpFailure::permanent(e.to_string()))?;
    own.create_volume(cx, img.pool, &xml)
        .await
        .doing(|| format!("creating base volume {}", img.base))?;
    made.store(true, Ordering::SeqCst);
    let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
    let body = response
        .bytes_stream()
        .map(|chunk| chunk.map_err(|e| http_error_text(&e)));
    let pump = AbortOnDrop(tokio::spawn(forward_body(body, body_deadline, tx)));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let reader = BodyReader {
        chunks: rx,
        current: Bytes::new(),
        tally: tally.clone(),
    };
    let uploaded = own.upload(cx, img.pool, &img.base, size, Box::new(reader)).await;
    // The body is not needed any more, whatever happened.
    drop(pump);
    let tally = std::mem::take(&mut *tally.lock().unwrap_or_else(|p| p.into_inner()));
    if let Some(e) = tally.error {
        return Err(OpFailure::transient(format!(
            "image {url}: the response ended after {} of {size} bytes: {}",
            tally.read,
            redact(&e)
        )));
    }
    uploaded.doing(|| format!("uploading base volume {}", img.base))?;
    if tally.read != size {
        return Err(OpFailure::transient(format!(
            "image {url}: short read, {} of {size} bytes",
            tally.read
        )));
    }
    let digest: String = tally.hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if let Some(want) = &img.image.sha256
        && *want != digest
    {
        return Err(OpFailure::permanent(format!(
            "image {url}: sha256 {digest} does not match the configured {want}"
        )));
    }
    Ok(digest)
}

/// How often, and how far apart, a refresh refused because of another upload is tried again.
const REFRESH_TRIES: u32 = 10;
const REFRESH_PAUSE: Duration = Duration::from_secs(1);

/// Refreshes the pool after an upload. libvirt refuses a refresh while any upload into the pool
/// runs (error 1, "pool has asynchronous jobs running"), such as another create's seed: that is
/// tried again for a few seconds rather than throwing away a verified download.
async fn refresh_after_upload(cx: &OpCtx, own: &dyn Host, pool: &str) -> Result<(), OpFailure> {
    let mut tries = 0;
    loop {
        match own.refresh_pool(cx, pool).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is(code::INTERNAL_ERROR) && tries + 1 < REFRESH_TRIES => {
                tries += 1;
                tracing::debug!(pool, error = %e, "pool refresh refused; trying again");
                cx.run(tokio::time::sleep(REFRESH_PAUSE)).await.map_err(|why| {
                    OpFailure::transient(format!("refreshing storage pool {pool} after the upload: {why}"))
                })?;
            }
            Err(e) => {
                return Err(OpFailure::call(
                    format!("refreshing storage pool {pool} after the upload"),
                    e,
                ));
            }
        }
    }
}

/// Refreshes the pool (libvirt re-reads the uploaded image's real format and size), then
/// writes the marker that completes the base.
async fn write_marker(cx: &OpCtx, own: &dyn Host, img: &Cached<'_>, digest: &str) -> Result<(), OpFailure> {
    refresh_after_upload(cx, own, img.pool).await?;
    let xml = VolumeSpec {
        name: img.marker.clone(),
        capacity_bytes: 64,
        format: "raw".to_owned(),
        backing: None,
    }
    .to_xml(img.generation)
    .map_err(|e| OpFailure::permanent(e.to_string()))?;
    own.create_volume(cx, img.pool, &xml)
        .await
        .doing(|| format!("creating marker {}", img.marker))?;
    let bytes = digest.as_bytes().to_vec();
    if let Err(e) = own
        .upload(cx, img.pool, &img.marker, 64, Box::new(std::io::Cursor::new(bytes)))
        .await
    {
        let _ = discard(cx, own, img.pool, &img.marker).await;
        return Err(OpFailure::call(format!("writing marker {}", img.marker), e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spec H2: a body that stops arriving fails at its own deadline, a minute before the
    /// transfer budget that bounds the whole fill (virtual time: the clock is paused).
    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_fails_at_its_deadline_inside_the_budget() {
        let budget = transfer_budget(1 << 30);
        let start = tokio::time::Instant::now();
        let body = futures::stream::iter([Ok(Bytes::from_static(b"first"))]).chain(futures::stream::pending());
        let (tx, mut rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
        let forwarding = tokio::spawn(forward_body(body, start + budget.saturating_sub(BODY_MARGIN), tx));
        assert_eq!(rx.recv().await.unwrap().unwrap(), "first");
        let last = tokio::time::timeout(budget, rx.recv())
            .await
            .expect("the body's deadline came before the transfer budget")
            .expect("a last message");
        assert_eq!(last.unwrap_err(), "the body did not arrive within its deadline");
        assert_eq!(start.elapsed(), budget - BODY_MARGIN);
        forwarding.await.unwrap();
        assert!(rx.recv().await.is_none(), "nothing after the failure");
    }

    fn volume() -> crate::fake::FakeVolume {
        crate::fake::FakeVolume {
            path: "/pool/v".into(),
            capacity: 1,
            format: "raw".into(),
            backing: None,
            bytes: Vec::new(),
        }
    }

    /// A cleanup whose connection fails (libvirtd restarting, say) tries again over a new one
    /// until the volume is gone; an answer of the daemon ends it at once; so does the budget.
    #[tokio::test(start_paused = true)]
    async fn a_failed_base_is_removed_once_the_connection_comes_back() {
        use egress_conformance::{CallKind, Fault, Times};
        let host = crate::fake::FakeHost::new("hv", "default", 1 << 30);
        let deletes = |host: &crate::fake::FakeHost| {
            host.interceptor()
                .call_log()
                .iter()
                .filter(|c| c.kind == CallKind("StorageVolDelete"))
                .count()
        };
        let cx = OpCtx::background().with_timeout(DISCARD_BUDGET);

        host.put_volume("default", "v", volume());
        host.interceptor()
            .fail(CallKind("StorageVolDelete"), Fault::ConnectionReset, Times::N(3));
        discard_patiently(&cx, &host, "default", "v").await.expect("removed");
        assert!(!host.volumes("default").contains_key("v"));
        assert_eq!(deletes(&host), 4);

        host.put_volume("default", "v", volume());
        host.interceptor()
            .fail(CallKind("StorageVolDelete"), Fault::PermissionDenied, Times::Once);
        let refused = discard_patiently(&cx, &host, "default", "v")
            .await
            .expect_err("refused");
        assert!(!refused.transport, "{refused}");
        assert_eq!(deletes(&host), 5, "the daemon's answer is final");

        host.interceptor()
            .fail(CallKind("StorageVolDelete"), Fault::ConnectionReset, Times::Always);
        let short = OpCtx::background().with_timeout(Duration::from_secs(5));
        let gave_up = discard_patiently(&short, &host, "default", "v")
            .await
            .expect_err("gave up");
        assert!(gave_up.transport, "{gave_up}");
        assert!(host.volumes("default").contains_key("v"));
    }

    #[test]
    fn responses_are_judged_as_the_table_says() {
        use egress_provider::ErrorClass as C;
        use egress_provider::Op;
        let u = "https://mirror/x.qcow2";
        assert_eq!(check_response(u, StatusCode::OK, Some(10)).unwrap(), 10);
        for (status, length, class, text) in [
            (
                404,
                Some(1),
                C::Permanent,
                "image https://mirror/x.qcow2: HTTP 404 Not Found",
            ),
            (
                403,
                Some(1),
                C::Permanent,
                "image https://mirror/x.qcow2: HTTP 403 Forbidden",
            ),
            (410, None, C::Permanent, "image https://mirror/x.qcow2: HTTP 410 Gone"),
            (
                429,
                None,
                C::Transient,
                "image https://mirror/x.qcow2: HTTP 429 Too Many Requests",
            ),
            (
                503,
                None,
                C::Transient,
                "image https://mirror/x.qcow2: HTTP 503 Service Unavailable",
            ),
            (
                302,
                None,
                C::Transient,
                "image https://mirror/x.qcow2: unexpected HTTP 302 Found",
            ),
            (
                200,
                None,
                C::Permanent,
                "image https://mirror/x.qcow2: response has no Content-Length; the volume capacity must be known before upload",
            ),
            (
                200,
                Some(0),
                C::Permanent,
                "image https://mirror/x.qcow2: response is empty (Content-Length 0)",
            ),
        ] {
            let e = check_response(u, StatusCode::from_u16(status).unwrap(), length).unwrap_err();
            assert_eq!((e.class(Op::Create), e.to_string().as_str()), (class, text), "{status}");
        }
    }

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

    #[test]
    fn redirects_stay_safe() {
        let u = |s: &str| reqwest::Url::parse(s).unwrap();
        assert_eq!(redirect_refusal(Some(&u("http://a/x")), &u("https://b/y"), None), None);
        assert!(redirect_refusal(Some(&u("https://a/x")), &u("http://b/y"), None).is_some());
        assert!(redirect_refusal(None, &u("http://169.254.169.254/latest/meta-data"), None).is_some());
        assert!(redirect_refusal(None, &u("http://[fe80::1]/x"), None).is_some());
        assert!(redirect_refusal(None, &u("ftp://a/x"), None).is_some());
        // With imageUrlHosts, a redirect stays on a listed host (review M12).
        let listed = ["Mirror.Example".to_owned(), "[fd00::5]".to_owned()];
        assert_eq!(
            redirect_refusal(None, &u("https://mirror.example/y"), Some(&listed)),
            None
        );
        assert_eq!(
            redirect_refusal(None, &u("http://[fd00::5]:8080/y"), Some(&listed)),
            None
        );
        assert_eq!(
            redirect_refusal(None, &u("http://169.254.169.254/latest/meta-data"), Some(&listed)).as_deref(),
            Some("redirect to 169.254.169.254, a host not in imageUrlHosts, refused")
        );
        assert!(redirect_refusal(None, &u("https://elsewhere.example/y"), Some(&listed)).is_some());
        assert!(redirect_refusal(None, &u("https://mirror.example/y"), Some(&[])).is_some());
        assert!(!is_metadata_host("192.168.1.10") && !is_metadata_host("mirror.example"));
        for other_spelling in [
            "2852039166",
            "0xa9fea9fe",
            "169.254.169.254.",
            "[::ffff:169.254.169.254]",
            "metadata.google.internal",
        ] {
            assert!(is_metadata_host(other_spelling), "{other_spelling}");
        }
    }
}
