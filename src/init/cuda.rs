//! The CUDA an environment file's packages ask for, as the recipe's `[cuda]` section.

use rattler_conda_types::MatchSpec;

use super::{comment_text, quote};

/// The packages whose version is the CUDA an environment is for: conda-forge's and NVIDIA's
/// `cuda-version`, `cuda-toolkit` and `cuda-runtime`, the old `cudatoolkit`, and pytorch's
/// `pytorch-cuda`.
const CUDA_VERSION_PACKAGES: &[&str] = &[
    "cuda-version",
    "cudatoolkit",
    "pytorch-cuda",
    "cuda-toolkit",
    "cuda-runtime",
];

/// What one match spec says about the CUDA an environment is for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CudaHint {
    /// `MAJOR.MINOR`.
    Version(String),
    /// It asks for CUDA without a MAJOR.MINOR, and why.
    Vague(&'static str),
}

/// The CUDA `spec` asks for: the version of a CUDA package, or the one in a `*cuda*` build
/// string (`py3.10_cuda11.8_cudnn8.7.0_0`, conda-forge's `cuda118py310h…`).
fn cuda_hint(spec: &MatchSpec) -> Option<CudaHint> {
    let name = spec.name.as_exact()?.as_normalized();
    if CUDA_VERSION_PACKAGES.contains(&name) {
        return Some(match &spec.version {
            None => CudaHint::Vague("no version"),
            Some(version) => major_minor(&version.to_string()),
        });
    }
    let build = spec.build.as_ref()?.to_string();
    let at = build.find("cuda")? + "cuda".len();
    let digits: String = build[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let digits = digits.trim_end_matches('.');
    Some(if digits.contains('.') {
        major_minor(digits)
    } else {
        // conda-forge writes MAJOR and MINOR without a dot: `cuda118`, `cuda120`.
        match digits.len() {
            3 => CudaHint::Version(format!("{}.{}", &digits[..2], &digits[2..])),
            0 => CudaHint::Vague("a CUDA build without a CUDA version"),
            _ => CudaHint::Vague("a CUDA build without a MAJOR.MINOR"),
        }
    })
}

/// `MAJOR.MINOR` of a version spec that pins one release (`11.8`, `11.8.*`, `==11.8.0`);
/// a range or a bare major names none.
fn major_minor(spec: &str) -> CudaHint {
    let text = spec.trim().trim_start_matches("==");
    let text = text.strip_suffix(".*").unwrap_or(text);
    if text.contains(['<', '>', '!', ',', '|', '~', '*', ' ', '=']) {
        return CudaHint::Vague("a version range");
    }
    fn number(part: Option<&str>) -> Option<&str> {
        part.filter(|p| p.parse::<u32>().is_ok())
    }
    let mut parts = text.split('.');
    match (number(parts.next()), number(parts.next())) {
        (Some(major), Some(minor)) => CudaHint::Version(format!("{major}.{minor}")),
        (Some(_), None) => CudaHint::Vague("a major version only"),
        _ => CudaHint::Vague("no MAJOR.MINOR"),
    }
}

/// The `[cuda]` section for `specs` (empty text when nothing asks for CUDA): the first
/// MAJOR.MINOR they name. Without one, or with one imgbuild does not know, the section is
/// written commented out and a note says why.
pub(super) fn cuda_section(specs: &[&MatchSpec], notes: &mut Vec<String>) -> String {
    let hints: Vec<(String, CudaHint)> = specs
        .iter()
        .filter_map(|spec| Some((spec.to_string(), cuda_hint(spec)?)))
        .collect();
    let versions: Vec<(&str, &str)> = hints
        .iter()
        .filter_map(|(spec, hint)| match hint {
            CudaHint::Version(v) => Some((spec.as_str(), v.as_str())),
            CudaHint::Vague(_) => None,
        })
        .collect();
    let Some(&(source, version)) = versions.first() else {
        let Some((spec, CudaHint::Vague(why))) = hints.first() else {
            return String::new();
        };
        notes.push(format!(
            "`{spec}` asks for CUDA but names no MAJOR.MINOR ({why}); set `version` in the recipe's commented-out [cuda] section, or the solve has no `__cuda` and CUDA builds cannot be chosen"
        ));
        return "\n# [cuda]                       # the file asks for CUDA without naming a version\n# version = \"12.4\"\n".to_string();
    };
    if let Some((other, other_version)) = versions.iter().find(|(_, v)| *v != version) {
        notes.push(format!(
            "the file names CUDA {version} (`{source}`) and {other_version} (`{other}`); [cuda] version is the first, {version}"
        ));
    }
    let known = version
        .parse::<crate::cuda::compat::CudaVersion>()
        .ok()
        .is_some_and(|v| crate::cuda::compat::minor_version_minimum(v.major).is_some());
    if !known {
        notes.push(format!(
            "CUDA {version} (`{source}`) is not a release imgbuild builds for (11.x, 12.x and 13.x are); the recipe's [cuda] section is commented out"
        ));
        return format!(
            "\n# [cuda]                       # from `{}`\n# version = {}\n",
            comment_text(source),
            quote(version)
        );
    }
    // `source` is the file's match spec: it stays on the comment's line.
    format!(
        "\n[cuda]\nversion = {}              # from `{}`\n",
        quote(version),
        comment_text(source)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(spec: &str) -> Option<CudaHint> {
        cuda_hint(
            &MatchSpec::from_str(spec, rattler_conda_types::ParseStrictness::Lenient).unwrap(),
        )
    }

    #[test]
    fn cuda_packages_and_cuda_builds_name_the_cuda_version() {
        let version = |v: &str| Some(CudaHint::Version(v.to_string()));
        assert_eq!(hint("cudatoolkit=11.3"), version("11.3"));
        assert_eq!(hint("cudatoolkit =11.0"), version("11.0"));
        assert_eq!(hint("pytorch-cuda=12.1"), version("12.1"));
        assert_eq!(hint("pytorch::pytorch-cuda=11.7.0"), version("11.7"));
        assert_eq!(hint("cuda-version=12.4"), version("12.4"));
        assert_eq!(hint("cuda-version==12.2"), version("12.2"));
        assert_eq!(hint("cuda-toolkit=12.2.2"), version("12.2"));
        assert_eq!(hint("cuda-runtime 12.1.*"), version("12.1"));
        assert_eq!(
            hint("pytorch=2.1.0=py3.10_cuda11.8_cudnn8.7.0_0"),
            version("11.8")
        );
        assert_eq!(hint("pytorch=2.1=*cuda12.1*"), version("12.1"));
        assert_eq!(
            hint("jaxlib=0.4.23=cuda120py311h8f8a1a1_200"),
            version("12.0")
        );
        assert_eq!(hint("tensorflow=2.15=cuda118py310h*"), version("11.8"));

        assert!(matches!(hint("pytorch=*=*cuda*"), Some(CudaHint::Vague(_))));
        assert!(matches!(hint("cudatoolkit"), Some(CudaHint::Vague(_))));
        assert!(matches!(
            hint("cuda-version>=12.0,<13"),
            Some(CudaHint::Vague(_))
        ));
        assert!(matches!(hint("cuda-version=12"), Some(CudaHint::Vague(_))));
        assert_eq!(hint("numpy=1.26"), None);
        assert_eq!(hint("pytorch=2.1=py3.10_cpu_0"), None);
        assert_eq!(hint("cudnn=8.0"), None);
    }
}
