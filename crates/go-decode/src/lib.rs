//! Decoding a [`serde_json::Value`] into Rust types the way the Go operator's decoders read the
//! same text, so files and request bodies it took keep working after a switch. Two sets of
//! rules: [`Rules::Yaml`] for what Go read with `sigs.k8s.io/yaml` (providers.yaml), all of the
//! list below; [`Rules::Json`] for what it read with `encoding/json` alone (request bodies), the
//! first and last items only:
//!
//! - **Keys without regard to case.** Go's `encoding/json` (which `sigs.k8s.io/yaml` hands YAML
//!   to) matches an object key to a struct field exactly if it can, else ignoring case:
//!   `Project:` fills `project`. Keys of maps (labels, selectors) are kept as written. A key that
//!   matches no field is still refused where the type refuses unknown fields.
//! - **YAML 1.1 booleans in boolean fields.** `yes`, `no`, `on`, `off`, `y`, `n` (in the three
//!   spellings YAML 1.1 allows) are booleans where a boolean is expected, and stay text
//!   everywhere else: a host named `no` is the string `"no"`. (Go turned them into booleans
//!   before it knew the field, so `name: yes` became `"true"`; this keeps the text, on purpose.)
//! - **Scalars in string fields.** A whole number or boolean where a string is expected is taken
//!   as its text (`project: 123` is `"123"`), as `sigs.k8s.io/yaml` converted it. A fraction or
//!   exponent is refused: its text as YAML 1.1 wrote it (`1e3`) is lost by then, and a changed
//!   text (`"1000.0"`) would be worse than a refusal.
//! - **`null` as nothing.** A struct field given `null` is left out (so it takes its default, as
//!   Go left the zero value); `null` where a map, list or struct is expected is an empty one, and
//!   where an `Option` is expected is `None`.
//!
//! Everything else is refused as `serde_json` would refuse it.

mod duration;

pub use duration::parse_duration;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Which of Go's decoders to follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// `sigs.k8s.io/yaml`: YAML 1.1 converted to JSON with the target in view, then
    /// `encoding/json`.
    Yaml,
    /// `encoding/json`: keys in any case and `null` as nothing; no conversions between types.
    Json,
}

/// Decodes `value` into `T` with `rules` (see the crate docs).
///
/// # Errors
/// What `T`'s `Deserialize` refuses.
pub fn from_value<'de, T: serde::Deserialize<'de>>(value: &'de Value, rules: Rules) -> Result<T, serde_json::Error> {
    T::deserialize(GoValue::new(value, rules))
}

/// A borrowed value as a deserializer with Go's rules; wrap it in `serde_path_to_error` to learn
/// where a failure is.
#[derive(Debug, Clone, Copy)]
pub struct GoValue<'de> {
    value: &'de Value,
    rules: Rules,
}

impl<'de> GoValue<'de> {
    /// `value`, to be decoded with `rules`.
    pub fn new(value: &'de Value, rules: Rules) -> Self {
        Self { value, rules }
    }
}

/// The booleans of YAML 1.1 (<https://yaml.org/type/bool.html>), which Go's YAML reader used.
pub fn yaml11_bool(text: &str) -> Option<bool> {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// The field `key` fills: the one of that exact name, else the first that differs only in the
/// case of ASCII letters (Go folds case the same way for the ASCII keys configs use).
fn field_for<'k>(key: &'k str, fields: &'static [&'static str]) -> &'k str {
    if fields.contains(&key) {
        return key;
    }
    fields
        .iter()
        .find(|f| f.eq_ignore_ascii_case(key))
        .copied()
        .unwrap_or(key)
}

impl<'de> Deserializer<'de> for GoValue<'de> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Array(items) => visitor.visit_seq(Items(items.iter(), self.rules)),
            Value::Object(map) => visitor.visit_map(Entries::new(Some(map), None, self.rules)),
            // Null, booleans, numbers and strings as serde_json has them.
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::String(s) if self.rules == Rules::Yaml => match yaml11_bool(s) {
                Some(b) => visitor.visit_bool(b),
                None => self.deserialize_any(visitor),
            },
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Number(n) if self.rules == Rules::Yaml && (n.is_i64() || n.is_u64()) => {
                visitor.visit_string(n.to_string())
            }
            Value::Bool(b) if self.rules == Rules::Yaml => visitor.visit_string(b.to_string()),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_seq(Items([].iter(), self.rules)),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_map(Entries::new(None, None, self.rules)),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_map(Entries::new(None, Some(fields), self.rules)),
            Value::Object(map) => visitor.visit_map(Entries::new(Some(map), Some(fields), self.rules)),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // Variant names are compared exactly, as Go compared such strings.
        self.value.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit unit_struct
        tuple_struct identifier
    }
}

/// A list's elements, each decoded with Go's rules.
struct Items<'de>(std::slice::Iter<'de, Value>, Rules);

impl<'de> SeqAccess<'de> for Items<'de> {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Self::Error> {
        let rules = self.1;
        self.0
            .next()
            .map(|v| seed.deserialize(GoValue::new(v, rules)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// A mapping's entries; for a struct (`fields` known), each key renamed to the field it fills.
struct Entries<'de> {
    entries: Option<serde_json::map::Iter<'de>>,
    fields: Option<&'static [&'static str]>,
    value: Option<&'de Value>,
    rules: Rules,
}

