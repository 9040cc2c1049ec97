//! The HTTP side: routing a request to a resource and verb, content negotiation, test faults,
//! request counting, and the watch stream.
//!
//! Long file: routing, content negotiation, faults and the watch stream share the request and
//! response helpers of one HTTP front.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::discovery;
use crate::faults::{FaultAction, Faults, Requests, Verb};
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector, labels_of};
use crate::status::ApiError;
use crate::store::{Change, ChangeKind, DeleteOptions, ListOptions, PatchKind, State, Target, WriteOptions, watches};

/// The largest request body accepted, as the real server's limit.
const MAX_BODY: usize = 3 * 1024 * 1024;
/// The shortest bookmark period (a zero period would make no sense and cannot be timed).
const MIN_BOOKMARK_INTERVAL: Duration = Duration::from_millis(10);
/// How long a watch lasts when the client does not say.
const DEFAULT_WATCH_SECONDS: u64 = 1800;

type Body = BoxBody<Bytes, Infallible>;

/// What the connection tasks share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) faults: Faults,
    pub(crate) requests: Requests,
    pub(crate) bookmark_interval: Duration,
    pub(crate) shutdown: CancellationToken,
    /// Cancelled (and replaced) to end every open watch, as an API server restart does.
    pub(crate) watches: Mutex<CancellationToken>,
    pub(crate) address: String,
    pub(crate) identities: crate::reviews::Identities,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in this crate. Serving on is more useful
        // to a test than hanging, though a panic in the middle of a cascade (namespace, CRD or
        // garbage-collection deletes) may have committed only part of it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Marks a response that must not be sent: its connection is closed instead.
const RESET_HEADER: &str = "x-kube-testserver-reset";

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

fn full(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        content_type.parse().expect("a valid content type"),
    );
    r
}

fn json_response(status: u16, value: &Value) -> Response<Body> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    full(
        status,
        "application/json",
        serde_json::to_vec(value).expect("JSON values serialise"),
    )
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if matches!(e.code, 429 | 503) {
        r.headers_mut()
            .insert(header::RETRY_AFTER, "1".parse().expect("a valid header"));
    }
    r
}

/// The reason the real server gives with each status code.
fn reason_for(code: u16) -> &'static str {
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

/// A path segment, percent-decoded (`+` stays `+`: only query strings are form-encoded).
fn segment(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// The decoded query parameters.
#[derive(Debug, Default)]
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(q.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }
    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | ""))
    }
}

/// Which part of the API a path names.
#[derive(Debug)]
enum Route {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    Resources(String, String),
    OpenApiV2,
    OpenApiV3Root,
    OpenApiV3(String, String),
    Object {
        group: String,
        version: String,
        rest: Vec<String>,
    },
    Unknown,
}

fn route(path: &str) -> Route {
    let segs: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(segment).collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    match s.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["apis", g] => Route::Group(g.to_string()),
        ["api", v] => Route::Resources(String::new(), v.to_string()),
        ["apis", g, v] => Route::Resources(g.to_string(), v.to_string()),
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3Root,
        ["openapi", "v3", "api", v] => Route::OpenApiV3(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => Route::OpenApiV3(g.to_string(), v.to_string()),
        ["api", v, rest @ ..] => Route::Object {
            group: String::new(),
            version: v.to_string(),
            rest: to_owned(rest),
        },
        ["apis", g, v, rest @ ..] => Route::Object {
            group: g.to_string(),
            version: v.to_string(),
            rest: to_owned(rest),
        },
        _ => Route::Unknown,
    }
}

