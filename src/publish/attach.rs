//! The SBOMs and the provenance `build` wrote beside a layout, attached to the pushed image
//! as OCI 1.1 referrers (the `remote.Put` of an artifact whose `subject` is the image).

use std::path::PathBuf;

use crate::{
    oci::{
        layout::Layout,
        read::{ManifestContent, ReadError, StoredManifest},
    },
    registry::{
        RegistryError, RepositoryClient,
        push::PushReport,
        referrers::{Attachment, Subject, attach},
    },
    sbom::SbomFormat,
};

/// What a push of one tag will attach: the tag's manifest (or index), read through the
/// layout reader with its digest checked, and the documents beside the layout that name it.
pub(super) struct Documents {
    subject: StoredManifest,
    attachments: Vec<Attachment>,
    /// Documents beside the layout that describe another of its images.
    pub(super) skipped: Vec<PathBuf>,
}

impl Documents {
    /// The documents beside `layout` that describe the image tag `tag` names.
    pub(super) fn beside(layout: &Layout, tag: &str) -> Result<Documents, ReadError> {
        let subject = layout.read_manifest(&layout.entry(tag)?)?;
        let digest = subject.digest();
        let mut documents = Documents {
            subject,
            attachments: Vec::new(),
            skipped: Vec::new(),
        };
        for (path, media_type, predicate_type) in candidates(&layout.dir) {
            // Bounded as a lock is (they list what it lists); a fifo or a device is skipped.
            let Ok(bytes) = crate::fs::read_input(&path, crate::lock::MAX_LOCK_BYTES) else {
                continue;
            };
            // A layout holds many images, but beside it lies what the last build into it
            // wrote: attached to another tag's image it would describe the wrong image.
            if describes(&bytes, &digest) {
                documents.attachments.push(Attachment {
                    media_type,
                    bytes,
                    predicate_type,
                });
            } else {
                documents.skipped.push(path);
            }
        }
        Ok(documents)
    }

    /// Attaches the documents to the pushed image (when it is the one they were read for)
    /// and records their digests in `report`.
    pub(super) async fn attach(
        &self,
        client: &RepositoryClient,
        report: &mut PushReport,
    ) -> Result<(), RegistryError> {
        if self.attachments.is_empty() || self.subject.digest() != report.digest {
            return Ok(());
        }
        let subject = Subject {
            digest: &report.digest,
            size: self.subject.bytes.len() as u64,
            media_type: self.subject.descriptor.media_type().as_ref(),
        };
        let created = created(&self.subject);
        let (digests, found_by) = attach(client, subject, &created, &self.attachments).await?;
        for (attachment, digest) in self.attachments.iter().zip(digests) {
            if attachment.predicate_type.is_some() {
                report.provenance = Some(digest);
            } else {
                report.sboms.push(digest);
            }
        }
        // The attachment's requests and retries count too.
        report.requests = client.requests.load(std::sync::atomic::Ordering::Relaxed);
        report.retries = client.retries.load(std::sync::atomic::Ordering::Relaxed);
        report.sboms_found_by = Some(found_by.name());
        Ok(())
    }
}

/// Where `build` writes each document beside a layout, its media type and predicate type.
fn candidates(layout: &std::path::Path) -> [(PathBuf, &'static str, Option<&'static str>); 3] {
    [
        (
            crate::sbom::path_beside(layout, SbomFormat::Spdx),
            "application/spdx+json",
            None,
        ),
        (
            crate::sbom::path_beside(layout, SbomFormat::Cyclonedx),
            "application/vnd.cyclonedx+json",
            None,
        ),
        (
            crate::provenance::path_beside(layout),
            crate::provenance::MEDIA_TYPE,
            Some(crate::attest::SLSA_PROVENANCE_V1),
        ),
    ]
}

/// The image's creation time, which its artifacts carry too.
fn created(subject: &StoredManifest) -> String {
    let annotations = match &subject.content {
        ManifestContent::Manifest(manifest) => manifest.annotations(),
        ManifestContent::Index(index) => index.annotations(),
    };
    annotations
        .as_ref()
        .and_then(|a| a.get("org.opencontainers.image.created"))
        .map_or_else(|| "1970-01-01T00:00:00Z".to_string(), String::clone)
}

/// Whether a document `build` wrote names the image `digest` (an SPDX `versionInfo` and
/// checksum, a CycloneDX `version` and purl, the provenance's subject all carry it).
fn describes(document: &[u8], digest: &str) -> bool {
    let hex = digest.trim_start_matches("sha256:");
    !hex.is_empty()
        && document
            .windows(hex.len())
            .any(|window| window == hex.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATED: &str = "2024-05-06T07:08:09Z";

    /// A layout at `dir` whose tag `latest` names a one-manifest image, with its SBOM; its
    /// digest.
    fn layout_with_one_image(dir: &std::path::Path) -> String {
        let config = format!("sha256:{}", "c".repeat(64));
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
            "layers": [],
            "annotations": {"org.opencontainers.image.created": CREATED},
        });
        let bytes = serde_json::to_vec(&manifest).unwrap();
        let digest = crate::oci::sha256_digest(&bytes);
        let blobs = dir.join("blobs/sha256");
        fs_err::create_dir_all(&blobs).unwrap();
        fs_err::write(blobs.join(digest.trim_start_matches("sha256:")), &bytes).unwrap();
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": bytes.len(),
                "annotations": {"org.opencontainers.image.ref.name": "latest"},
            }],
        });
        fs_err::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
        // And the SPDX SBOM of that image beside it.
        let spdx = crate::sbom::path_beside(dir, SbomFormat::Spdx);
        fs_err::write(&spdx, format!("{{\"versionInfo\": \"{digest}\"}}")).unwrap();
        digest
    }

    #[test]
    fn the_documents_naming_the_tags_image_are_attached_and_others_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let layout_dir = dir.path().join("app");
        let digest = layout_with_one_image(&layout_dir);
        let cdx = crate::sbom::path_beside(&layout_dir, SbomFormat::Cyclonedx);
        fs_err::write(
            &cdx,
            format!("{{\"version\": \"sha256:{}\"}}", "e".repeat(64)),
        )
        .unwrap();

        let documents = Documents::beside(&Layout::new(&layout_dir), "latest").unwrap();
        assert_eq!(documents.subject.digest(), digest);
        assert_eq!(created(&documents.subject), CREATED);
        let types: Vec<_> = documents.attachments.iter().map(|a| a.media_type).collect();
        assert_eq!(types, ["application/spdx+json"]);
        assert_eq!(documents.skipped, [cdx]);
    }

    #[test]
    fn a_manifest_blob_that_is_not_its_digest_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let layout_dir = dir.path().join("app");
        let digest = layout_with_one_image(&layout_dir);
        // Same size, other bytes: only the digest check can tell.
        let blob = layout_dir
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        let mut bytes = fs_err::read(&blob).unwrap();
        bytes[0] = b'[';
        fs_err::write(&blob, &bytes).unwrap();

        let Err(err) = Documents::beside(&Layout::new(&layout_dir), "latest") else {
            panic!("a corrupted manifest was read");
        };
        assert!(matches!(err, ReadError::Digest { .. }), "{err:?}");
        assert!(err.to_string().contains(&digest), "{err}");
    }
}
