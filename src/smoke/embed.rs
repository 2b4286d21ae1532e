//! `[smoke] embed = true`: the `imgbuild-smoke` executable (crate `imgbuild-smoke`) as a
//! layer of its own, so the smoke test runs inside the image on a cluster node
//! (`imgbuild k8s --smoke-job`).
//!
//! The executable is dynamically linked against glibc (it `dlopen`s the host driver, which a
//! static binary cannot), so before it goes into an image it is read as ELF: it must be built
//! for the image's architecture, and need no newer glibc than the image has. Release builds
//! are linked against glibc 2.17 (`cargo zigbuild`), which every glibc image satisfies.

use std::{
    path::{Path, PathBuf},
    str::FromStr,
};

use object::{
    Endianness,
    elf::{self, FileHeader64},
    read::elf::FileHeader,
};
use rattler_conda_types::{Subdir, Version};

use crate::layers::{LayerKind, PlannedLayer};

// Where the executable lies in the image and its layer's name: the image writer (`oci`)
// names them too, so they are defined there, below both.
pub use crate::layers::smoke_layer::{IN_IMAGE_PATH, LAYER_NAME, in_image_path};
/// The environment variable naming the executable to embed (also `--smoke-exe`).
pub const EXE_ENV: &str = "IMGBUILD_SMOKE_EXE";
/// The layer's modification time. Fixed rather than the image's `created`, so every image
/// embedding the same executable carries the same layer blob, stored once by registries.
/// One second past the epoch, as jib does, since some tools read 0 as "unset".
const LAYER_MTIME: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(
        "`[smoke] embed = true` needs the `imgbuild-smoke` executable: none at `{}`; build it with `just smoke-exe` and pass it with --smoke-exe or {EXE_ENV} (one per architecture)",
        looked.display()
    )]
    NotFound { looked: PathBuf },
    #[error("Failed to read the smoke executable `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("The smoke executable `{}` is not a 64-bit ELF executable: {reason}", path.display())]
    NotElf { path: PathBuf, reason: String },
    #[error(
        "The smoke executable `{}` is built for {found}, but the image is for `{platform}` ({expected}); build one for that target (`just smoke-exe` builds x86-64 and aarch64) and pass both",
        path.display()
    )]
    WrongArchitecture {
        path: PathBuf,
        found: String,
        expected: &'static str,
        platform: Subdir,
    },
    #[error(
        "The smoke executable `{}` needs glibc {needs}, but the image has glibc {image}; build it for an older glibc (`just smoke-exe` targets 2.17)",
        path.display()
    )]
    GlibcTooNew {
        path: PathBuf,
        needs: String,
        image: String,
    },
    #[error(
        "`[smoke] embed = true` needs an image with glibc (the executable loads the NVIDIA driver, which only a dynamically linked program can); the base has none: use a glibc base, or set `[image] glibc` if it has one that was not found"
    )]
    NoGlibc,
    #[error("Failed to put the smoke executable into the staging tree at `{}`", path.display())]
    Stage {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The executable to embed, read and checked as ELF.
#[derive(Debug, Clone)]
pub struct SmokeExecutable {
    pub path: PathBuf,
    /// Its `sha256:…`, which a build records: another executable is another image.
    pub digest: String,
    pub size: u64,
    pub machine: elf::Machine,
    /// The newest `GLIBC_x.y` symbol version it needs; `None` when it needs none.
    pub glibc: Option<Version>,
}

/// The executables `explicit` names, else `imgbuild-smoke` and every `imgbuild-smoke-*` beside
/// the running imgbuild (where a release puts them, one per architecture).
pub fn locate(explicit: &[PathBuf]) -> Result<Vec<PathBuf>, EmbedError> {
    if let Some(missing) = explicit.iter().find(|path| !path.is_file()) {
        return Err(EmbedError::NotFound {
            looked: missing.clone(),
        });
    }
    if !explicit.is_empty() {
        return Ok(explicit.to_vec());
    }
    let dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let mut found: Vec<PathBuf> = fs_err::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|name| {
                    name == "imgbuild-smoke"
                        || (name.starts_with("imgbuild-smoke-") && !name.ends_with(".d"))
                })
                && path.is_file()
        })
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(EmbedError::NotFound {
            looked: dir.join("imgbuild-smoke"),
        });
    }
    Ok(found)
}

/// The executables a build may embed, one per architecture: each platform of the image gets
/// the one built for it.
#[derive(Debug, Clone)]
pub struct SmokeExecutables(Vec<SmokeExecutable>);

