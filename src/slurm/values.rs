//! The values of `imgbuild slurm`'s flags, checked against the grammar sbatch gives them:
//! whatever reaches an `#SBATCH` line has passed one of these.

use super::{Gpus, SlurmError, Volume};

pub(super) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-".contains(c)
}

fn value_error(key: &'static str, value: &str, expected: &'static str) -> SlurmError {
    SlurmError::Value {
        key,
        value: value.to_string(),
        expected,
    }
}

/// Checks a job name, partition (a comma-separated list) or account: letters, digits, `.`,
/// `_` and `-`.
pub(crate) fn check_name(key: &'static str, value: &str) -> Result<(), SlurmError> {
    let list = key == "partition";
    let valid = value
        .split(',')
        .all(|part| !part.is_empty() && part.chars().all(is_name_char) && !part.starts_with('-'))
        && (list || !value.contains(','));
    if valid {
        Ok(())
    } else {
        Err(value_error(
            key,
            value,
            "must be letters, digits, `.`, `_` and `-` (a partition: several, separated by `,`)",
        ))
    }
}

/// Checks a time limit in one of the forms sbatch reads: `MINUTES`, `MINUTES:SECONDS`,
/// `HOURS:MINUTES:SECONDS`, `DAYS-HOURS`, `DAYS-HOURS:MINUTES`, `DAYS-HOURS:MINUTES:SECONDS`,
/// or `UNLIMITED`.
pub(crate) fn check_time(value: &str) -> Result<(), SlurmError> {
    let number = |s: &str| !s.is_empty() && s.len() <= 6 && s.chars().all(|c| c.is_ascii_digit());
    let clock = |s: &str, most: usize| {
        let parts: Vec<&str> = s.split(':').collect();
        parts.len() <= most && parts.iter().all(|p| number(p))
    };
    let valid = match value.split_once('-') {
        Some((days, clock_part)) => number(days) && clock(clock_part, 3),
        None => clock(value, 3) || value.eq_ignore_ascii_case("unlimited"),
    };
    if valid {
        Ok(())
    } else {
        Err(value_error(
            "time",
            value,
            "is not a Slurm time limit: MINUTES, HH:MM:SS, D-HH, D-HH:MM:SS or UNLIMITED",
        ))
    }
}

/// Reads a memory size as Slurm writes it: a whole number of mebibytes, or with a `K`, `M`,
/// `G` or `T` suffix, which Slurm reads as powers of 1024; the Kubernetes forms `Ki`, `Mi`,
/// `Gi` and `Ti` mean the same and are written as Slurm's.
pub(crate) fn parse_memory(value: &str) -> Result<String, SlurmError> {
    let (number, unit) = value.split_at(
        value
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(value.len()),
    );
    let unit = match unit.strip_suffix('i').unwrap_or(unit) {
        "" if unit.is_empty() => Some(""),
        u @ ("K" | "M" | "G" | "T" | "k" | "m" | "g" | "t") => Some(u),
        _ => None,
    };
    match (number.parse::<u64>(), unit) {
        (Ok(n), Some(unit)) if n > 0 => Ok(format!("{n}{}", unit.to_ascii_uppercase())),
        _ => Err(value_error(
            "memory",
            value,
            "is not a memory size like `32G`, `512M` or `32Gi` (Slurm reads K, M, G and T as powers of 1024)",
        )),
    }
}

/// Reads `--set cpus=N`: a whole number above 0.
pub(crate) fn parse_cpus(value: &str) -> Result<u32, SlurmError> {
    parse_count("cpus", value)
}

/// A count above 0 in plain digits (`cpus`, `nodes`, `ntasks-per-node`): no sign, no
/// range, no suffix, none of which the script would pass on as it was meant.
pub(crate) fn parse_count(key: &'static str, value: &str) -> Result<u32, SlurmError> {
    Some(value)
        .filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| value_error(key, value, "must be a whole number above 0"))
}

/// Checks `--set constraint=…`: node features (letters, digits, `.`, `_`, `-`) joined by
/// sbatch's operators `&`, `|`, `,`, `*N`, `[…]` and `(…)`, with no white space, which would
/// end the `#SBATCH` line's value.
pub(crate) fn check_constraint(value: &str) -> Result<(), SlurmError> {
    let valid = !value.is_empty()
        && value
            .chars()
            .all(|c| is_name_char(c) || "&|,*[]()".contains(c))
        && value.chars().any(is_name_char);
    if valid {
        Ok(())
    } else {
        Err(value_error(
            "constraint",
            value,
            "must be node features (letters, digits, `.`, `_`, `-`) joined by `&`, `|`, `,`, `*N`, `[…]` or `(…)`",
        ))
    }
}

/// Reads `--set exclusive=true|false`.
pub(crate) fn parse_switch(key: &'static str, value: &str) -> Result<bool, SlurmError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(value_error(key, value, "must be `true` or `false`")),
    }
}

