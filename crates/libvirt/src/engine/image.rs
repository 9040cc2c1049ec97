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
//! The protocol's steps, each in its module: [`ensure`] here takes the image's lock and looks;
//! `cached` reads what the cache holds; `http` judges the mirror's answers; `fill` takes the
//! lease, downloads, verifies, uploads and writes the marker last.

mod cached;
mod fill;
mod http;

use std::sync::Arc;

use egress_provider::{OpCtx, redact};
use futures::StreamExt as _;
use tracing::Instrument as _;
use tracing::field::Empty;

pub use cached::{Cached, marker_digest};
use cached::{Found, cached};
pub use fill::{BODY_MARGIN, DISCARD_BUDGET, MAX_IMAGE_BYTES, pool_headroom};
use fill::{Fill, fetch};
pub use http::{PROBE_BUDGET, check_response, http_client};
use http::{declared_length, fetch_error};

use super::failure::{Context as _, OpFailure};
use super::locks::KeyedLocks;
use super::placement::Image;
use crate::generation::Generation;
use crate::host::{Host, code};
use crate::names;

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

/// The URL's host part only (span attributes carry nothing more).
fn url_host(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_default()
}
