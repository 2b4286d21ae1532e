//! conda-lock's unified lock (`conda-lock.yml`, version 1). rattler_lock reads it (it is
//! the format early pixi wrote); what it does not model is conda-lock's `optional`
//! packages (categories such as `dev`), which `conda-lock install` leaves out unless asked.
//! The import leaves them out too, and says so.

use super::pins::Pins;

/// Whether `text` is a conda-lock unified lock rather than a pixi lock: version 1 with a
/// top-level `metadata` and `package` list.
pub(super) fn is_conda_lock(document: &serde_yaml::Value) -> bool {
    document.get("version").and_then(serde_yaml::Value::as_u64) == Some(1)
        && document.get("metadata").is_some()
        && document.get("package").is_some()
}

/// Drops from `pins` the packages conda-lock marks `optional: true`, noting how many and of
/// which categories.
pub(super) fn drop_optional(
    document: &serde_yaml::Value,
    pins: &mut Pins,
    notes: &mut Vec<String>,
) {
    let mut optional: Vec<(String, String)> = Vec::new();
    let mut categories: Vec<String> = Vec::new();
    for package in document
        .get("package")
        .and_then(serde_yaml::Value::as_sequence)
        .into_iter()
        .flatten()
    {
        if package.get("optional").and_then(serde_yaml::Value::as_bool) != Some(true) {
            continue;
        }
        let text = |key: &str| {
            package
                .get(key)
                .and_then(serde_yaml::Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        optional.push((text("platform"), text("name")));
        let category = text("category");
        if !categories.contains(&category) {
            categories.push(category);
        }
    }
    let mut dropped = 0;
    for platform in &mut pins.platforms {
        let before = platform.records.len() + platform.wheels.len();
        let subdir = platform.subdir.as_str();
        let is_optional = |name: &str| optional.iter().any(|(p, n)| p == subdir && n == name);
        platform
            .records
            .retain(|r| !is_optional(r.package_record.name.as_source()));
        platform.wheels.retain(|w| !is_optional(w.name.as_ref()));
        dropped += before - platform.records.len() - platform.wheels.len();
    }
    if dropped > 0 {
        notes.push(format!(
            "{dropped} optional packages (category {}) left out, as `conda-lock install` leaves them out by default",
            categories
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}
