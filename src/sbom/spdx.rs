//! The SPDX 2.3 JSON document, built from its parts: the packages (the image, its base, its
//! conda packages and wheels), the relationships between them, and the licence texts that
//! are not SPDX expressions.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::{
    BaseEntry, Licence, SbomPackage, SbomSubject, base_entries, content_digest, content_uuid,
    download_location, oci_purl, package_spdx_id, packages, spdx_id_part, timestamp, tool,
    wheel_purl, wheels,
};
use crate::lock::{Lock, ResolvedWheel};

/// The SPDX id of the image, the package the document describes.
const IMAGE_ID: &str = "SPDXRef-Image";

/// The SPDX 2.3 document: the image as the described package, every conda package it
/// contains, the base image it descends from, and dependencies between packages.
pub(super) fn document(lock: &Lock, subject: &SbomSubject) -> Value {
    let packages = packages(lock);
    let bases = base_entries(lock, subject);
    let wheels = wheels(lock);

    let mut spdx_packages = vec![image_package(subject)];
    spdx_packages.extend(bases.iter().map(base_package));
    spdx_packages.extend(packages.iter().map(conda_package));
    spdx_packages.extend(wheels.iter().map(|wheel| wheel_package(wheel)));
    let mut relationships = relationships(&bases, &packages, &wheels);
    let mut described = vec![IMAGE_ID.to_string()];
    for model in super::models::models(&subject.models) {
        let (model_packages, contains) = super::models::spdx_packages(&model);
        let id = super::models::spdx_id(&model);
        relationships.push(relationship("SPDXRef-DOCUMENT", "DESCRIBES", &id));
        relationships.extend(
            contains
                .iter()
                .map(|(model, file)| relationship(model, "CONTAINS", file)),
        );
        spdx_packages.extend(model_packages);
        described.push(id);
    }
    let extracted = extracted_licences(&packages);

    let mut document = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": subject.name,
        "documentNamespace": format!(
            "https://spdx.org/spdxdocs/imgbuild/{}-{}",
            spdx_id_part(&subject.name),
            content_uuid(&content_digest(lock, subject))
        ),
        "creationInfo": {
            "created": timestamp(subject.created),
            "creators": [format!("Tool: {}", tool())],
            "comment": "Generated from the imgbuild lock file; every conda package is pinned by URL and sha256",
        },
        "documentDescribes": described,
        "packages": spdx_packages,
        "relationships": relationships,
    });
    if !extracted.is_empty() {
        document["hasExtractedLicensingInfos"] = json!(extracted);
    }
    document
}

/// The image itself; a built image is pinned by its manifest digest, an SBOM made from a
/// lock alone has none to state.
fn image_package(subject: &SbomSubject) -> Value {
    let mut image = json!({
        "SPDXID": IMAGE_ID,
        "name": subject.name,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "primaryPackagePurpose": "CONTAINER",
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
    });
    if let Some(image_digest) = &subject.image_digest {
        image["versionInfo"] = json!(image_digest);
        image["checksums"] = json!([{
            "algorithm": "SHA256",
            "checksumValue": image_digest.trim_start_matches("sha256:"),
        }]);
        image["externalRefs"] = json!([{
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": oci_purl(&subject.name, image_digest, &[]),
        }]);
    }
    image
}

fn base_spdx_id(base: &BaseEntry) -> String {
    format!("SPDXRef-{}", base.id)
}

fn base_package(base: &BaseEntry) -> Value {
    json!({
        "SPDXID": base_spdx_id(base),
        "name": base.name,
        "versionInfo": base.digest,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "primaryPackagePurpose": "CONTAINER",
        "checksums": [{
            "algorithm": "SHA256",
            "checksumValue": base.digest.trim_start_matches("sha256:"),
        }],
        "externalRefs": [{
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": base.purl,
        }],
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "comment": base.description,
    })
}

