//! The ModelPack config of a model, as far as its files say: the format from their names,
//! the architecture from `config.json`, the parameter count and precision from the
//! safetensors headers. A file that does not parse says nothing; it is not an error, since
//! the weights are shipped as they are either way.

use serde_json::{Map, Value, json};

use super::source::ModelFile;

/// The most bytes read of `config.json`, and of a safetensors header.
const MAX_CONFIG: u64 = 4 << 20;
const MAX_HEADER: u64 = 100 << 20;

/// `descriptor` and `config` of the model `name`, created at `created` (RFC 3339).
pub(crate) fn model_config(name: &str, created: &str, files: &[ModelFile]) -> Value {
    let mut config = Map::new();
    let formats: Vec<&str> = files.iter().filter_map(|f| format_of(&f.path)).collect();
    if let Some(format) = formats.first() {
        config.insert("format".into(), json!(format));
    }
    if let Some(architecture) = files
        .iter()
        .find(|f| f.path == "config.json")
        .and_then(architecture)
    {
        config.insert("architecture".into(), json!(architecture));
    }
    let tensors: Vec<Tensors> = files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
        .filter_map(safetensors_header)
        .collect();
    if !tensors.is_empty() {
        let params: u64 = tensors.iter().map(|t| t.params).sum();
        config.insert("paramSize".into(), json!(human_count(params)));
        if let Some(dtype) = majority_dtype(&tensors) {
            config.insert("precision".into(), json!(dtype));
        }
    }
    json!({
        "descriptor": {"name": name, "createdAt": created},
        "config": config,
    })
}

fn format_of(path: &str) -> Option<&'static str> {
    let ext = path.rsplit_once('.').map(|(_, e)| e)?;
    Some(match ext {
        "safetensors" => "safetensors",
        "gguf" => "gguf",
        "onnx" => "onnx",
        "pt" | "pth" | "bin" => "pytorch",
        _ => return None,
    })
}

/// `architectures[0]`, else `model_type`, of a Hugging Face `config.json`.
fn architecture(file: &ModelFile) -> Option<String> {
    let bytes = file
        .file
        .context
        .read_bounded(&file.file.path, MAX_CONFIG)
        .ok()?;
    let config: Value = serde_json::from_slice(&bytes).ok()?;
    config["architectures"][0]
        .as_str()
        .or(config["model_type"].as_str())
        .map(str::to_string)
}

/// What one safetensors header says: its parameters and their bytes by dtype.
struct Tensors {
    params: u64,
    by_dtype: Vec<(String, u64)>,
}

/// The header of a safetensors file: 8 bytes of little-endian length, then that much JSON
/// mapping each tensor to its dtype and shape.
fn safetensors_header(file: &ModelFile) -> Option<Tensors> {
    use std::io::Read;
    let mut opened = file.file.open_sized(file.size).ok()?;
    let mut length = [0u8; 8];
    opened.read_exact(&mut length).ok()?;
    let length = u64::from_le_bytes(length);
    if length > MAX_HEADER || length > file.size.saturating_sub(8) {
        return None;
    }
    let mut header = vec![0u8; usize::try_from(length).ok()?];
    opened.read_exact(&mut header).ok()?;
    let header: Map<String, Value> = serde_json::from_slice(&header).ok()?;
    let mut tensors = Tensors {
        params: 0,
        by_dtype: Vec::new(),
    };
    for (name, tensor) in &header {
        if name == "__metadata__" {
            continue;
        }
        let shape = tensor["shape"].as_array()?;
        let count = shape
            .iter()
            .try_fold(1u64, |n, d| d.as_u64().and_then(|d| n.checked_mul(d)))?;
        tensors.params = tensors.params.checked_add(count)?;
        let dtype = tensor["dtype"].as_str()?.to_string();
        match tensors.by_dtype.iter_mut().find(|(d, _)| *d == dtype) {
            Some((_, n)) => *n += count,
            None => tensors.by_dtype.push((dtype, count)),
        }
    }
    Some(tensors)
}

/// The dtype most parameters have, as ModelPack writes precisions (`float16`, `bfloat16`).
fn majority_dtype(tensors: &[Tensors]) -> Option<String> {
    let mut totals: Vec<(String, u64)> = Vec::new();
    for (dtype, count) in tensors.iter().flat_map(|t| &t.by_dtype) {
        match totals.iter_mut().find(|(d, _)| d == dtype) {
            Some((_, n)) => *n += count,
            None => totals.push((dtype.clone(), *count)),
        }
    }
    totals.sort_by(|(da, a), (db, b)| b.cmp(a).then(da.cmp(db)));
    let (dtype, _) = totals.first()?;
    Some(
        match dtype.as_str() {
            "F16" => "float16",
            "BF16" => "bfloat16",
            "F32" => "float32",
            "F64" => "float64",
            "I8" => "int8",
            "U8" => "uint8",
            other => return Some(other.to_ascii_lowercase()),
        }
        .to_string(),
    )
}

/// `1.2M`, `7B`, `350K`, `12`: a parameter count as model names give it.
fn human_count(n: u64) -> String {
    let units = [
        (1_000_000_000_000u64, "T"),
        (1_000_000_000, "B"),
        (1_000_000, "M"),
        (1_000, "K"),
    ];
    for (scale, unit) in units {
        if n >= scale {
            let whole = n / scale;
            let tenth = (n % scale) * 10 / scale;
            return match (whole < 100, tenth) {
                (true, t) if t > 0 => format!("{whole}.{t}{unit}"),
                _ => format!("{whole}{unit}"),
            };
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_model_names_give_them() {
        assert_eq!(human_count(12), "12");
        assert_eq!(human_count(350_000), "350K");
        assert_eq!(human_count(1_234_567), "1.2M");
        assert_eq!(human_count(7_000_000_000), "7B");
        assert_eq!(human_count(123_456_789), "123M");
    }

    #[test]
    fn formats_come_from_names() {
        assert_eq!(
            format_of("model-00001-of-00002.safetensors"),
            Some("safetensors")
        );
        assert_eq!(format_of("ggml-model.gguf"), Some("gguf"));
        assert_eq!(format_of("config.json"), None);
    }
}
