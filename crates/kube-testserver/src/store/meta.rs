//! The object helpers every verb uses: metadata read and written, names checked and made, what
//! counts as a change, the continue tokens of a paged list.

use serde_json::{Map, Value, json};

use crate::status::ApiError;

pub(crate) fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(super) fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    let h = data_encoding::HEXLOWER.encode(&b);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// The five random characters the server appends to a `generateName`.
pub(super) fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random::<u8>() as usize % ALPHABET.len()] as char)
        .collect()
}

pub(super) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(super) fn is_dns_subdomain(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !p.starts_with('-')
            && !p.ends_with('-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(part)
}

pub(super) fn meta(object: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    object
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

pub(super) fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    object["metadata"].as_object_mut().expect("metadata is an object")
}

pub(super) fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    meta(object).get(field).and_then(Value::as_str)
}

pub(super) fn finalizers(object: &Value) -> Vec<String> {
    meta(object)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// The object without what the server owns, for "did anything change" and generation checks.
pub(super) fn content(object: &Value, drop_status: bool) -> Value {
    let mut o = object.clone();
    if let Value::Object(m) = &mut o {
        m.remove("metadata");
        if drop_status {
            m.remove("status");
        }
    }
    o
}

/// Who owns what, without the timestamps every write refreshes.
pub(super) fn ownership(object: &Value) -> Value {
    let mut entries = meta(object).get("managedFields").cloned().unwrap_or(json!([]));
    for e in entries.as_array_mut().into_iter().flatten() {
        if let Some(m) = e.as_object_mut() {
            m.remove("time");
        }
    }
    entries
}

pub(super) fn without_volatile_metadata(object: &Value) -> Value {
    let mut o = object.clone();
    let m = meta_mut(&mut o);
    m.remove("resourceVersion");
    m.remove("managedFields");
    o
}

pub(super) fn encode_continue(ns: &str, name: &str) -> String {
    data_encoding::BASE64URL_NOPAD.encode(json!({"v": 1, "ns": ns, "name": name}).to_string().as_bytes())
}

pub(super) fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let bad = || ApiError::bad_request("invalid continue token");
    let bytes = data_encoding::BASE64URL_NOPAD
        .decode(token.as_bytes())
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string).ok_or_else(bad);
    Ok((s("ns")?, s("name")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_look_like_uuids_and_differ() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }

    #[test]
    fn continue_tokens_round_trip_and_garbage_is_refused() {
        let t = encode_continue("ns", "a");
        assert_eq!(decode_continue(&t).unwrap(), ("ns".to_string(), "a".to_string()));
        assert_eq!(decode_continue("!!").unwrap_err().code, 400);
    }
}
