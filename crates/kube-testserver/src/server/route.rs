//! Which part of the API a request names: its path parsed into a route, an object route
//! resolved against the served types into a target, and its method into a verb.

use http::Method;

use crate::faults::Verb;
use crate::status::ApiError;
use crate::store::{State, Target};

/// A path segment, percent-decoded (`+` stays `+`: only query strings are form-encoded).
pub(super) fn segment(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// The decoded query parameters.
#[derive(Debug, Default)]
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(q: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(q.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }
    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
    pub(super) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | ""))
    }
}

/// Which part of the API a path names.
#[derive(Debug)]
pub(super) enum Route {
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

pub(super) fn route(path: &str) -> Route {
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
pub(super) fn target(state: &State, group: &str, version: &str, rest: &[String]) -> Result<Target, ApiError> {
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

pub(super) fn verb_of(method: &Method, t: &Target, query: &Query) -> Result<Verb, ApiError> {
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
