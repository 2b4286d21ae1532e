//! Core metadata (`METADATA`, `PKG-INFO`): the email-header format of the packaging spec.
//! Only what resolving needs is kept: name, version, `Requires-Dist`, `Requires-Python`.

use std::str::FromStr;

use pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{PackageName, Requirement};

/// The parts of a distribution's core metadata imgbuild uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreMetadata {
    pub name: PackageName,
    pub version: Version,
    pub requires_dist: Vec<Requirement>,
    pub requires_python: Option<VersionSpecifiers>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetadataError {
    #[error("has no `{0}` field")]
    Missing(&'static str),
    #[error("has an invalid `{field}` value `{value}`: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: String,
    },
}

/// The header fields, in order, with continuation lines joined; the body after the first
/// empty line is the description and is ignored. A line of only spaces is a continuation
/// line, as in Python's email parser: setuptools and hatchling indent a multi-line
/// `License` that way, blank lines included (JupyterLab's METADATA stopped at its licence's
/// first paragraph, and every `Requires-Dist` after it was lost).
fn headers(text: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            fields.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    fields
}

impl CoreMetadata {
    pub fn parse(text: &str) -> Result<CoreMetadata, MetadataError> {
        let fields = headers(text);
        let one = |key: &'static str| {
            fields
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let invalid = |field: &'static str, value: &str, reason: String| MetadataError::Invalid {
            field,
            value: value.to_string(),
            reason,
        };
        let name = one("name").ok_or(MetadataError::Missing("Name"))?;
        let name =
            PackageName::new(name.to_string()).map_err(|e| invalid("Name", name, e.to_string()))?;
        let version = one("version").ok_or(MetadataError::Missing("Version"))?;
        let version =
            Version::from_str(version).map_err(|e| invalid("Version", version, e.to_string()))?;
        let requires_python = one("requires-python")
            .filter(|v| !v.is_empty())
            .map(|v| {
                VersionSpecifiers::from_str(v)
                    .map_err(|e| invalid("Requires-Python", v, e.to_string()))
            })
            .transpose()?;
        let requires_dist = fields
            .iter()
            .filter(|(k, _)| k == "requires-dist")
            .map(|(_, v)| {
                crate::python::requirement::parse(v).map_err(|e| invalid("Requires-Dist", v, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CoreMetadata {
            name,
            version,
            requires_dist,
            requires_python,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_line_license_with_blank_lines_does_not_end_the_headers() {
        // As JupyterLab 4.3.8's METADATA has it: the licence text indented by 8 spaces, its
        // empty lines as 8 spaces, and the requirements after it.
        let text = "Metadata-Version: 2.4\nName: jupyterlab\nVersion: 4.3.8\n\
                    License: Copyright (c) 2015-2024 Project Jupyter Contributors\n        All rights reserved.\n        \n        Redistribution and use\n\
                    Requires-Python: >=3.8\nRequires-Dist: async-lru>=1.0.0\nRequires-Dist: ipykernel>=6.5.0\n\n# JupyterLab\n";
        let metadata = CoreMetadata::parse(text).unwrap();
        let names: Vec<&str> = metadata
            .requires_dist
            .iter()
            .map(|r| r.name.as_ref())
            .collect();
        assert_eq!(names, ["async-lru", "ipykernel"]);
        assert!(metadata.requires_python.is_some());
    }

    #[test]
    fn requirements_and_python_bounds_are_read_and_the_description_ignored() {
        let text = "Metadata-Version: 2.1\nName: python-dateutil\nVersion: 2.9.0.post0\n\
                    Requires-Python: !=3.0.*,!=3.1.*,!=3.2.*,>=2.7\nRequires-Dist: six >=1.5\n\
                    Requires-Dist: pytest ; extra == 'test'\nLicense: Dual License\n  continued\n\n\
                    Requires-Dist: not-a-header\n";
        let metadata = CoreMetadata::parse(text).unwrap();
        assert_eq!(metadata.name.as_ref(), "python-dateutil");
        assert_eq!(metadata.version.to_string(), "2.9.0.post0");
        assert_eq!(metadata.requires_dist.len(), 2);
        assert_eq!(metadata.requires_dist[0].name.as_ref(), "six");
        assert!(
            metadata
                .requires_python
                .unwrap()
                .contains(&"3.9.18".parse().unwrap())
        );
    }

    #[test]
    fn missing_and_invalid_fields_are_named() {
        assert_eq!(
            CoreMetadata::parse("Name: x\n").unwrap_err(),
            MetadataError::Missing("Version")
        );
        let err = CoreMetadata::parse("Name: x\nVersion: 1\nRequires-Dist: y >>= 1\n").unwrap_err();
        assert!(
            err.to_string().contains("`Requires-Dist` value `y >>= 1`"),
            "{err}"
        );
    }
}
