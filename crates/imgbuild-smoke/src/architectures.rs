//! GPU architectures (`sm_80` SASS, `compute_90` PTX) and whether a device runs kernels
//! built for them. imgbuild reads them from the libraries' CUDA fatbins at build time and
//! records them in the image (`dev.imgbuild.cuda.architectures`); the smoke run tells, for
//! the device's compute capability, which of three cases holds ([`classify`]).

use std::{collections::BTreeSet, fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// What an entry holds: machine code for one architecture, or PTX to JIT-compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ArchKind {
    Sass,
    Ptx,
}

/// `sm_80` (SASS) or `compute_90` (PTX). Orders SASS before PTX, each by number, the order
/// the annotation lists them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch {
    pub kind: ArchKind,
    /// Compute capability as major × 10 + minor: `86` for 8.6.
    pub sm: u32,
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ArchKind::Sass => write!(f, "sm_{}", self.sm),
            ArchKind::Ptx => write!(f, "compute_{}", self.sm),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchParseError(String);

impl fmt::Display for ArchParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a GPU architecture: write `sm_80` or `compute_90`",
            self.0
        )
    }
}

impl std::error::Error for ArchParseError {}

impl FromStr for Arch {
    type Err = ArchParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, number) = if let Some(n) = s.strip_prefix("sm_") {
            (ArchKind::Sass, n)
        } else if let Some(n) = s.strip_prefix("compute_") {
            (ArchKind::Ptx, n)
        } else {
            return Err(ArchParseError(s.to_string()));
        };
        // Two or three digits: `sm_50` … `sm_120`; a leading zero or sign is not one.
        let valid = (2..=3).contains(&number.len())
            && number.bytes().all(|b| b.is_ascii_digit())
            && !number.starts_with('0');
        match number.parse() {
            Ok(sm) if valid => Ok(Arch { kind, sm }),
            _ => Err(ArchParseError(s.to_string())),
        }
    }
}

/// The architectures of one library or a set of them.
pub type Architectures = BTreeSet<Arch>;

/// `sm_50,sm_60,compute_90`: the annotation's form.
pub fn format_list(archs: &Architectures) -> String {
    archs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`format_list`]'s form back; empty items (`""`) are none.
pub fn parse_list(list: &str) -> Result<Architectures, ArchParseError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect()
}

/// How a device of compute capability `sm` (major × 10 + minor) runs kernels built for
/// `archs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// SASS for the device's architecture, or one it runs (same major, lower minor).
    Sass(Arch),
    /// Only PTX at or below the device's architecture: JIT-compiled at first use, a slow
    /// first start (and the JIT cache to keep warm).
    PtxOnly(Arch),
    /// Nothing the device runs: "no kernel image is available for execution on the device".
    None,
}

/// Whether a device of compute capability `sm` runs kernels built for `archs`. SASS runs on
/// the same major version at an equal or higher minor (`sm_80` on 8.6); PTX is compiled
/// for any device at or above it. Architecture-specific SASS (`sm_90a`) is read as its
/// number: no library checked carries one, so where its fatbin header marks it is unknown.
pub fn coverage(archs: &Architectures, sm: u32) -> Coverage {
    let sass = archs
        .iter()
        .filter(|a| a.kind == ArchKind::Sass && a.sm / 10 == sm / 10 && a.sm <= sm)
        .max();
    if let Some(arch) = sass {
        return Coverage::Sass(*arch);
    }
    let ptx = archs
        .iter()
        .filter(|a| a.kind == ArchKind::Ptx && a.sm <= sm)
        .max();
    ptx.map_or(Coverage::None, |arch| Coverage::PtxOnly(*arch))
}

/// The device's case, as the smoke report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCoverage {
    /// `sass`, `ptx-only` or `none`.
    pub case: String,
    /// The architecture that runs on the device (`sm_80`, `compute_90`), if any.
    pub arch: Option<String>,
    /// What the image's libraries carry, as recorded.
    pub architectures: String,
    /// For `ptx-only`: the PTX ISA of that PTX (the newest the image records for it), absent
    /// from reports of older versions and images that record none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_isa: Option<String>,
    pub message: String,
}

