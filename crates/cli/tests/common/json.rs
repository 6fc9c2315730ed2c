//! Reading the JSON reports the commands write.

/// The count at a dotted path of a JSON report (`"requests.ok"`).
pub fn n(v: &serde_json::Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}