fn to_owned(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

/// Resolves `[namespaces/{ns}/]{plural}[/{name}[/{subresource}]]` against the served types.
fn target(state: &State, group: &str, version: &str, rest: &[String]) -> Result<Target, ApiError> {
    let (namespace, rest) = match rest {
        [ns_word, ns, tail @ ..]
            if ns_word == "namespaces" && !tail.is_empty() && tail[0] != "status" && tail[0] != "finalize" =>
        {
            (Some(ns.clone()), tail)
        }
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (p, None, None),
        [p, n] => (p, Some(n.clone()), None),
        [p, n, sub] => (p, Some(n.clone()), Some(sub.clone())),
        _ => return Err(ApiError::no_such_resource()),
    };
    let rt = state
        .types
        .get(group, version, plural)
        .cloned()
        .ok_or_else(ApiError::no_such_resource)?;
    if namespace.is_some() && !rt.namespaced {
        return Err(ApiError::no_such_resource());
    }
    if let Some(sub) = &sub
        && !(sub == "status" && rt.status_subresource)
        && !(sub == "scale" && rt.scale.is_some())
    {
        return Err(ApiError::no_such_resource());
    }
    Ok(Target {
        rt,
        namespace,
        name,
        subresource: sub,
    })
}

fn verb_of(method: &Method, t: &Target, query: &Query) -> Result<Verb, ApiError> {
    let named = t.name.is_some();
    let what = t.rt.qualified();
    Ok(match (method.as_str(), named) {
        ("GET", true) => Verb::Get,
        ("GET", false) if query.flag("watch") => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        (m, _) => return Err(ApiError::method_not_allowed(m, &what)),
    })
}

fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// The shape a read is answered in, from the `Accept` header's `as=` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Full,
    /// `meta.k8s.io/v1 Table`, for `kubectl get`.
    Table,
    /// `PartialObjectMetadata(List)`, for metadata-only clients and watchers.
    Metadata,
}

/// The first form the client accepts, in the order it lists them; JSON only.
fn negotiate(headers: &HeaderMap) -> Result<Form, ApiError> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(Form::Full);
    };
    for option in accept.split(',') {
        let mut parts = option.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        if !matches!(media.as_str(), "application/json" | "*/*" | "application/*" | "") {
            continue;
        }
        let as_param = parts.find_map(|p| p.strip_prefix("as="));
        match as_param {
            None => return Ok(Form::Full),
            Some("Table") => return Ok(Form::Table),
            Some("PartialObjectMetadata" | "PartialObjectMetadataList") => return Ok(Form::Metadata),
            Some(_) => {}
        }
    }
    Err(ApiError::new(
        406,
        "NotAcceptable",
        "only the following media types are accepted: application/json",
    ))
}

/// One object as `PartialObjectMetadata`.
fn metadata_only(object: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or(json!({}))})
}

fn parse_yaml_or_json(bytes: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) => Ok(v),
        Err(json_err) => {
            let text = std::str::from_utf8(bytes).map_err(|_| json_err.to_string())?;
            serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
        }
    }
}

/// The object in a create or update body: JSON, YAML, or (for the built-in kinds kubectl sends
/// that way) the Kubernetes protobuf encoding.
fn decode_object(bytes: &[u8], media: &str, rt: &ResourceType) -> Result<Value, ApiError> {
    let kind = rt.kind.as_str();
    let unrecognized = |e: String| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: {e}"
        ))
    };
    match media {
        "" | "application/json" => serde_json::from_slice(bytes).map_err(|e| unrecognized(e.to_string())),
        "application/yaml" => parse_yaml_or_json(bytes).map_err(unrecognized),
        crate::protobuf::MEDIA_TYPE => crate::protobuf::decode(bytes, rt),
        _ if crate::protobuf::supports(rt) => Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
            crate::protobuf::MEDIA_TYPE,
        ])),
        _ => Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
        ])),
    }
}