impl KernelCoverage {
    /// Adds the PTX-only case's ISA and the driver it needs ([`crate::compat::ptx_minimum_driver`])
    /// to the message. Other cases are as they were.
    pub fn with_ptx_isa(mut self, isa: crate::compat::PtxIsa) -> Self {
        if self.case != "ptx-only" {
            return self;
        }
        let arch = self.arch.clone().unwrap_or_default();
        self.message = format!(
            "PTX-only: covered only by {arch} (ISA {isa}), {}; {}",
            crate::compat::describe_ptx_need(isa),
            self.message
                .trim_start_matches(&format!("covered only by PTX {arch}: "))
        );
        self.ptx_isa = Some(isa.to_string());
        self
    }

    /// Why the device cannot run the libraries' PTX on `driver`, when it cannot (or may not:
    /// an ISA newer than imgbuild knows, on a driver no newer than the newest ISA needs).
    pub fn ptx_incompatibility(&self, driver: &crate::compat::DriverVersion) -> Option<String> {
        let isa: crate::compat::PtxIsa = self.ptx_isa.as_deref()?.parse().ok()?;
        (crate::compat::ptx_runs_on(isa, driver) == Some(false)).then(|| {
            format!(
                "the image's libraries run on this GPU only by {} PTX of ISA {isa}, which {}; driver {driver} fails them with CUDA_ERROR_UNSUPPORTED_PTX_VERSION at first use",
                self.arch.as_deref().unwrap_or("their"),
                crate::compat::describe_ptx_need(isa)
            )
        })
    }
}