/// Reads `--volume SRC:DST[:ro|rw]`: a host path and a container path, both absolute and
/// normal (no `..`; `.` and doubled `/` are dropped), with none of `,` and `:`.
pub(crate) fn parse_volume(text: &str) -> Result<Volume, SlurmError> {
    let error = |reason: String| SlurmError::Volume {
        value: text.to_string(),
        reason,
    };
    let parts: Vec<&str> = text.split(':').collect();
    let (source, target, read_only) = match parts[..] {
        [source, target] => (source, target, false),
        [source, target, "ro"] => (source, target, true),
        [source, target, "rw"] => (source, target, false),
        [_, _, mode] => return Err(error(format!("`{mode}` is neither `ro` nor `rw`"))),
        _ => {
            return Err(error(
                "not `SRC:DST` or `SRC:DST:ro` (a path may hold no `:`)".into(),
            ));
        }
    };
    let normal = |path: &str, what: &str| {
        crate::k8s::normal_path(path)
            .filter(|p| !p.contains(','))
            .ok_or_else(|| {
                error(format!(
                    "the {what} `{}` is not an absolute path without `..` and `,`",
                    path.escape_debug()
                ))
            })
    };
    Ok(Volume {
        source: normal(source, "host path")?,
        target: normal(target, "container path")?,
        read_only,
    })
}

/// Reads `--set gpus=N` or `gpus=TYPE:N` (a GRES type the site defines, e.g. `a100:2`); 0
/// asks for none.
pub(crate) fn parse_gpus(key: &'static str, value: &str) -> Result<Gpus, SlurmError> {
    let (kind, count) = match value.rsplit_once(':') {
        Some((kind, count)) => (Some(kind), count),
        None => (None, value),
    };
    let kind_ok = kind.is_none_or(|k| !k.is_empty() && k.chars().all(is_name_char));
    let digits = !count.is_empty() && count.chars().all(|c| c.is_ascii_digit());
    match count.parse::<u32>() {
        Ok(count) if kind_ok && digits => Ok(Gpus {
            kind: kind.map(str::to_string),
            count,
        }),
        _ => Err(value_error(
            key,
            value,
            "must be a whole number of GPUs, or `TYPE:N` for a GRES type (e.g. `a100:2`)",
        )),
    }
}

/// Checks `--env` names: each a shell variable name (the Pyxis script exports them), once.
pub(super) fn check_env(env: &[(String, String)]) -> Result<(), SlurmError> {
    let mut seen = std::collections::BTreeSet::new();
    for (name, _) in env {
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(SlurmError::EnvName { name: name.clone() });
        }
        if !seen.insert(name) {
            return Err(SlurmError::DuplicateEnv { name: name.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked() {
        for good in [
            "90",
            "30:00",
            "4:00:00",
            "2-12",
            "2-12:30",
            "2-12:30:00",
            "UNLIMITED",
        ] {
            assert!(check_time(good).is_ok(), "{good}");
        }
        for bad in ["", "1h", "1:2:3:4", "-1", "2-", "1 0", "1;id", "2-1:2:3:4"] {
            assert!(check_time(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_memory("32G").unwrap(), "32G");
        assert_eq!(parse_memory("32Gi").unwrap(), "32G");
        assert_eq!(parse_memory("512m").unwrap(), "512M");
        assert_eq!(parse_memory("4096").unwrap(), "4096");
        for bad in ["", "0", "G", "1.5G", "32GB", "i", "32 G", "+5G", "1Pi"] {
            assert!(parse_memory(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_gpus("gpus", "2").unwrap(),
            Gpus {
                kind: None,
                count: 2
            }
        );
        let typed = parse_gpus("gpus", "a100:4").unwrap();
        assert_eq!((typed.kind.as_deref(), typed.count), (Some("a100"), 4));
        for bad in ["", "-1", "+1", "two", ":1", "a b:1", "a100:", "1.5"] {
            assert!(parse_gpus("gpus", bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cpus("16").unwrap(), 16);
        assert!(parse_cpus("0").is_err());
        assert!(check_name("partition", "gpu,debug").is_ok());
        for bad in ["", "a b", "a;b", "$(id)", "-x", "a\nb"] {
            assert!(check_name("partition", bad).is_err(), "{bad:?}");
        }
        assert!(check_name("account", "a,b").is_err(), "one account");
    }

    #[test]
    fn multi_node_keys_volumes_and_their_refusals() {
        assert_eq!(parse_count("nodes", "4").unwrap(), 4);
        for bad in ["", "0", "+2", "2-4", "two", "1\n", "$(id)"] {
            assert!(parse_count("nodes", bad).is_err(), "{bad:?}");
        }
        assert!(check_constraint("a100&ib").is_ok());
        assert!(check_constraint("[rack1|rack2]*2").is_ok());
        for bad in ["", "&", "a b", "a\nb", "$(id)", "a;b", "`id`"] {
            assert!(check_constraint(bad).is_err(), "{bad:?}");
        }
        assert!(parse_switch("exclusive", "true").unwrap());
        assert!(parse_switch("exclusive", "yes").is_err());
        let volume = parse_volume("/scratch//data/./x:/data:ro").unwrap();
        assert_eq!(
            volume,
            Volume {
                source: "/scratch/data/x".into(),
                target: "/data".into(),
                read_only: true
            }
        );
        for bad in [
            "/a/../etc:/x",
            "rel:/x",
            "/a:rel",
            "/a,b:/x",
            "/a:/x:rx",
            "/a",
            "/a\nb:/x",
        ] {
            assert!(parse_volume(bad).is_err(), "{bad:?}");
        }
    }
}
