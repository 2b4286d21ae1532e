//! `imgbuild inspect IMAGE --sizes`: the size report as text or JSON.

use std::{fmt::Write, process::ExitCode};

use super::printer::{CommandFailure, Printer, human_bytes};
use crate::sizes::{SizeOptions, SizeReport, sizes_of};

/// How many packages the text lists; `--json` has them all.
const TEXT_PACKAGES: usize = 25;

/// `inspect IMAGE --sizes [--top N] [--architectures LIST] [--json]`, the image's `platform` as `inspect` picks it.
pub(super) fn run_sizes(
    image: &str,
    platform: Option<rattler_conda_types::Subdir>,
    options: &SizeOptions,
    json: bool,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let report = sizes_of(image, platform, options).map_err(|e| CommandFailure::new(e, 1))?;
    if json {
        printer.result(serde_json::to_string_pretty(&report).expect("the report serializes"));
    } else {
        printer.document(&render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(report: &SizeReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "image        {}\nsize         {} compressed, {} of files",
        report.image,
        human_bytes(report.compressed),
        human_bytes(report.uncompressed)
    );
    render_layers(&mut out, report);
    render_packages(&mut out, report);
    render_files(&mut out, report);
    render_duplicates(&mut out, report);
    render_sass(&mut out, report);
    out
}

fn render_sass(out: &mut String, report: &SizeReport) {
    let Some(sass) = &report.sass_outside else {
        return;
    };
    let _ = writeln!(
        out,
        "\nSASS for GPUs other than {}: {} in {} libraries",
        sass.architectures,
        human_bytes(sass.bytes),
        sass.libraries.len()
    );
    for library in &sass.libraries {
        let _ = writeln!(
            out,
            "  {:>10}  {}  ({}; {})",
            human_bytes(library.bytes),
            library.path,
            library.package,
            library.architectures
        );
    }
}

fn render_layers(out: &mut String, report: &SizeReport) {
    let _ = writeln!(out, "\nlayers (compressed, files):");
    for layer in &report.layers {
        let _ = writeln!(
            out,
            "  {:>3}  {:>10}  {:>10}  {}{}",
            layer.index,
            human_bytes(layer.compressed),
            human_bytes(layer.uncompressed),
            layer.holds.join(", "),
            layer
                .part
                .as_ref()
                .map(|part| format!(" (part {part})"))
                .unwrap_or_default()
        );
    }
}

fn render_packages(out: &mut String, report: &SizeReport) {
    let _ = writeln!(
        out,
        "\npackages, largest first (compressed ≈ share of layers, files):"
    );
    for package in report.packages.iter().take(TEXT_PACKAGES) {
        let _ = writeln!(
            out,
            "  {:>10}  {:>10}  {}",
            human_bytes(package.compressed),
            human_bytes(package.uncompressed),
            package.package
        );
    }
    if report.packages.len() > TEXT_PACKAGES {
        let _ = writeln!(
            out,
            "  … {} more (`--json` lists every one)",
            report.packages.len() - TEXT_PACKAGES
        );
    }
}

fn render_files(out: &mut String, report: &SizeReport) {
    let _ = writeln!(out, "\nlargest files:");
    for file in &report.largest_files {
        let _ = writeln!(
            out,
            "  {:>10}  {}  ({})",
            human_bytes(file.bytes),
            file.path,
            file.package
        );
    }
}

fn render_duplicates(out: &mut String, report: &SizeReport) {
    if report.duplicate_libraries.is_empty() {
        let _ = writeln!(out, "\nduplicate shared libraries: none");
        return;
    }
    let wasted: u64 = report.duplicate_libraries.iter().map(|d| d.wasted).sum();
    let _ = writeln!(
        out,
        "\nduplicate shared libraries ({} beyond one copy each):",
        human_bytes(wasted)
    );
    for duplicate in &report.duplicate_libraries {
        let _ = writeln!(
            out,
            "  {} {} ({} wasted):",
            duplicate.by,
            duplicate.key,
            human_bytes(duplicate.wasted)
        );
        for copy in &duplicate.copies {
            let _ = writeln!(
                out,
                "    {:>10}  {}  ({})",
                human_bytes(copy.bytes),
                copy.path,
                copy.package
            );
        }
    }
}