/// The case of a device of `compute_capability` (`8.6`, as the report has it) for the
/// architectures `recorded` (`sm_80,compute_90`). `None` when either cannot be read (an image
/// whose annotation comes from a newer imgbuild, a device without a capability).
pub fn classify(recorded: &str, compute_capability: &str) -> Option<KernelCoverage> {
    let archs = parse_list(recorded).ok().filter(|a| !a.is_empty())?;
    let (major, minor) = compute_capability.split_once('.')?;
    let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
    if minor > 9 {
        return None;
    }
    let sm = major * 10 + minor;
    let (case, arch, message) = match coverage(&archs, sm) {
        Coverage::Sass(arch) => (
            "sass",
            Some(arch),
            format!(
                "covered by SASS {arch}: the libraries' kernels run on compute capability {compute_capability} as built"
            ),
        ),
        Coverage::PtxOnly(arch) => (
            "ptx-only",
            Some(arch),
            format!(
                "covered only by PTX {arch}: the driver JIT-compiles the libraries' kernels for compute capability {compute_capability} at first use, a slow first start"
            ),
        ),
        Coverage::None => (
            "none",
            None,
            format!(
                "not covered: no SASS for compute capability {compute_capability} and no PTX at or below it; the libraries' kernels fail with \"no kernel image is available for execution on the device\""
            ),
        ),
    };
    Some(KernelCoverage {
        case: case.to_string(),
        arch: arch.map(|a| a.to_string()),
        architectures: format_list(&archs),
        ptx_isa: None,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_parse_strictly() {
        assert_eq!(
            "sm_86".parse::<Arch>().unwrap(),
            Arch {
                kind: ArchKind::Sass,
                sm: 86
            }
        );
        assert_eq!(
            "compute_120".parse::<Arch>().unwrap().to_string(),
            "compute_120"
        );
        for bad in [
            "sm80",
            "sm_",
            "sm_8",
            "sm_+80",
            "sm_080",
            "compute_9000",
            "gfx90a",
        ] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_device_is_covered_by_sass_of_its_major_by_ptx_at_or_below_or_not() {
        let archs = parse_list("sm_70,sm_80,compute_80").unwrap();
        let sass = |sm| {
            Coverage::Sass(Arch {
                kind: ArchKind::Sass,
                sm,
            })
        };
        let ptx = |sm| {
            Coverage::PtxOnly(Arch {
                kind: ArchKind::Ptx,
                sm,
            })
        };
        assert_eq!(coverage(&archs, 80), sass(80));
        // 8.6 runs sm_80 SASS.
        assert_eq!(coverage(&archs, 86), sass(80));
        // 9.0 runs no 8.x SASS: only the PTX, JIT-compiled.
        assert_eq!(coverage(&archs, 90), ptx(80));
        // 7.5 runs sm_70; 6.1 runs nothing here.
        assert_eq!(coverage(&archs, 75), sass(70));
        assert_eq!(coverage(&archs, 61), Coverage::None);
        assert_eq!(coverage(&parse_list("sm_80").unwrap(), 90), Coverage::None);
    }

    #[test]
    fn the_three_cases_for_the_devices_compute_capability() {
        let recorded = "sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_89,sm_90,compute_90";
        let case = |cc| classify(recorded, cc).map(|c| (c.case, c.arch));
        assert_eq!(case("8.6"), Some(("sass".into(), Some("sm_86".into()))));
        assert_eq!(case("8.7"), Some(("sass".into(), Some("sm_86".into()))));
        assert_eq!(
            case("10.0"),
            Some(("ptx-only".into(), Some("compute_90".into())))
        );
        assert_eq!(case("3.7"), Some(("none".into(), None)));
        let none = classify(recorded, "3.7").unwrap();
        assert!(
            none.message.contains("no kernel image is available"),
            "{}",
            none.message
        );
        // Unreadable input is no verdict, not a wrong one.
        assert_eq!(classify(recorded, "eight"), None);
        assert_eq!(classify("gfx90a", "8.0"), None);
        assert_eq!(classify("", "8.0"), None);
    }

    #[test]
    fn a_ptx_only_device_names_the_isa_and_the_driver_it_needs() {
        let recorded = "sm_80,compute_90";
        let isa = |s: &str| s.parse::<crate::compat::PtxIsa>().unwrap();
        let driver = |s: &str| s.parse::<crate::compat::DriverVersion>().unwrap();
        let ptx = classify(recorded, "10.0").unwrap().with_ptx_isa(isa("8.5"));
        assert_eq!(ptx.ptx_isa.as_deref(), Some("8.5"));
        assert!(
            ptx.message.starts_with(
                "PTX-only: covered only by compute_90 (ISA 8.5), needs driver ≥ 555.42.02 (CUDA 12.5); the driver JIT-compiles"
            ),
            "{}",
            ptx.message
        );
        assert_eq!(ptx.ptx_incompatibility(&driver("555.42.02")), None);
        let why = ptx.ptx_incompatibility(&driver("550.54.14")).unwrap();
        assert!(
            why.contains("only by compute_90 PTX of ISA 8.5, which needs driver ≥ 555.42.02")
                && why.contains(
                    "driver 550.54.14 fails them with CUDA_ERROR_UNSUPPORTED_PTX_VERSION"
                ),
            "{why}"
        );
        // SASS needs no JIT: the ISA changes nothing.
        let sass = classify(recorded, "8.6").unwrap();
        assert_eq!(sass.clone().with_ptx_isa(isa("8.5")), sass);
        assert_eq!(sass.ptx_incompatibility(&driver("450.36.06")), None);
        // Newer than the table: not passed on a driver the newest known ISA needs.
        let newer = classify(recorded, "10.0").unwrap().with_ptx_isa(isa("9.9"));
        assert!(
            newer
                .message
                .contains("newer than the newest imgbuild knows")
        );
        assert!(newer.ptx_incompatibility(&driver("590.44.01")).is_some());
        assert_eq!(newer.ptx_incompatibility(&driver("610.43.02")), None);
    }

    #[test]
    fn the_report_shows_the_case_and_reports_without_it_parse() {
        let mut report = crate::SmokeReport::new("img".into(), None, Vec::new());
        assert!(!report.to_text().contains("kernel images"));
        assert!(!report.render(true).contains("kernel_images"));
        let older: crate::SmokeReport = serde_json::from_str(&report.render(true)).unwrap();
        assert_eq!(older.kernel_images, None);
        report.kernel_images = classify("sm_80", "8.6");
        let text = report.to_text();
        assert!(
            text.contains("kernel images    covered by SASS sm_80: "),
            "{text}"
        );
        assert!(text.find("kernel images") < text.find("verdict"), "{text}");
        let back: crate::SmokeReport = serde_json::from_str(&report.render(true)).unwrap();
        assert_eq!(back.kernel_images, report.kernel_images);
    }
}