fn conda_package(package: &SbomPackage<'_>) -> Value {
    let record = package.record;
    let mut checksums = vec![json!({"algorithm": "SHA256", "checksumValue": package.sha256})];
    if let Some(md5) = &package.md5 {
        checksums.push(json!({"algorithm": "MD5", "checksumValue": md5}));
    }
    json!({
        "SPDXID": package_spdx_id(package),
        "name": package.name,
        "versionInfo": record.package_record.version.to_string(),
        "packageFileName": record.identifier.to_string(),
        "downloadLocation": download_location(&record.url),
        "filesAnalyzed": false,
        "primaryPackagePurpose": "LIBRARY",
        "checksums": checksums,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": declared_licence(&package.licence),
        "copyrightText": "NOASSERTION",
        "sourceInfo": format!(
            "conda package {} build {} for {} from {}",
            package.name,
            record.package_record.build,
            record.package_record.subdir,
            record.url
        ),
        "externalRefs": [{
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": package.purl,
        }],
    })
}

/// A package's `licenseDeclared`: its expression, the `LicenseRef-` of its free text (listed
/// in [`extracted_licences`]), or NOASSERTION.
fn declared_licence(licence: &Licence) -> String {
    match licence {
        Licence::Expression(expression) => expression.clone(),
        Licence::Text { reference, .. } => reference.clone(),
        Licence::None => "NOASSERTION".to_string(),
    }
}

/// The free-text licences the packages refer to, each once, in the order first referred to.
fn extracted_licences(packages: &[SbomPackage<'_>]) -> Vec<Value> {
    let mut references = BTreeSet::new();
    packages
        .iter()
        .filter_map(|package| match &package.licence {
            Licence::Text { reference, text } if references.insert(reference.clone()) => {
                Some(json!({
                    "licenseId": reference,
                    "name": text,
                    "extractedText": text,
                }))
            }
            _ => None,
        })
        .collect()
}

fn wheel_spdx_id(wheel: &ResolvedWheel) -> String {
    let sha256 = hex::encode(wheel.sha256);
    format!(
        "SPDXRef-Package-pypi-{}-{}",
        spdx_id_part(wheel.name.as_ref()),
        &sha256[..8]
    )
}

fn wheel_package(wheel: &ResolvedWheel) -> Value {
    json!({
        "SPDXID": wheel_spdx_id(wheel),
        "name": wheel.name.to_string(),
        "versionInfo": wheel.version.to_string(),
        "packageFileName": wheel.filename,
        "downloadLocation": download_location(&wheel.url),
        "filesAnalyzed": false,
        "primaryPackagePurpose": "LIBRARY",
        "checksums": [{"algorithm": "SHA256", "checksumValue": hex::encode(wheel.sha256)}],
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "sourceInfo": format!("PyPI wheel {} from {}", wheel.filename, wheel.url),
        "externalRefs": [{
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": wheel_purl(wheel),
        }],
    })
}

/// The document describes the image; the image descends from its base and contains every
/// package; and each conda package depends on the locked packages it names.
fn relationships(
    bases: &[BaseEntry],
    packages: &[SbomPackage<'_>],
    wheels: &[&ResolvedWheel],
) -> Vec<Value> {
    let mut relationships = vec![relationship("SPDXRef-DOCUMENT", "DESCRIBES", IMAGE_ID)];
    for base in bases {
        relationships.push(relationship(IMAGE_ID, "DESCENDANT_OF", &base_spdx_id(base)));
    }
    for package in packages {
        relationships.push(relationship(
            IMAGE_ID,
            "CONTAINS",
            &package_spdx_id(package),
        ));
    }
    for wheel in wheels {
        relationships.push(relationship(IMAGE_ID, "CONTAINS", &wheel_spdx_id(wheel)));
    }
    let ids: BTreeMap<&str, String> = packages
        .iter()
        .map(|p| (p.name.as_str(), package_spdx_id(p)))
        .collect();
    for package in packages {
        for dependency in &package.depends {
            relationships.push(relationship(
                &ids[package.name.as_str()],
                "DEPENDS_ON",
                &ids[dependency.as_str()],
            ));
        }
    }
    relationships
}

fn relationship(element: &str, kind: &str, related: &str) -> Value {
    json!({
        "spdxElementId": element,
        "relationshipType": kind,
        "relatedSpdxElement": related,
    })
}