impl SmokeExecutables {
    /// Reads the executables [`locate`] finds.
    pub fn find(explicit: &[PathBuf]) -> Result<Self, EmbedError> {
        locate(explicit)?
            .iter()
            .map(|path| SmokeExecutable::read(path))
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// The executable for `platform`, checked against the image's glibc.
    pub fn for_platform(
        &self,
        platform: Subdir,
        image_glibc: Option<&Version>,
    ) -> Result<&SmokeExecutable, EmbedError> {
        let (machine, _) = expected_machine(platform);
        let executable = self
            .0
            .iter()
            .find(|e| e.machine == machine)
            .unwrap_or(&self.0[0]);
        executable.check(platform, image_glibc)?;
        Ok(executable)
    }
}

/// The ELF machine of `platform`'s executables, and its name.
fn expected_machine(platform: Subdir) -> (elf::Machine, &'static str) {
    match platform {
        Subdir::Linux64 => (elf::EM_X86_64, "x86-64"),
        Subdir::LinuxAarch64 => (elf::EM_AARCH64, "aarch64"),
        Subdir::LinuxPpc64le => (elf::EM_PPC64, "ppc64le"),
        _ => (
            elf::EM_NONE,
            "an architecture imgbuild-smoke is not built for",
        ),
    }
}

impl SmokeExecutable {
    /// Reads `path`: its digest, architecture and glibc needs.
    pub fn read(path: &Path) -> Result<SmokeExecutable, EmbedError> {
        // The operator names it; an executable of more than 256 MiB is not this one.
        let data = crate::fs::read_input(path, 256 << 20).map_err(|err| EmbedError::Read {
            path: path.to_path_buf(),
            source: err.into(),
        })?;
        let not_elf = |reason: String| EmbedError::NotElf {
            path: path.to_path_buf(),
            reason,
        };
        let header =
            FileHeader64::<Endianness>::parse(&*data).map_err(|e| not_elf(e.to_string()))?;
        let endian = header.endian().map_err(|e| not_elf(e.to_string()))?;
        let machine = header.e_machine(endian);
        let sections = header
            .sections(endian, &*data)
            .map_err(|e| not_elf(e.to_string()))?;
        let mut glibc: Option<Version> = None;
        if let Some((mut needs, link)) = sections
            .gnu_verneed(endian, &*data)
            .map_err(|e| not_elf(e.to_string()))?
        {
            let strings = sections
                .strings(endian, &*data, link)
                .map_err(|e| not_elf(e.to_string()))?;
            while let Some((_, mut auxes)) = needs.next().map_err(|e| not_elf(e.to_string()))? {
                while let Some(aux) = auxes.next().map_err(|e| not_elf(e.to_string()))? {
                    let name = aux
                        .name(endian, strings)
                        .map_err(|e| not_elf(e.to_string()))?;
                    let version = std::str::from_utf8(name)
                        .ok()
                        .and_then(|n| n.strip_prefix("GLIBC_"))
                        .and_then(|v| Version::from_str(v).ok());
                    if let Some(version) = version
                        && glibc.as_ref().is_none_or(|newest| &version > newest)
                    {
                        glibc = Some(version);
                    }
                }
            }
        }
        Ok(SmokeExecutable {
            path: path.to_path_buf(),
            digest: crate::oci::sha256_digest(&data),
            size: data.len() as u64,
            machine,
            glibc,
        })
    }

    /// Whether it can run in an image for `platform` whose glibc is `image_glibc`.
    pub fn check(&self, platform: Subdir, image_glibc: Option<&Version>) -> Result<(), EmbedError> {
        let (expected_machine, expected) = expected_machine(platform);
        if self.machine != expected_machine {
            return Err(EmbedError::WrongArchitecture {
                path: self.path.clone(),
                found: machine_name(self.machine),
                expected,
                platform,
            });
        }
        let Some(image) = image_glibc else {
            return Err(EmbedError::NoGlibc);
        };
        match &self.glibc {
            Some(needs) if needs > image => Err(EmbedError::GlibcTooNew {
                path: self.path.clone(),
                needs: needs.to_string(),
                image: image.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Copies the executable into the staging tree at `root` and plans its layer.
    pub fn stage(&self, root: &Path) -> Result<PlannedLayer, EmbedError> {
        let target = root.join(IN_IMAGE_PATH);
        let stage_err = |source| EmbedError::Stage {
            path: target.clone(),
            source,
        };
        if let Some(parent) = target.parent() {
            fs_err::create_dir_all(parent).map_err(stage_err)?;
        }
        fs_err::copy(&self.path, &target).map_err(stage_err)?;
        crate::fs::set_mode(&target, 0o755).map_err(stage_err)?;
        Ok(PlannedLayer {
            kind: LayerKind::Smoke,
            name: LAYER_NAME.to_string(),
            packages: Vec::new(),
            paths: vec![IN_IMAGE_PATH.to_string()],
            mtime: LAYER_MTIME,
            size: self.size,
            part: None,
        })
    }
}

fn machine_name(machine: elf::Machine) -> String {
    match machine {
        elf::EM_X86_64 => "x86-64".to_string(),
        elf::EM_AARCH64 => "aarch64".to_string(),
        elf::EM_PPC64 => "ppc64".to_string(),
        elf::EM_386 => "i386".to_string(),
        other => format!("ELF machine {}", other.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary itself is an x86-64 (or whatever this host is) ELF linked to glibc.
    #[test]
    fn reads_the_running_executable() {
        let exe = std::env::current_exe().unwrap();
        let read = SmokeExecutable::read(&exe).unwrap();
        let glibc = read.glibc.clone().expect("a glibc-linked test binary");
        assert!(glibc >= Version::from_str("2.2.5").unwrap(), "{glibc}");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(read.machine, elf::EM_X86_64);
            read.check(Subdir::Linux64, Some(&glibc)).unwrap();
            let older = Version::from_str("2.1").unwrap();
            let err = read.check(Subdir::Linux64, Some(&older)).unwrap_err();
            assert!(matches!(err, EmbedError::GlibcTooNew { .. }), "{err}");
            let err = read.check(Subdir::LinuxAarch64, Some(&glibc)).unwrap_err();
            assert!(err.to_string().contains("built for x86-64"), "{err}");
            assert!(matches!(
                read.check(Subdir::Linux64, None),
                Err(EmbedError::NoGlibc)
            ));
        }
    }

    #[test]
    fn refuses_what_is_not_an_elf_executable() {
        let temp = tempfile::NamedTempFile::new().unwrap();
        fs_err::write(temp.path(), b"#!/bin/sh\necho smoke\n").unwrap();
        let err = SmokeExecutable::read(temp.path()).unwrap_err();
        assert!(matches!(err, EmbedError::NotElf { .. }), "{err}");
        let err = locate(&[PathBuf::from("/nonexistent/imgbuild-smoke")]).unwrap_err();
        assert!(err.to_string().contains("just smoke-exe"), "{err}");
    }
}
