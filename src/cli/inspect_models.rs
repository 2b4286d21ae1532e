//! `inspect` and `diff` of models: a model's layout (`images/NAME.models/MODEL`) summarized
//! file by file, the models beside an image listed with it, and two revisions of a model
//! compared by layer.

use std::fmt::Write;

use super::printer::{CommandFailure, Printer, human_bytes, short_digest as short};
use crate::{
    models::{ModelDiff, ModelSummary},
    oci::read::LayoutRef,
};

/// Whether `image` names a model's layout rather than an image's.
pub(super) fn is_model(image: &str) -> bool {
    let image = LayoutRef::parse(image);
    crate::models::is_model_layout(&image.dir, image.tag())
}

pub(super) fn run_inspect(
    image: &str,
    json: bool,
    printer: &Printer,
) -> Result<(), CommandFailure> {
    let image = LayoutRef::parse(image);
    let summary = crate::models::summarize(&image.dir, image.tag())
        .map_err(|err| CommandFailure::new(err, 1))?;
    if json {
        printer.result(serde_json::to_string_pretty(&summary).expect("the summary serializes"));
    } else {
        printer.document(&render_model(&summary));
    }
    Ok(())
}

/// The models beside the image `image` (a local layout), each summarized under the image's
/// tag; one that cannot be read is warned of and left out, as the image itself was read.
pub(super) fn beside(image: &str, printer: &Printer) -> Vec<ModelSummary> {
    let image = LayoutRef::parse(image);
    let models = match crate::models::beside(&image.dir) {
        Ok(models) => models,
        Err(err) => {
            printer.warning(&err.to_string());
            return Vec::new();
        }
    };
    models
        .iter()
        .filter_map(
            |model| match crate::models::summarize(&model.dir, image.tag()) {
                Ok(summary) => Some(summary),
                Err(err) => {
                    printer.warning(&err.to_string());
                    None
                }
            },
        )
        .collect()
}

pub(super) fn run_diff(
    from: &str,
    to: &str,
    json: bool,
    printer: &Printer,
) -> Result<(), CommandFailure> {
    let read = |text: &str| {
        let image = LayoutRef::parse(text);
        crate::models::summarize(&image.dir, image.tag()).map_err(|err| CommandFailure::new(err, 1))
    };
    let changes = crate::models::diff(&read(from)?, &read(to)?);
    if json {
        printer.result(serde_json::to_string_pretty(&changes).expect("the diff serializes"));
    } else {
        printer.document(&render_diff(&changes));
    }
    Ok(())
}

fn render_model(model: &ModelSummary) -> String {
    let mut out = String::new();
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(out, "Model:        {}", dash(&model.name));
    let _ = writeln!(out, "Layout:       {} ({})", model.layout, model.tag);
    let _ = writeln!(out, "Artifact:     {}", model.artifact);
    let _ = writeln!(out, "Image form:   {}", dash(&model.image));
    let _ = writeln!(
        out,
        "Describes:    architecture {}, format {}, {} parameters, {}",
        dash(&model.architecture),
        dash(&model.format),
        dash(&model.param_size),
        dash(&model.precision)
    );
    let _ = writeln!(
        out,
        "Files:        {} ({})",
        model.files.len(),
        human_bytes(model.bytes)
    );
    for file in &model.files {
        let _ = writeln!(
            out,
            "  {:>10}  {:<7} {}  {}",
            human_bytes(file.size),
            file.kind,
            short(&file.digest),
            file.path
        );
    }
    out
}

/// The lines `inspect` of an image adds for the models beside it.
pub(super) fn render_beside(models: &[ModelSummary]) -> String {
    let mut out = String::new();
    if models.is_empty() {
        return out;
    }
    let _ = writeln!(out, "\nModels beside it:");
    for model in models {
        let _ = writeln!(
            out,
            "  {}  {} files, {}  image form {}, artifact {}",
            model.layout,
            model.files.len(),
            human_bytes(model.bytes),
            model.image.as_deref().map_or("-", short),
            short(&model.artifact)
        );
    }
    out
}

fn render_diff(changes: &ModelDiff) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Model {} → {}",
        short(&changes.from),
        short(&changes.to)
    );
    for file in &changes.added {
        let _ = writeln!(out, "  + {} ({})", file.path, human_bytes(file.size));
    }
    for file in &changes.removed {
        let _ = writeln!(out, "  - {} ({})", file.path, human_bytes(file.size));
    }
    for change in &changes.changed {
        let _ = writeln!(
            out,
            "  ~ {}: layer {} → {} ({} → {})",
            change.path,
            short(&change.from.digest),
            short(&change.to.digest),
            human_bytes(change.from.size),
            human_bytes(change.to.size)
        );
    }
    let _ = writeln!(
        out,
        "{} added, {} removed, {} changed, {} unchanged; {} of new layers",
        changes.added.len(),
        changes.removed.len(),
        changes.changed.len(),
        changes.unchanged,
        human_bytes(changes.new_bytes)
    );
    out
}