impl<'de> Entries<'de> {
    fn new(
        map: Option<&'de serde_json::Map<String, Value>>,
        fields: Option<&'static [&'static str]>,
        rules: Rules,
    ) -> Self {
        Self {
            entries: map.map(serde_json::Map::iter),
            fields,
            value: None,
            rules,
        }
    }
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        // A struct's field given `null` is as good as absent (Go left the zero value).
        let struct_fields = self.fields.is_some();
        let Some((key, value)) = self
            .entries
            .as_mut()
            .and_then(|entries| entries.find(|(_, v)| !(struct_fields && v.is_null())))
        else {
            return Ok(None);
        };
        self.value = Some(value);
        let key = match self.fields {
            Some(fields) => field_for(key, fields),
            None => key.as_str(),
        };
        seed.deserialize(BorrowedStrDeserializer::<serde_json::Error>::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| <serde_json::Error as de::Error>::custom("a value was asked for before its key"))?;
        seed.deserialize(GoValue::new(value, self.rules))
    }

    fn size_hint(&self) -> Option<usize> {
        self.entries.as_ref().map(ExactSizeIterator::len)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Host {
        name: String,
        #[serde(default)]
        insecure_ignore_host_key: bool,
        #[serde(default)]
        verify: Option<bool>,
        #[serde(default)]
        port: u16,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        name: String,
        #[serde(default)]
        hosts: Vec<Host>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        host: Option<Host>,
    }

    fn decode<T: for<'de> Deserialize<'de>>(value: &Value) -> Result<T, String> {
        from_value(value, Rules::Yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn keys_fill_fields_without_regard_to_case_but_map_keys_are_kept() {
        let v = json!({"NAME": "kvm", "Hosts": [{"Name": "hv1", "InsecureIgnoreHostKey": true, "PORT": 22}],
                       "labels": {"Geo": "eu"}});
        let e: Entry = decode(&v).unwrap();
        assert_eq!(e.name, "kvm");
        assert_eq!(
            e.hosts,
            [Host {
                name: "hv1".into(),
                insecure_ignore_host_key: true,
                port: 22,
                ..Host::default()
            }]
        );
        assert_eq!(e.labels, BTreeMap::from([("Geo".to_owned(), "eu".to_owned())]));
    }

    #[test]
    fn an_unknown_key_is_still_refused() {
        let err = decode::<Entry>(&json!({"name": "x", "hostz": []})).unwrap_err();
        assert!(err.contains("unknown field `hostz`"), "{err}");
    }

    #[test]
    fn yaml_11_booleans_are_booleans_only_where_one_is_expected() {
        for (text, want) in [
            ("yes", true),
            ("On", true),
            ("Y", true),
            ("no", false),
            ("OFF", false),
            ("n", false),
        ] {
            let h: Host = decode(&json!({"name": "no", "insecureIgnoreHostKey": text, "verify": text})).unwrap();
            assert_eq!((h.insecure_ignore_host_key, h.verify), (want, Some(want)), "{text}");
            // The same word in a string field stays the word.
            assert_eq!(h.name, "no");
        }
        let err = decode::<Host>(&json!({"name": "x", "insecureIgnoreHostKey": "maybe"})).unwrap_err();
        assert!(err.contains("expected a boolean"), "{err}");
    }

    #[test]
    fn numbers_and_booleans_are_taken_by_string_fields_and_not_the_other_way() {
        let h: Host = decode(&json!({"name": 123})).unwrap();
        assert_eq!(h.name, "123");
        let h: Host = decode(&json!({"name": true})).unwrap();
        assert_eq!(h.name, "true");
        // A quoted number is not a number (Go refused it too).
        let err = decode::<Host>(&json!({"name": "x", "port": "22"})).unwrap_err();
        assert!(err.contains("invalid type: string"), "{err}");
    }

    #[test]
    fn null_is_an_empty_map_list_or_struct_and_no_option() {
        let e: Entry = decode(&json!({"name": "x", "hosts": null, "labels": null, "host": null})).unwrap();
        assert_eq!((e.hosts.len(), e.labels.len(), e.host), (0, 0, None));
        // A struct given as null is an empty one: its required fields are then missing.
        let err = decode::<Entry>(&Value::Null).unwrap_err();
        assert!(err.contains("missing field `name`"), "{err}");
    }

    #[test]
    fn json_rules_match_keys_in_any_case_and_convert_no_types() {
        let json = |v: &Value| from_value::<Host>(v, Rules::Json).map_err(|e| e.to_string());
        let h = json(&json!({"Name": "a", "INSECUREIGNOREHOSTKEY": true, "verify": null})).unwrap();
        assert_eq!(
            (h.name.as_str(), h.insecure_ignore_host_key, h.verify),
            ("a", true, None)
        );
        let err = json(&json!({"name": "a", "insecureIgnoreHostKey": "yes"})).unwrap_err();
        assert!(
            err.contains("invalid type: string \"yes\", expected a boolean"),
            "{err}"
        );
        let err = json(&json!({"name": 1})).unwrap_err();
        assert!(err.contains("invalid type: integer `1`, expected a string"), "{err}");
    }

    #[test]
    fn a_null_field_takes_its_default_and_a_fraction_is_no_text() {
        let h: Host =
            decode(&json!({"name": "a", "insecureIgnoreHostKey": null, "port": null, "verify": null})).unwrap();
        assert_eq!(
            h,
            Host {
                name: "a".into(),
                ..Host::default()
            }
        );
        // A required field given null is missing.
        let err = decode::<Host>(&json!({"name": null})).unwrap_err();
        assert!(err.contains("missing field `name`"), "{err}");
        let err = decode::<Host>(&json!({"name": 1.5})).unwrap_err();
        assert!(err.contains("invalid type: floating point"), "{err}");
    }

    #[test]
    fn failures_keep_their_path() {
        let v = json!({"name": "x", "hosts": [{"name": "a"}, {"name": "b", "port": -1}]});
        let err = serde_path_to_error::deserialize::<_, Entry>(GoValue::new(&v, Rules::Yaml)).unwrap_err();
        assert_eq!(err.path().to_string(), "hosts[1].port");
    }
}
