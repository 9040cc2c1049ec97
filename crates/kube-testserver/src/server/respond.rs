//! The HTTP ends of a request: its body read within the real server's limit, its media type,
//! and the responses (JSON, errors as `Status`, the reason for each code).

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde_json::Value;

use crate::status::ApiError;

/// The largest request body accepted, as the real server's limit.
const MAX_BODY: usize = 3 * 1024 * 1024;

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// Marks a response that must not be sent: its connection is closed instead.
pub(super) const RESET_HEADER: &str = "x-kube-testserver-reset";

pub(super) fn full(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        content_type.parse().expect("a valid content type"),
    );
    r
}

pub(super) fn json_response(status: u16, value: &Value) -> Response<Body> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    full(
        status,
        "application/json",
        serde_json::to_vec(value).expect("JSON values serialise"),
    )
}

pub(super) fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if matches!(e.code, 429 | 503) {
        r.headers_mut()
            .insert(header::RETRY_AFTER, "1".parse().expect("a valid header"));
    }
    r
}

/// The reason the real server gives with each status code.
pub(super) fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

pub(super) fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .unwrap_or_default()
}

pub(super) async fn read_body(req: Request<Incoming>) -> Result<(http::request::Parts, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => Ok((parts, collected.to_bytes())),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_BODY}"),
        )),
        Err(e) => Err(ApiError::bad_request(format!("reading the request body: {e}"))),
    }
}