/// `GET`, `PUT` or `PATCH` of `<object>/scale`: the object's Scale, and a write of its
/// `spec.replicas` as a merge patch of the object (so its schema and generation apply).
fn scale_request(
    shared: &Arc<Shared>,
    t: &Target,
    verb: Verb,
    bytes: &[u8],
    media: &str,
    opts: WriteOptions,
) -> Result<(u16, Value), ApiError> {
    let object = Target {
        subresource: None,
        ..t.clone()
    };
    let paths = t.rt.scale.clone().ok_or_else(ApiError::no_such_resource)?;
    let mut state = shared.state();
    let current = paths.scale_of(&state.get(&object)?);
    let wanted = match verb {
        Verb::Get => return Ok((200, current)),
        Verb::Update => {
            serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("error decoding Scale: {e}")))?
        }
        Verb::Patch => {
            let patch: Value = serde_json::from_slice(bytes)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let mut scale = current;
            match patch_kind(media, false)? {
                PatchKind::Json => crate::patch::json_patch(&mut scale, &patch)
                    .map_err(|e| ApiError::new(422, "Invalid", format!("applying the patch to the Scale: {e:?}")))?,
                PatchKind::Merge | PatchKind::Strategic => crate::patch::json_merge(&mut scale, &patch),
                PatchKind::Apply => {
                    return Err(ApiError::unsupported_media_type(&[
                        "application/json-patch+json",
                        "application/merge-patch+json",
                        "application/strategic-merge-patch+json",
                    ]));
                }
            }
            scale
        }
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "the scale subresource takes get, update and patch",
            ));
        }
    };
    let written = state.patch(&object, PatchKind::Merge, paths.object_patch(&wanted)?, &opts)?;
    Ok((200, paths.scale_of(&written)))
}

fn patch_kind(media: &str, custom: bool) -> Result<PatchKind, ApiError> {
    match media {
        "application/json-patch+json" => Ok(PatchKind::Json),
        "application/merge-patch+json" => Ok(PatchKind::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
        "application/apply-patch+yaml" => Ok(PatchKind::Apply),
        _ => {
            let mut accepted = vec![
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
            ];
            if !custom {
                accepted.push("application/strategic-merge-patch+json");
            }
            Err(ApiError::unsupported_media_type(&accepted))
        }
    }
}

fn dry_run(query: &Query, body: Option<&Value>) -> Result<bool, ApiError> {
    let from_body = body
        .and_then(|b| b.get("dryRun"))
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    match query.get("dryRun") {
        None | Some("") => Ok(from_body),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid dryRun value: {other}: supported values: \"All\""
        ))),
    }
}

/// The field manager: the `fieldManager` parameter, else the client's user agent up to its first
/// `/`, as the real server derives it.
fn manager(query: &Query, headers: &HeaderMap, apply: bool) -> String {
    match query.get("fieldManager") {
        Some(m) => m.to_string(),
        None if apply => String::new(),
        None => headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|ua| ua.split('/').next().unwrap_or(ua).to_string())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "unknown".into()),
    }
}

fn list_options(query: &Query, rt: &ResourceType) -> Result<ListOptions, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default()).map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), rt.selectable_fields)
        .map_err(ApiError::bad_request)?;
    let limit = match query.get("limit") {
        None | Some("") => None,
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        ),
    };
    let continue_token = query.get("continue").filter(|c| !c.is_empty()).map(str::to_string);
    Ok(ListOptions {
        labels,
        fields,
        limit,
        continue_token,
    })
}

