//! JSON as the Go types write it: objects built field by field with their `omitempty` rules,
//! and times in RFC 3339 (Go's zero time left out).

use std::collections::BTreeMap;

use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use serde_json::{Map, Value, json};

/// A JSON object built field by field, leaving out what the Go types' `omitempty` leaves out.
#[derive(Default)]
pub(super) struct Fields(Map<String, Value>);

impl Fields {
    pub(super) fn put(&mut self, key: &str, value: Value) -> &mut Self {
        self.0.insert(key.to_owned(), value);
        self
    }
    /// A string; empty reads as absent (gogo protobuf always sends Go's plain strings).
    pub(super) fn text(&mut self, key: &str, value: Option<String>) -> &mut Self {
        match value.filter(|v| !v.is_empty()) {
            Some(v) => self.put(key, json!(v)),
            None => self,
        }
    }
    /// An optional number or bool (a Go pointer): kept whenever it was sent.
    pub(super) fn some<T: Into<Value>>(&mut self, key: &str, value: Option<T>) -> &mut Self {
        match value {
            Some(v) => self.put(key, v.into()),
            None => self,
        }
    }
    /// A Go plain number with `omitempty`: zero reads as absent.
    pub(super) fn nonzero<T: Into<Value> + Default + PartialEq>(&mut self, key: &str, value: Option<T>) -> &mut Self {
        match value.filter(|v| *v != T::default()) {
            Some(v) => self.put(key, v.into()),
            None => self,
        }
    }
    pub(super) fn strings(&mut self, key: &str, value: Vec<String>) -> &mut Self {
        if value.is_empty() {
            self
        } else {
            self.put(key, json!(value))
        }
    }
    pub(super) fn string_map(&mut self, key: &str, value: BTreeMap<String, String>) -> &mut Self {
        if value.is_empty() {
            self
        } else {
            self.put(key, json!(value))
        }
    }
    pub(super) fn bytes_map(&mut self, key: &str, value: BTreeMap<String, Vec<u8>>) -> &mut Self {
        if value.is_empty() {
            return self;
        }
        let encoded: Map<String, Value> = value
            .into_iter()
            .map(|(k, v)| (k, json!(data_encoding::BASE64.encode(&v))))
            .collect();
        self.put(key, Value::Object(encoded))
    }
    pub(super) fn object(&mut self, key: &str, value: Option<Value>) -> &mut Self {
        match value {
            Some(v) if v.as_object().is_some_and(|m| !m.is_empty()) => self.put(key, v),
            _ => self,
        }
    }
    pub(super) fn list(&mut self, key: &str, value: Vec<Value>) -> &mut Self {
        if value.is_empty() {
            self
        } else {
            self.put(key, Value::Array(value))
        }
    }
    pub(super) fn done(&mut self) -> Value {
        Value::Object(std::mem::take(&mut self.0))
    }
}

/// Go's zero `time.Time` as protobuf seconds (0001-01-01T00:00:00Z).
pub(super) const ZERO_TIME_SECONDS: i64 = -62_135_596_800;

pub(super) fn seconds_text(seconds: Option<i64>, nanos: Option<i32>, micros: bool) -> Option<String> {
    let s = seconds.unwrap_or(0);
    let n = nanos.unwrap_or(0);
    if (s == 0 && n == 0) || s == ZERO_TIME_SECONDS {
        return None;
    }
    let at = jiff::Timestamp::from_second(s).ok()?;
    let base = at.strftime("%Y-%m-%dT%H:%M:%S").to_string();
    Some(if micros {
        format!("{base}.{:06}Z", n.max(0) / 1000)
    } else {
        format!("{base}Z")
    })
}

pub(super) fn time(t: Option<meta::Time>) -> Option<String> {
    t.and_then(|t| seconds_text(t.seconds, t.nanos, false))
}

pub(super) fn micro_time(t: Option<meta::MicroTime>) -> Option<String> {
    t.and_then(|t| seconds_text(t.seconds, t.nanos, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_and_zero_is_absent() {
        assert_eq!(
            seconds_text(Some(1_767_225_600), Some(0), false).as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert_eq!(
            seconds_text(Some(1_767_225_600), Some(123_456_789), true).as_deref(),
            Some("2026-01-01T00:00:00.123456Z")
        );
        assert_eq!(seconds_text(None, None, false), None);
        assert_eq!(seconds_text(Some(ZERO_TIME_SECONDS), Some(0), false), None);
    }
}
