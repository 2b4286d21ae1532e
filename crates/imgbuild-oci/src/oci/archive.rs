//! Single-file exports of an image layout: `oci-archive` (the layout as a tar) and
//! `docker-archive` (`manifest.json` and the blobs under `blobs/sha256/`, the layout
//! `docker save` uses since Docker 25 without its OCI index, which `docker load` and
//! `podman load` read). Deterministic like the layers:
//! sorted entries, fixed metadata, and only the blobs the exported tag needs.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use oci_spec::image::{Descriptor, ImageManifest, MediaType};
use tar::{Builder, EntryType, Header};

use super::{json::canonical_json, layout::Layout, read_error::ReadError};

/// What `build --format` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// An OCI image layout directory (always written).
    Oci,
    /// The layout, plus the same as one tar file (`NAME.oci.tar`).
    OciArchive,
    /// The layout, plus a tar `docker load` and `podman load` accept (`NAME.docker.tar`).
    DockerArchive,
}

impl OutputFormat {
    /// The archive's file name suffix, if this format writes one.
    pub fn archive_suffix(self) -> Option<&'static str> {
        match self {
            OutputFormat::Oci => None,
            OutputFormat::OciArchive => Some("oci.tar"),
            OutputFormat::DockerArchive => Some("docker.tar"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The tag names something other than an image manifest or index.
    #[error("The image layout `{}` has no tag `{tag}`", path.display())]
    NoTag { path: PathBuf, tag: String },
    #[error("A docker-archive holds one platform's image, and tag `{tag}` of `{}` is an image index of several platforms: use `--format oci-archive`, or a recipe with one platform", path.display())]
    SeveralPlatforms { path: PathBuf, tag: String },
    #[error("Failed to write the archive `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What goes in an archive: blobs of the layout by digest, sorted, then small files of its
/// own, sorted by name.
pub(crate) struct ArchiveContents {
    blobs: Vec<String>,
    files: Vec<(String, Vec<u8>)>,
}

/// Writes tag `tag` of `layout` to `out` as `format`; `repo_tag` (`name:tag`) is what
/// `docker load` names the image.
pub fn write_archive(
    layout: &Layout,
    tag: &str,
    repo_tag: &str,
    format: OutputFormat,
    out: &Path,
) -> Result<(), ArchiveError> {
    let entry = layout.entry(tag)?;
    match entry.media_type() {
        MediaType::ImageManifest => {}
        MediaType::ImageIndex if format == OutputFormat::DockerArchive => {
            return Err(ArchiveError::SeveralPlatforms {
                path: layout.dir.clone(),
                tag: tag.to_string(),
            });
        }
        MediaType::ImageIndex => {}
        _ => {
            return Err(ArchiveError::NoTag {
                path: layout.dir.clone(),
                tag: format!("{tag} (an image manifest or index)"),
            });
        }
    }
    let manifests = layout.platform_manifests(&entry)?;
    let mut contents = ArchiveContents {
        blobs: blobs_of(&entry, &manifests),
        files: Vec::new(),
    };
    contents.files = if format == OutputFormat::DockerArchive {
        // A docker-archive is only ever written from one manifest (refused above otherwise).
        docker_files(&manifests[0].1, repo_tag)
    } else {
        oci_files(layout, tag, entry)?
    };
    contents.files.sort();
    write_tar(layout, &contents, out)
}

/// The blobs the tag's entry reaches: itself, its platform manifests, their configs and
/// layers; sorted, each once.
fn blobs_of(entry: &Descriptor, manifests: &[(Descriptor, ImageManifest)]) -> Vec<String> {
    let mut blobs: Vec<String> = vec![entry.digest().to_string()];
    for (descriptor, manifest) in manifests {
        blobs.push(descriptor.digest().to_string());
        blobs.push(manifest.config().digest().to_string());
        blobs.extend(manifest.layers().iter().map(|l| l.digest().to_string()));
    }
    blobs.sort();
    blobs.dedup();
    blobs
}

/// An OCI layout's own files: `oci-layout`, and an `index.json` of this tag only.
fn oci_files(
    layout: &Layout,
    tag: &str,
    entry: Descriptor,
) -> Result<Vec<(String, Vec<u8>)>, ArchiveError> {
    let only_this_tag = super::image::index_of(vec![entry]).map_err(|_| ArchiveError::NoTag {
        path: layout.dir.clone(),
        tag: tag.to_string(),
    })?;
    Ok(vec![
        (
            "index.json".to_string(),
            canonical_json(&only_this_tag).expect("an index serializes"),
        ),
        (
            "oci-layout".to_string(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
    ])
}

/// Docker's own format: `manifest.json` beside the blobs. Without `index.json`, podman
/// reads it as a docker archive and names the image from `RepoTags`.
fn docker_files(manifest: &ImageManifest, repo_tag: &str) -> Vec<(String, Vec<u8>)> {
    let blob_path = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
    let docker_manifest = serde_json::json!([{
        "Config": blob_path(manifest.config().digest().as_ref()),
        "RepoTags": [repo_tag],
        "Layers": manifest.layers().iter().map(|l| blob_path(l.digest().as_ref())).collect::<Vec<_>>(),
    }]);
    vec![(
        "manifest.json".to_string(),
        canonical_json(&docker_manifest).expect("JSON serializes"),
    )]
}

/// A tar header with fixed metadata, so the same contents give the same bytes.
fn header(entry_type: EntryType, size: u64, mode: u32) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(entry_type);
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// Writes `contents` as a tar beside `out` and renames it there: the blob directories, the
/// blobs, then the files.
pub(crate) fn write_tar(
    layout: &Layout,
    contents: &ArchiveContents,
    out: &Path,
) -> Result<(), ArchiveError> {
    let write_err = |source| ArchiveError::Write {
        path: out.to_path_buf(),
        source,
    };
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs_err::create_dir_all(dir).map_err(write_err)?;
    let temp = tempfile::Builder::new()
        .prefix(".archive-")
        .tempfile_in(dir)
        .map_err(write_err)?;
    let mut builder = Builder::new(std::io::BufWriter::new(temp.reopen().map_err(write_err)?));
    for dir_name in ["blobs/", "blobs/sha256/"] {
        builder
            .append_data(
                &mut header(EntryType::Directory, 0, 0o755),
                dir_name,
                std::io::empty(),
            )
            .map_err(write_err)?;
    }
    for digest in &contents.blobs {
        append_blob(&mut builder, layout, digest, out)?;
    }
    for (name, bytes) in &contents.files {
        builder
            .append_data(
                &mut header(EntryType::Regular, bytes.len() as u64, 0o644),
                name,
                bytes.as_slice(),
            )
            .map_err(write_err)?;
    }
    let mut writer = builder.into_inner().map_err(write_err)?;
    writer.flush().map_err(write_err)?;
    drop(writer);
    crate::fs::set_mode(temp.path(), 0o644).map_err(write_err)?;
    temp.persist(out).map_err(|e| write_err(e.error))?;
    Ok(())
}

/// Appends blob `digest` of `layout`, streamed, as `blobs/sha256/<hex>`.
fn append_blob(
    builder: &mut Builder<impl Write>,
    layout: &Layout,
    digest: &str,
    out: &Path,
) -> Result<(), ArchiveError> {
    let write_err = |source| ArchiveError::Write {
        path: out.to_path_buf(),
        source,
    };
    let path = layout.blob_path(digest);
    // Beneath the layout, a regular file: a fifo or a link out of it is not archived.
    let relative = Path::new("blobs/sha256").join(digest.trim_start_matches("sha256:"));
    let file = crate::fs::open_input_beneath(&layout.dir, &relative).map_err(|source| {
        ReadError::Read {
            path: path.clone(),
            source: source.into(),
        }
    })?;
    let size = file.metadata().map_err(write_err)?.len();
    builder
        .append_data(
            &mut header(EntryType::Regular, size, 0o644),
            format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")),
            std::io::BufReader::with_capacity(1 << 20, file),
        )
        .map_err(write_err)
}
