//! What every check of a recipe shares: the [`Checker`] that holds the text so an error can
//! point at its span, and the rules values of several sections follow (no control
//! characters, user and group IDs and names, paths by name). The sections' own checks are
//! `impl Checker` blocks in [`super::load`], [`super::accounts`], [`super::files`] and
//! [`super::runtime`], which all take these from here.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use toml::Spanned;

use super::error::{RecipeError, SourceSpan, is_hidden};

/// Holds the recipe text so every check can report a span.
pub(super) struct Checker {
    /// The recipe file, as given.
    pub(super) path: PathBuf,
    pub(super) text: Arc<str>,
}

impl Checker {
    pub(super) fn span(&self, range: std::ops::Range<usize>) -> SourceSpan {
        SourceSpan {
            text: self.text.clone(),
            range,
        }
    }

    pub(super) fn error<T>(&self, value: &Spanned<T>, message: impl Into<String>) -> RecipeError {
        RecipeError::Invalid {
            path: self.path.clone(),
            message: message.into(),
            span: Some(self.span(value.span())),
        }
    }

    /// Refuses a value holding a control character (TAB and newline included) or a
    /// bidirectional control: in an image config it breaks the consumers of `KEY=value`
    /// lines, or shows a reviewer something other than what the image gets.
    pub(super) fn visible_only(
        &self,
        value: &Spanned<String>,
        what: &str,
    ) -> Result<(), RecipeError> {
        match value.get_ref().chars().find(|c| forbidden(*c)) {
            None => Ok(()),
            Some(c) => Err(self.error(
                value,
                format!(
                    "{what} `{}` contains {}; control and bidirectional characters are not allowed",
                    visible(value.get_ref()),
                    describe(c)
                ),
            )),
        }
    }
}

/// `path` with `.` and `..` resolved by name, without asking the file system (as a shell's
/// `cd -L` does). Two spellings of one directory compare equal, and a path checked to lie
/// inside a directory cannot climb out of it afterwards.
pub fn lexical_path(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The largest user or group ID: Linux IDs are 32 bits and `(uid_t)-1` means "no ID".
pub(super) const MAX_ID: u64 = 4_294_967_294;

/// What one side of `user` is.
pub(super) enum UserPart {
    Id,
    IdOutOfRange,
    Name,
    Invalid,
}

/// Digits are an ID; otherwise a name as `useradd` accepts it: `[a-z_][a-z0-9_-]*[$]?`.
pub(super) fn user_part(part: &str) -> UserPart {
    if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
        return match part.parse::<u64>() {
            Ok(id) if id <= MAX_ID => UserPart::Id,
            _ => UserPart::IdOutOfRange,
        };
    }
    let body = part.strip_suffix('$').unwrap_or(part);
    let mut chars = body.chars();
    let valid = matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
    if valid {
        UserPart::Name
    } else {
        UserPart::Invalid
    }
}

/// A character no value in an image config may hold: any control character (TAB too,
/// which [`is_hidden`] lets through in a source line) or a bidirectional control.
pub(super) fn forbidden(c: char) -> bool {
    c == '\t' || is_hidden(c)
}

/// What is wrong with a name a build finds (a `[[files]]` entry, a link target) by the
/// rule every value of the recipe follows: `None`, or which forbidden character it holds.
pub fn name_problem(text: &str) -> Option<String> {
    text.chars().find(|c| forbidden(*c)).map(|c| {
        format!(
            "contains {}; control and bidirectional characters are not allowed",
            describe(c)
        )
    })
}

/// `text` with its forbidden characters written as `<U+XXXX>`, safe to print.
pub fn visible(text: &str) -> String {
    text.chars()
        .map(|c| {
            if forbidden(c) {
                format!("<U+{:04X}>", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Names a forbidden character for a message.
fn describe(c: char) -> String {
    let code = format!("U+{:04X}", u32::from(c));
    match c {
        '\n' => format!("a newline ({code})"),
        '\r' => format!("a carriage return ({code})"),
        '\t' => format!("a TAB ({code})"),
        '\0' => format!("a NUL ({code})"),
        c if c.is_control() => format!("the control character {code}"),
        _ => format!("the bidirectional control {code}"),
    }
}
