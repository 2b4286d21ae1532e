//! The CycloneDX 1.5 JSON document, built from its parts: the image as the subject, the
//! components (base, conda packages, wheels) and the dependency graph.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{
    BaseEntry, Licence, SbomPackage, SbomSubject, base_entries, channel_url, content_digest,
    content_uuid, oci_purl, packages, timestamp, wheel_purl, wheels,
};
use crate::lock::{Lock, ResolvedWheel};

/// The `bom-ref` of the image, the BOM's subject.
const IMAGE_REF: &str = "image";

/// The CycloneDX 1.5 document: the image as the BOM's subject, its conda packages and base
/// as components, and the dependency graph.
pub(super) fn document(lock: &Lock, subject: &SbomSubject) -> Value {
    let packages = packages(lock);
    let bases = base_entries(lock, subject);
    let wheels = wheels(lock);

    let mut components: Vec<Value> = bases.iter().map(base_component).collect();
    components.extend(packages.iter().map(conda_component));
    components.extend(wheels.iter().map(|wheel| wheel_component(wheel)));
    // Beside the image, not in it: listed, but not among what the image depends on.
    components.extend(
        super::models::models(&subject.models)
            .iter()
            .map(super::models::cyclonedx_component),
    );
    // The image depends on every component, in the order they are listed.
    let image_depends: Vec<String> = bases
        .iter()
        .map(|base| base.purl.clone())
        .chain(packages.iter().map(|package| package.purl.clone()))
        .chain(wheels.iter().map(|wheel| wheel_purl(wheel)))
        .collect();

    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": format!("urn:uuid:{}", content_uuid(&content_digest(lock, subject))),
        "version": 1,
        "metadata": {
            "timestamp": timestamp(subject.created),
            "tools": {
                "components": [{
                    "type": "application",
                    "name": "imgbuild",
                    "version": env!("CARGO_PKG_VERSION"),
                }],
            },
            "component": image_component(subject),
        },
        "components": components,
        "dependencies": dependencies(image_depends, &packages),
    })
}

/// The image itself; a built image is pinned by its manifest digest, a BOM made from a lock
/// alone has none to state.
fn image_component(subject: &SbomSubject) -> Value {
    let mut image = json!({
        "type": "container",
        "bom-ref": IMAGE_REF,
        "name": subject.name,
    });
    if let Some(image_digest) = &subject.image_digest {
        image["version"] = json!(image_digest);
        image["purl"] = json!(oci_purl(&subject.name, image_digest, &[]));
        image["hashes"] = json!([{
            "alg": "SHA-256",
            "content": image_digest.trim_start_matches("sha256:"),
        }]);
    }
    image
}

fn base_component(base: &BaseEntry) -> Value {
    json!({
        "type": "container",
        "bom-ref": base.purl,
        "name": base.name,
        "version": base.digest,
        "purl": base.purl,
        "hashes": [{"alg": "SHA-256", "content": base.digest.trim_start_matches("sha256:")}],
        "description": base.description,
    })
}

fn conda_component(package: &SbomPackage<'_>) -> Value {
    let record = package.record;
    let mut hashes = vec![json!({"alg": "SHA-256", "content": package.sha256})];
    if let Some(md5) = &package.md5 {
        hashes.push(json!({"alg": "MD5", "content": md5}));
    }
    let mut component = json!({
        "type": "library",
        "bom-ref": package.purl,
        "name": package.name,
        "version": record.package_record.version.to_string(),
        "purl": package.purl,
        "hashes": hashes,
        "externalReferences": [{"type": "distribution", "url": record.url.as_str()}],
        "properties": [
            {"name": "conda:build", "value": record.package_record.build},
            {"name": "conda:channel", "value": channel_url(record)},
            {"name": "conda:subdir", "value": record.package_record.subdir},
            {"name": "conda:file_name", "value": record.identifier.to_string()},
        ],
    });
    match &package.licence {
        Licence::Expression(expression) => {
            component["licenses"] = json!([{"expression": expression}]);
        }
        Licence::Text { text, .. } => {
            component["licenses"] = json!([{"license": {"name": text}}]);
        }
        Licence::None => {}
    }
    component
}

fn wheel_component(wheel: &ResolvedWheel) -> Value {
    let purl = wheel_purl(wheel);
    json!({
        "type": "library",
        "bom-ref": purl,
        "name": wheel.name.to_string(),
        "version": wheel.version.to_string(),
        "purl": purl,
        "hashes": [{"alg": "SHA-256", "content": hex::encode(wheel.sha256)}],
        "externalReferences": [{"type": "distribution", "url": wheel.url.as_str()}],
        "properties": [{"name": "pypi:file_name", "value": wheel.filename}],
    })
}

/// The dependency graph: the image on `image_depends`, each conda package on the locked
/// packages it names.
fn dependencies(image_depends: Vec<String>, packages: &[SbomPackage<'_>]) -> Vec<Value> {
    let purls: BTreeMap<&str, &str> = packages
        .iter()
        .map(|p| (p.name.as_str(), p.purl.as_str()))
        .collect();
    let mut dependencies = vec![json!({"ref": IMAGE_REF, "dependsOn": image_depends})];
    for package in packages {
        dependencies.push(json!({
            "ref": package.purl,
            "dependsOn": package.depends.iter().map(|d| purls[d.as_str()]).collect::<Vec<_>>(),
        }));
    }
    dependencies
}
