//! The HTTP side: routing a request to a resource and verb, content negotiation, test faults,
//! request counting, and the watch stream.
//!
//! ```text
//!  request ─► route ─► screen (hook, faults) ─► negotiate ─► verbs ─► store
//!                                                              └──► watch (a stream)
//! ```
//!
//! `respond` holds the HTTP ends (bodies, responses), `params` the query parameters and option
//! bodies a verb reads, `shared` what every connection task shares.

mod negotiate;
mod params;
mod respond;
mod route;
mod screen;
mod shared;
mod verbs;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::discovery;
use crate::faults::Verb;
use crate::status::ApiError;
use negotiate::{Form, negotiate};
use respond::{Body, RESET_HEADER, error_response, full, json_response, media_type, read_body};
use route::{Query, Route, route, target, verb_of};
pub(crate) use shared::Shared;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors or a reset during accept: give the system a moment.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let token = shared.shutdown.clone();
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move {
                    let response = handle(shared, req).await;
                    // A hook asked for the connection to be dropped: an error closes it.
                    if response.headers().contains_key(RESET_HEADER) {
                        return Err(std::io::Error::other("reset by a request hook"));
                    }
                    Ok(response)
                }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = token.cancelled() => {}
            }
        });
    }
}

pub(crate) async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let query = Query::parse(req.uri().query());
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let headers = req.headers().clone();
    let state = || shared.state();
    let doc = |v: Option<Value>| match v {
        Some(v) => json_response(200, &v),
        None => error_response(&ApiError::no_such_resource()),
    };
    if method == Method::POST && (path == crate::reviews::TOKEN_REVIEWS || path == crate::reviews::ACCESS_REVIEWS) {
        return review(&shared, req, &path).await;
    }
    let route = route(&path);
    if !matches!(route, Route::Object { .. }) && method != Method::GET {
        return error_response(&ApiError::method_not_allowed(method.as_str(), &path));
    }
    match route {
        Route::Version => json_response(200, &discovery::version()),
        Route::Health => full(StatusCode::OK, "text/plain", b"ok".to_vec()),
        Route::CoreVersions => json_response(200, &discovery::core_versions(&shared.address)),
        Route::Groups => json_response(200, &discovery::group_list(&state().types)),
        Route::Group(g) => doc(discovery::group(&state().types, &g)),
        Route::Resources(g, v) => doc(discovery::resource_list(&state().types, &g, &v)),
        Route::OpenApiV3Root => json_response(200, &discovery::openapi_v3_root(&state().types)),
        Route::OpenApiV3(g, v) => doc(discovery::openapi_v3_group_version(&state().types, &g, &v)),
        // Only the protobuf form of v2 exists on a real server's fast path; clients fall back to v3.
        Route::OpenApiV2 | Route::Unknown => error_response(&ApiError::no_such_resource()),
        Route::Object { group, version, rest } => {
            match object_request(&shared, req, &query, &headers, &group, &version, &rest).await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            }
        }
    }
}

/// A TokenReview or SubjectAccessReview: answered, counted, never stored.
async fn review(shared: &Arc<Shared>, req: Request<Incoming>, path: &str) -> Response<Body> {
    let resource = if path == crate::reviews::TOKEN_REVIEWS {
        "tokenreviews"
    } else {
        "subjectaccessreviews"
    };
    let client = req
        .headers()
        .get(crate::faults::CLIENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    shared.requests.record(Verb::Create, resource, client.as_deref());
    let answer = async {
        let (_, bytes) = read_body(req).await?;
        let body: Value =
            serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("decoding the review: {e}")))?;
        if resource == "tokenreviews" {
            shared.identities.token_review(&body)
        } else {
            shared.identities.access_review(&body)
        }
    };
    match answer.await {
        Ok(v) => json_response(201, &v),
        Err(e) => error_response(&e),
    }
}

/// A request on an object route: resolved, counted, screened, then answered by its verb.
async fn object_request(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    query: &Query,
    headers: &HeaderMap,
    group: &str,
    version: &str,
    rest: &[String],
) -> Result<Response<Body>, ApiError> {
    let t = target(&shared.state(), group, version, rest)?;
    let verb = verb_of(req.method(), &t, query)?;
    if t.namespace.is_none() && t.rt.namespaced && !matches!(verb, Verb::List | Verb::Watch) {
        return Err(ApiError::no_such_resource());
    }
    let resource = match &t.subresource {
        Some(sub) => format!("{}/{sub}", t.rt.plural),
        None => t.rt.plural.clone(),
    };
    let client = headers.get(crate::faults::CLIENT_HEADER).and_then(|v| v.to_str().ok());
    shared.requests.record(verb, &resource, client);
    if let Some(reset) = screen::screen(shared, &t, verb, &resource, client, req.uri().query()).await? {
        return Ok(reset);
    }
    // Writes answer with the whole object whatever the client prefers.
    let form = match verb {
        Verb::Get | Verb::List | Verb::Watch => negotiate(headers)?,
        _ => negotiate(headers).map(|_| Form::Full)?,
    };
    let (parts, bytes) = read_body(req).await?;
    let sent = verbs::Sent {
        query,
        headers: &parts.headers,
        media: media_type(&parts.headers),
        bytes: &bytes,
    };
    verbs::answer(shared, t, verb, form, &sent)
}