async fn read_body(req: Request<Incoming>) -> Result<(http::request::Parts, Bytes), ApiError> {
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
    if let Some(hook) = shared.faults.hook() {
        let request = crate::faults::HookedRequest {
            verb,
            resource: resource.clone(),
            namespace: t.namespace.clone(),
            name: t.name.clone(),
            client: client.map(str::to_owned),
            query: req.uri().query().map(str::to_owned),
        };
        let verdict = tokio::select! {
            v = hook(request) => v,
            _ = shared.shutdown.cancelled() => return Err(ApiError::new(503, "ServiceUnavailable", "shutting down")),
        };
        match verdict {
            crate::faults::HookVerdict::Serve => {}
            crate::faults::HookVerdict::Fail { code, reason, message } => {
                return Err(ApiError::new(code, reason.unwrap_or(reason_for(code)), message));
            }
            crate::faults::HookVerdict::Reset => {
                let mut r = full(StatusCode::SERVICE_UNAVAILABLE, "text/plain", Vec::new());
                r.headers_mut()
                    .insert(RESET_HEADER, "1".parse().expect("a valid header"));
                return Ok(r);
            }
        }
    }
    match shared.faults.take(verb, &resource) {
        Some(FaultAction::Fail(code)) => {
            let e = ApiError::new(
                code,
                reason_for(code),
                format!("injected fault: {verb} {resource} fails with {code}"),
            );
            return Err(e);
        }
        Some(FaultAction::Delay(d)) => {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = shared.shutdown.cancelled() => return Err(ApiError::new(503, "ServiceUnavailable", "shutting down")),
            }
        }
        None => {}
    } // Writes answer with the whole object whatever the client prefers.
    let form = match verb {
        Verb::Get | Verb::List | Verb::Watch => negotiate(headers)?,
        _ => negotiate(headers).map(|_| Form::Full)?,
    };
    let (parts, bytes) = read_body(req).await?;
    let media = media_type(&parts.headers);
    let writer = |apply: bool, body: Option<&Value>| -> Result<WriteOptions, ApiError> {
        Ok(WriteOptions {
            manager: manager(query, &parts.headers, apply),
            dry_run: dry_run(query, body)?,
            force: query.flag("force"),
            strict: query.get("fieldValidation") == Some("Strict"),
        })
    };
    if t.subresource.as_deref() == Some("scale") {
        let (code, value) = scale_request(shared, &t, verb, &bytes, &media, writer(false, None)?)?;
        return Ok(json_response(code, &value));
    }
    let (code, value) = match verb {
        Verb::Get => {
            let o = shared.state().get(&t)?;
            if form == Form::Metadata {
                (200, metadata_only(&o))
            } else if form == Form::Table {
                let rv = o
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                (200, discovery::table(&t.rt, &[o], &rv))
            } else {
                (200, o)
            }
        }
        Verb::List => {
            let opts = list_options(query, &t.rt)?;
            let list = shared.state().list(&t, &opts)?;
            if form == Form::Metadata {
                let items: Vec<Value> = list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(metadata_only)
                    .collect();
                (
                    200,
                    json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                    "metadata": list["metadata"], "items": items}),
                )
            } else if form == Form::Table {
                let items = list["items"].as_array().cloned().unwrap_or_default();
                let rv = list
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let mut table = discovery::table(&t.rt, &items, &rv);
                if let Some(c) = list.pointer("/metadata/continue") {
                    table["metadata"]["continue"] = c.clone();
                }
                (200, table)
            } else {
                (200, list)
            }
        }
        Verb::Watch => return watch(shared, t, query, form == Form::Metadata),
        Verb::Create => {
            let body = decode_object(&bytes, &media, &t.rt)?;
            let opts = writer(false, None)?;
            strict_fields(query, &t, &body)?;
            (201, shared.state().create(&t, body, &opts)?)
        }
        Verb::Update => {
            let body = decode_object(&bytes, &media, &t.rt)?;
            let opts = writer(false, None)?;
            strict_fields(query, &t, &body)?;
            (200, shared.state().update(&t, body, &opts)?)
        }
        Verb::Patch => {
            let kind = patch_kind(&media, t.rt.custom)?;
            let body = match kind {
                PatchKind::Apply => parse_yaml_or_json(&bytes)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
                _ => serde_json::from_slice(&bytes)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
            };
            let opts = writer(kind == PatchKind::Apply, None)?;
            if kind != PatchKind::Json {
                strict_fields(query, &t, &body)?;
            }
            let mut state = shared.state();
            let existed = state.get(&t).is_ok();
            let out = state.patch(&t, kind, body, &opts)?;
            (if existed { 200 } else { 201 }, out)
        }
        Verb::Delete | Verb::DeleteCollection => {
            let body: Option<Value> = if bytes.is_empty() {
                None
            } else {
                Some(
                    serde_json::from_slice(&bytes)
                        .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?,
                )
            };
            let policy = body
                .as_ref()
                .and_then(|b| b.get("propagationPolicy"))
                .and_then(Value::as_str)
                .or(query.get("propagationPolicy"));
            let opts = DeleteOptions {
                dry_run: dry_run(query, body.as_ref())?,
                orphan: match policy {
                    None | Some("" | "Background" | "Foreground") => false,
                    Some("Orphan") => true,
                    Some(other) => {
                        return Err(ApiError::bad_request(format!(
                            "propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                        )));
                    }
                },
                precondition_uid: body
                    .as_ref()
                    .and_then(|b| b.pointer("/preconditions/uid"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
                precondition_rv: body
                    .as_ref()
                    .and_then(|b| b.pointer("/preconditions/resourceVersion"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
            };
            let mut state = shared.state();
            if verb == Verb::Delete {
                (200, state.delete(&t, &opts)?)
            } else {
                (200, state.delete_collection(&t, &list_options(query, &t.rt)?, &opts)?)
            }
        }
    };
    Ok(json_response(code, &value))
}

/// `fieldValidation=Strict` refuses fields the schema does not declare (the default, `Warn`,
/// and `Ignore` let pruning drop them silently).
fn strict_fields(query: &Query, t: &Target, body: &Value) -> Result<(), ApiError> {
    match query.get("fieldValidation") {
        None | Some("" | "Ignore" | "Warn") => Ok(()),
        Some("Strict") => match &t.rt.schema {
            Some(schema) => {
                let unknown = schema.unknown_fields(body);
                if unknown.is_empty() {
                    Ok(())
                } else {
                    let listed: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
                    Err(ApiError::bad_request(format!(
                        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                        t.rt.kind,
                        t.rt.api_version(),
                        t.rt.kind,
                        listed.join(", ")
                    )))
                }
            }
            None => Ok(()),
        },
        Some(other) => Err(ApiError::bad_request(format!(
            "fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\", got \"{other}\""
        ))),
    }
}

/// What one change looks like to a watch with these selectors, if it sees it at all: the event
/// type and the object to send. An object that leaves the selection is sent as DELETED in its
/// last selected state, stamped with the change's resourceVersion, as the watch cache does.
fn seen_as(change: &Change, opts: &ListOptions) -> Option<(&'static str, Value)> {
    let selected = |o: &Value| opts.labels.matches(&labels_of(o)) && opts.fields.matches(o);
    let now = selected(&change.object);
    let before = change.previous.as_ref().is_some_and(selected);
    let current = || change.object.clone();
    let last_selected = || {
        let mut o = change.previous.clone().unwrap_or_else(|| change.object.clone());
        o["metadata"]["resourceVersion"] = json!(change.rv.to_string());
        o
    };
    match change.kind {
        ChangeKind::Added => now.then(|| ("ADDED", current())),
        ChangeKind::Deleted => (now || before).then(|| ("DELETED", current())),
        ChangeKind::Modified => match (before, now) {
            (true, true) => Some(("MODIFIED", current())),
            (false, true) => Some(("ADDED", current())),
            (true, false) => Some(("DELETED", last_selected())),
            (false, false) => None,
        },
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("JSON values serialise");
    line.push(b'\n');
    Bytes::from(line)
}

fn bookmark(t: &Target, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": t.rt.kind, "apiVersion": t.rt.api_version(), "metadata": metadata}),
    )
}

/// The watch parameters the real server refuses in combination: `sendInitialEvents` (whatever
/// its value) needs `resourceVersionMatch=NotOlderThan`, and `resourceVersionMatch` on a watch
/// needs `sendInitialEvents`.
fn check_watch_params(query: &Query) -> Result<(), ApiError> {
    let forbidden = |detail: &str| {
        let cause = crate::status::FieldCause::forbidden("resourceVersionMatch", detail);
        ApiError::invalid("ListOptions", "meta.k8s.io", "", vec![cause])
    };
    match (query.get("sendInitialEvents"), query.get("resourceVersionMatch")) {
        (Some(_), Some("NotOlderThan")) | (None, None | Some("")) => Ok(()),
        (Some(_), _) => Err(forbidden(
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        )),
        (None, Some(_)) => Err(forbidden(
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        )),
    }
}

fn watch(shared: &Arc<Shared>, t: Target, query: &Query, metadata: bool) -> Result<Response<Body>, ApiError> {
    let mut opts = list_options(query, &t.rt)?;
    opts.limit = None;
    opts.continue_token = None;
    check_watch_params(query)?;
    let bookmarks = query.flag("allowWatchBookmarks");
    let send_initial = query.get("sendInitialEvents").map(|v| matches!(v, "true" | "1"));
    let timeout = match query.get("timeoutSeconds") {
        None | Some("" | "0") => DEFAULT_WATCH_SECONDS,
        Some(s) => s
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {s}")))?,
    };
    let render = {
        let t = t.clone();
        move |object: &Value| {
            let typed = with_type(&t, object);
            if metadata { metadata_only(&typed) } else { typed }
        }
    };
    let from = query.get("resourceVersion").filter(|s| !s.is_empty() && *s != "0");
    // Taken before the state lock, so an `end_watches` racing with this start ends it too.
    let dropped = shared.watches.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (initial, mut live, start, finished) = {
        let state = shared.state();
        // Subscribed under the lock that also reads the history or the snapshot: no change can
        // fall between the replay and the live stream.
        let live = state.subscribe();
        let start = state.resource_version();
        let mut lines = Vec::new();
        let mut finished = false;
        match (from, send_initial) {
            (Some(rv), None | Some(false)) => {
                let since = rv
                    .parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
                match state.changes_since(&t, since) {
                    Ok(changes) => lines.extend(
                        changes
                            .iter()
                            .filter_map(|c| seen_as(c, &opts).map(|(kind, o)| event_line(kind, &render(&o)))),
                    ),
                    Err(gone) => {
                        lines.push(event_line("ERROR", &gone.to_status()));
                        finished = true;
                    }
                }
            }
            // Explicitly no initial events: from now on.
            (None, Some(false)) => {}
            _ => {
                lines.extend(
                    state
                        .snapshot(&t, &opts)
                        .iter()
                        .map(|o| event_line("ADDED", &render(o))),
                );
                if send_initial == Some(true) && bookmarks {
                    lines.push(bookmark(&t, start, true));
                }
            }
        }
        (lines, live, start, finished)
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let shutdown = shared.shutdown.clone();
    let interval = shared.bookmark_interval.max(MIN_BOOKMARK_INTERVAL);
    tokio::spawn(async move {
        for line in initial {
            if tx.send(line).await.is_err() {
                return;
            }
        }
        if finished {
            return;
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        let mut last_rv = start;
        loop {
            let line = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = dropped.cancelled() => return,
                _ = tx.closed() => return,
                _ = &mut deadline => {
                    if bookmarks {
                        let _ = tx.send(bookmark(&t, last_rv, false)).await;
                    }
                    return;
                }
                _ = ticker.tick(), if bookmarks => bookmark(&t, last_rv, false),
                received = live.recv() => match received {
                    Ok(change) if change.rv > start => {
                        // Bookmarks carry the newest resourceVersion seen, whatever its kind:
                        // resuming from it must not replay or expire on other kinds' churn.
                        last_rv = change.rv;
                        if !watches(&t, &change) {
                            continue;
                        }
                        match seen_as(&change, &opts) {
                            Some((kind, o)) => event_line(kind, &render(&o)),
                            None => continue,
                        }
                    }
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // This watcher fell too far behind: it must re-list, as after a compaction.
                        let gone = ApiError::gone(format!("too old resource version: {last_rv}"));
                        let _ = tx.send(event_line("ERROR", &gone.to_status())).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            if tx.send(line).await.is_err() {
                return;
            }
        }
    });
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        "application/json".parse().expect("a valid content type"),
    );
    r.headers_mut()
        .insert(header::TRANSFER_ENCODING, "chunked".parse().expect("a valid header"));
    Ok(r)
}

fn with_type(t: &Target, object: &Value) -> Value {
    t.rt.show(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(route("/api/v1/namespaces/a/pods/b"), Route::Object { .. }));
        assert!(matches!(route("/apis/x.io/v1"), Route::Resources(..)));
        assert!(matches!(route("/nope"), Route::Unknown));
    }

    #[test]
    fn percent_decoding() {
        let query = Query::parse(Some("labelSelector=a%3Db%2Cc+d&watch&x=100%"));
        assert_eq!(query.get("labelSelector"), Some("a=b,c d"));
        assert!(query.flag("watch"));
        assert_eq!(query.get("x"), Some("100%"));
        assert_eq!(segment("a+b%3Ac"), "a+b:c", "a path's + is a plus");
        assert_eq!(segment("%zz"), "%zz");
    }
}
