//! The framework part of `imgbuild smoke`: the image unpacked into a private root
//! ([`super::unpack`]), its own Python found on its own `PATH`, and each framework it holds
//! asked in the [`super::sandbox`] (the checks are `imgbuild_smoke::framework`'s).

use std::path::Path;

use imgbuild_smoke::framework::{FrameworkCheck, check_all};

use super::{sandbox::Sandbox, unpack};
use crate::oci::{annotations, base::BaseImage};

/// Whether `smoke` asks the image's frameworks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrameworkMode {
    /// When a layer of the image holds a known framework's package.
    #[default]
    Auto,
    On,
    Off,
}

/// Package names (conda or PyPI, normalized) that hold a known framework.
const FRAMEWORK_PACKAGES: &[&str] = &["pytorch", "torch", "cupy", "jax", "jaxlib"];

impl FrameworkMode {
    pub fn wants(self, image: &BaseImage) -> bool {
        match self {
            FrameworkMode::On => true,
            FrameworkMode::Off => false,
            FrameworkMode::Auto => holds_framework(image),
        }
    }
}

/// Whether a layer's [`annotations::PACKAGES`] names a framework package
/// (`pytorch-2.1.0-py3.9_0`, `pypi:torch-2.1.0`, `pypi:cupy_cuda12x-13.3.0`).
fn holds_framework(image: &BaseImage) -> bool {
    image
        .layers
        .iter()
        .filter_map(|layer| layer.annotations().as_ref()?.get(annotations::PACKAGES))
        .flat_map(|list| list.split(','))
        .any(|label| {
            let label = label.trim().trim_start_matches("pypi:");
            let name = label.split_once(['-', '_']).map_or(label, |(name, _)| name);
            FRAMEWORK_PACKAGES.contains(&name.to_lowercase().as_str())
        })
}

/// Checks the frameworks of `image`, run by `exe` (this executable) as the sandbox, with
/// the image's forward-compatibility libraries first when `compat_first` (the decision of
/// `imgbuild_smoke::forward_compat`). An image with no Python gives no checks.
pub fn check_frameworks(
    image: &BaseImage,
    exe: &Path,
    compat_first: bool,
) -> Result<Vec<FrameworkCheck>, unpack::UnpackError> {
    let root = unpack::unpack(image)?;
    let config = image.config.config().as_ref();
    let env: Vec<String> = config.and_then(|c| c.env().clone()).unwrap_or_default();
    let user = config.and_then(|c| c.user().as_deref());
    let Some(python) = find_python(root.path(), &env) else {
        return Ok(Vec::new());
    };
    let sandbox = Sandbox::for_image(root.path(), user, &env, compat_first);
    Ok(check_all(
        |args| sandbox.command(exe, &python, args),
        &python,
    ))
}

/// The image's `python3` (or `python`) on its own `PATH`, as the container would start it.
fn find_python(root: &Path, env: &[String]) -> Option<String> {
    let path = env
        .iter()
        .find_map(|kv| kv.strip_prefix("PATH="))
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    let dir = cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority()).ok()?;
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .flat_map(|d| {
            ["python3", "python"].map(|name| format!("{}/{name}", d.trim_end_matches('/')))
        })
        .find(|candidate| {
            // The link itself: its target resolves inside the image, where it runs.
            dir.symlink_metadata(candidate.trim_start_matches('/'))
                .is_ok_and(|m| !m.is_dir())
        })
}
