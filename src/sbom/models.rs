//! The models shipped beside the image, as both formats list them: each model a package (SPDX)
//! or a `machine-learning-model` component (CycloneDX) holding its files, each file with the
//! sha256 the lock pins. The models are not in the image, so the image does not contain
//! them: the document describes them beside it.

use serde_json::{Value, json};

use crate::lock::ModelPin;

/// One model: its name and its pinned files, in the lock's order.
pub(super) struct SbomModel<'a> {
    pub name: &'a str,
    pub files: Vec<&'a ModelPin>,
}

/// The pins grouped by model, models in the lock's (the recipe's) order.
pub(super) fn models(pins: &[ModelPin]) -> Vec<SbomModel<'_>> {
    let mut models: Vec<SbomModel<'_>> = Vec::new();
    for pin in pins {
        match models.last_mut() {
            Some(model) if model.name == pin.model => model.files.push(pin),
            _ => models.push(SbomModel {
                name: &pin.model,
                files: vec![pin],
            }),
        }
    }
    models
}

fn hex_of(pin: &ModelPin) -> &str {
    pin.sha256.trim_start_matches("sha256:")
}

/// The SPDX id of a model; model names are DNS labels, so valid id characters already.
pub(super) fn spdx_id(model: &SbomModel<'_>) -> String {
    format!("SPDXRef-Model-{}", model.name)
}

/// The model's package and one package per file (an SPDX file would need a SHA1 the lock
/// does not pin), and the model's CONTAINS relationships to them.
pub(super) fn spdx_packages(model: &SbomModel<'_>) -> (Vec<Value>, Vec<(String, String)>) {
    let id = spdx_id(model);
    let mut packages = vec![json!({
        "SPDXID": id,
        "name": model.name,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "primaryPackagePurpose": "OTHER",
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "comment": "Model weights shipped beside the image as an OCI layout of their own (imgbuild [[models]])",
    })];
    let mut contains = Vec::new();
    for (index, file) in model.files.iter().enumerate() {
        let file_id = format!("{id}-{}", index + 1);
        packages.push(json!({
            "SPDXID": file_id,
            "name": format!("{}/{}", model.name, file.path),
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "primaryPackagePurpose": "FILE",
            "checksums": [{"algorithm": "SHA256", "checksumValue": hex_of(file)}],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
        }));
        contains.push((id.clone(), file_id));
    }
    (packages, contains)
}

/// The model as a CycloneDX 1.5 `machine-learning-model` component, its files as `file`
/// components inside it.
pub(super) fn cyclonedx_component(model: &SbomModel<'_>) -> Value {
    let files: Vec<Value> = model
        .files
        .iter()
        .map(|file| {
            json!({
                "type": "file",
                "bom-ref": format!("model:{}/{}", model.name, file.path),
                "name": file.path,
                "hashes": [{"alg": "SHA-256", "content": hex_of(file)}],
                "properties": [{"name": "imgbuild:size", "value": file.size.to_string()}],
            })
        })
        .collect();
    json!({
        "type": "machine-learning-model",
        "bom-ref": format!("model:{}", model.name),
        "name": model.name,
        "components": files,
    })
}
