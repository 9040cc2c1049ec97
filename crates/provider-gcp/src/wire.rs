//! The wire log (spec/providers.md §5.9): one `api request` and one `api response` record per
//! Compute call, at TRACE on the target [`TARGET`], so it can be switched on alone.
//!
//! What never appears: the `Authorization` header (requests are logged as method and URL),
//! token exchanges (never wire-logged at all), and the values of the `user-data` and
//! `egress-proxy-htpasswd` metadata items, which are replaced by their byte counts even when full
//! payloads are asked for (the htpasswd line holds only a salted hash, but a hash is still for
//! the VM alone). JSON string
//! fields over [`ELIDE_OVER`] bytes are elided unless [`WireOptions::full_payloads`] is set.

use serde_json::Value;

/// The tracing target of wire records.
pub const TARGET: &str = "egress_provider_gcp::wire";
/// String fields longer than this many bytes are elided.
pub const ELIDE_OVER: usize = 1024;

/// How the wire log shows payloads (`--gcp-wire-log-full-payloads`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireOptions {
    /// Log payloads whole instead of eliding long string fields.
    pub full_payloads: bool,
}

/// `payload` as the wire log shows it.
pub fn shown(payload: &Value, options: WireOptions) -> String {
    let mut v = payload.clone();
    shape(&mut v, options);
    v.to_string()
}

fn shape(v: &mut Value, options: WireOptions) {
    match v {
        Value::Object(map) => {
            let hidden = map
                .get("key")
                .and_then(Value::as_str)
                .filter(|k| [crate::body::USER_DATA_KEY, crate::body::HTPASSWD_KEY].contains(k))
                .map(str::to_owned);
            for (key, field) in map.iter_mut() {
                if let Some(item) = hidden.as_deref()
                    && key == "value"
                {
                    let bytes = field.as_str().map_or(0, str::len);
                    *field = Value::String(format!("<{item}: {bytes} bytes>"));
                } else {
                    shape(field, options);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| shape(i, options)),
        Value::String(s) if !options.full_payloads && s.len() > ELIDE_OVER => {
            *s = format!("<elided {} bytes>", s.len());
        }
        _ => {}
    }
}

/// Records a request about to be sent.
pub fn request(method: &str, url: &str, payload: Option<&Value>, options: WireOptions) {
    if !tracing::enabled!(target: TARGET, tracing::Level::TRACE) {
        return;
    }
    let payload = payload.map(|p| shown(p, options)).unwrap_or_default();
    tracing::trace!(target: TARGET, method, url, payload = %payload, "api request");
}

/// Records an answer. `sent_secret` is what the request carried that an answer must not echo
/// (the cloud-init of an insert, which an error message may quote).
pub fn response(method: &str, url: &str, status: u16, body: &[u8], options: WireOptions, sent_secret: &[u8]) {
    if !tracing::enabled!(target: TARGET, tracing::Level::TRACE) {
        return;
    }
    let payload = match serde_json::from_slice::<Value>(body) {
        Ok(v) => shown(&v, options),
        Err(_) => format!("<{} bytes, not JSON>", body.len()),
    };
    let payload = egress_provider::scrub(&payload, sent_secret);
    tracing::trace!(target: TARGET, method, url, status, payload = %payload, "api response");
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn user_data_is_always_a_byte_count() {
        let body = json!({"name": "x", "metadata": {"items": [
            {"key": "user-data", "value": "#cloud-config secret"},
            {"key": "egress-proxy-htpasswd", "value": "u:$6$hashsecret"},
            {"key": "other", "value": "kept"}]}});
        for full in [false, true] {
            let s = shown(&body, WireOptions { full_payloads: full });
            assert!(!s.contains("secret"), "{s}");
            assert!(s.contains("<user-data: 20 bytes>") && s.contains("kept"), "{s}");
            assert!(s.contains("<egress-proxy-htpasswd: 15 bytes>"), "{s}");
        }
    }

    #[test]
    fn long_strings_are_elided_unless_full_payloads() {
        let long = "a".repeat(ELIDE_OVER + 1);
        let short = "b".repeat(ELIDE_OVER);
        let body = json!({"x": [long.clone()], "y": short.clone()});
        let s = shown(&body, WireOptions::default());
        assert!(s.contains("<elided 1025 bytes>") && s.contains(&short), "{s}");
        let s = shown(&body, WireOptions { full_payloads: true });
        assert!(s.contains(&long), "full payloads keep long fields");
    }
}
