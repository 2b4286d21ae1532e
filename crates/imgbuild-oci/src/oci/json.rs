//! Canonical JSON for everything that is hashed: object keys sorted, no insignificant
//! whitespace. oci-spec keeps labels and annotations in `HashMap`s, whose order changes from
//! run to run; and `serde_json`'s `preserve_order` is on in this build (rattler_shell turns it
//! on), so a `Value` does not sort either. Keys are therefore sorted here, explicitly.

use serde::Serialize;
use serde_json::{Map, Value};

/// Serializes `value` with every object's keys in byte order.
pub(crate) fn canonical_json<T: Serialize>(value: &T) -> serde_json::Result<Vec<u8>> {
    let value = sorted(serde_json::to_value(value)?);
    serde_json::to_vec(&value)
}

fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::new();
            for (key, value) in entries {
                out.insert(key, sorted(value));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn hash_maps_serialize_the_same_every_time() {
        let labels: HashMap<String, String> = (0..32)
            .map(|i| (format!("key{i}"), format!("v\n{i}")))
            .collect();
        let first = canonical_json(&labels).unwrap();
        for _ in 0..20 {
            let again: HashMap<String, String> = labels.clone().into_iter().collect();
            assert_eq!(canonical_json(&again).unwrap(), first);
        }
        let text = String::from_utf8(first).unwrap();
        assert!(
            text.starts_with(r#"{"key0":"v\n0","key1":"v\n1","key10""#),
            "{text}"
        );
    }
}
