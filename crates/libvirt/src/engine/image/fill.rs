//! Filling a base: the image asked for within its probe budget, the pool's room checked, the
//! fill lease taken ([`crate::engine::fence`]), what an earlier fill left cleared, then on a
//! connection of its own the body streamed through a SHA-256 into the upload, the pool refreshed
//! and the marker written last. What one fill made, and only that, is removed when it fails.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use egress_provider::{OpCtx, redact};
use futures::StreamExt as _;
use sha2::{Digest, Sha256};

use super::cached::{Cached, Found, cached};
use super::http::{PROBE_BUDGET, check_response, declared_length, fetch_error, http_error_text};
use crate::engine::failure::{Context as _, OpFailure};
use crate::engine::fence::{self, Lease};
use crate::host::{Host, LibvirtError, code};
use crate::{VolumeSpec, transfer_budget};

/// How far inside the transfer budget ([`transfer_budget`] of the image's size, from the
/// headers to the marker) the HTTP body's own deadline falls: a mirror that stops sending
/// fails the body read first, and the upload ends as a clean, short stream.
pub const BODY_MARGIN: Duration = Duration::from_secs(60);
/// Cleaning up a failed base: bounded, and not cut short by the caller.
pub const DISCARD_BUDGET: Duration = Duration::from_secs(30);
/// The largest image the operator accepts (review M11): far above any cloud image, far below
/// what a lying `Content-Length` could claim.
pub const MAX_IMAGE_BYTES: u64 = 64 << 30;
/// Chunks in flight between the HTTP body and the upload.
const CHUNKS_IN_FLIGHT: usize = 4;

/// What the pool-space checks keep free: a twentieth of the pool (a filesystem's usual root
/// reserve, which libvirt counts as available but QEMU cannot write to).
pub fn pool_headroom(capacity: u64) -> u64 {
    capacity / 20
}

/// What one fetch made on the pool, so that it (and nothing else) is removed afterwards.
#[derive(Debug, Default)]
pub(super) struct Fill {
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
    pub(super) async fn clean_up(&self, host: &dyn Host, img: &Cached<'_>, failed: bool) {
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
pub(super) async fn fetch(
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
}
