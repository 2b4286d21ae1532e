//! PEP 440 version specifiers as the version sets the PubGrub solver works with.
//!
//! pep440_rs answers "does this version match" for one specifier; PubGrub needs sets it can
//! intersect and complement. The conversion keeps PEP 440's rules that are not plain
//! intervals: `<V` excludes V's pre-releases, `>V` excludes V's post-releases and local
//! versions, and `==V` matches V's local versions (`torch==2.1.0` is `2.1.0+cu118`).

use pep440_rs::{Operator, Version, VersionSpecifier, VersionSpecifiers};
use pubgrub::Ranges;

/// The smallest version above every local version of `version` (`1.0+anything`), when
/// there is one to name.
fn after_locals(version: &Version) -> Option<Version> {
    if !version.local().is_empty() || version.dev().is_some() {
        return None;
    }
    let post = version.post().map_or(0, |post| post + 1);
    Some(version.clone().with_post(Some(post)).with_dev(Some(0)))
}

/// `1.2.*`'s bounds: from the smallest `1.2` version to the smallest `1.3` one.
fn prefix_bounds(version: &Version) -> (Version, Version) {
    let release = version.release();
    let lower = Version::new(release.iter().copied())
        .with_epoch(version.epoch())
        .with_min(Some(0));
    let mut next = release.to_vec();
    if let Some(last) = next.last_mut() {
        *last += 1;
    }
    let upper = Version::new(next)
        .with_epoch(version.epoch())
        .with_min(Some(0));
    (lower, upper)
}

/// One specifier as a set of versions.
pub(crate) fn specifier_ranges(specifier: &VersionSpecifier) -> Ranges<Version> {
    let version = specifier.version().clone();
    match specifier.operator() {
        Operator::Equal => match after_locals(&version) {
            Some(next) => Ranges::between(version, next),
            None => Ranges::singleton(version),
        },
        Operator::ExactEqual => Ranges::singleton(version),
        Operator::NotEqual => match after_locals(&version) {
            Some(next) => Ranges::between(version, next).complement(),
            None => Ranges::singleton(version).complement(),
        },
        Operator::EqualStar => {
            let (lower, upper) = prefix_bounds(&version);
            Ranges::between(lower, upper)
        }
        Operator::NotEqualStar => {
            let (lower, upper) = prefix_bounds(&version);
            Ranges::between(lower, upper).complement()
        }
        Operator::TildeEqual => {
            // `~=1.4.5` is `>=1.4.5, ==1.4.*`.
            let release = version.release();
            let prefix = Version::new(
                release[..release.len().saturating_sub(1).max(1)]
                    .iter()
                    .copied(),
            )
            .with_epoch(version.epoch());
            let (_, upper) = prefix_bounds(&prefix);
            Ranges::between(version, upper)
        }
        Operator::LessThan => {
            if version.any_prerelease() || version.is_post() {
                Ranges::strictly_lower_than(version)
            } else {
                Ranges::strictly_lower_than(version.with_min(Some(0)))
            }
        }
        Operator::LessThanEqual => match after_locals(&version) {
            Some(next) => Ranges::strictly_lower_than(next),
            None => Ranges::lower_than(version),
        },
        Operator::GreaterThan => {
            if version.is_post() {
                Ranges::strictly_higher_than(version)
            } else {
                Ranges::strictly_higher_than(version.with_max(Some(0)))
            }
        }
        Operator::GreaterThanEqual => Ranges::higher_than(version),
    }
}

/// Does `range` pin exactly `version` (`==V` or `===V`)?
pub fn is_pin(range: &Ranges<Version>, version: &Version) -> bool {
    range.as_singleton() == Some(version)
        || after_locals(version)
            .is_some_and(|next| *range == Ranges::between(version.clone(), next))
}

/// All specifiers of a requirement: their intersection; no specifier is every version.
pub fn specifiers_ranges(specifiers: &VersionSpecifiers) -> Ranges<Version> {
    specifiers.iter().fold(Ranges::full(), |all, one| {
        all.intersection(&specifier_ranges(one))
    })
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[test]
    fn pins_are_told_from_ranges() {
        let v = |t: &str| Version::from_str(t).unwrap();
        let ranges = |t: &str| specifiers_ranges(&VersionSpecifiers::from_str(t).unwrap());
        assert!(is_pin(&ranges("==1.0"), &v("1.0")));
        assert!(is_pin(&ranges("===1.0"), &v("1.0")));
        assert!(is_pin(&ranges("==1.0,>=0.5"), &v("1.0")));
        assert!(!is_pin(&ranges(">=1.0"), &v("1.0")));
        assert!(!is_pin(&ranges("==1.*"), &v("1.0")));
    }

    /// The set agrees with pep440_rs's own matching on every probe version.
    #[test]
    fn sets_match_exactly_the_versions_pep440_matches() {
        let probes = [
            "0.9",
            "1.0a1",
            "1.0.dev0",
            "1.0",
            "1.0+cu118",
            "1.0.post1",
            "1.0.1",
            "1.1",
            "1.4.4",
            "1.4.5",
            "1.4.9",
            "1.5",
            "1.5.0a1",
            "2.0",
            "2.0.post3",
            "2!1.0",
        ];
        let specifiers = [
            "==1.0",
            "!=1.0",
            "==1.*",
            "!=1.*",
            "~=1.4.5",
            "~=1.4",
            "<1.5",
            "<=1.0",
            ">1.0",
            ">=1.4.5",
            "<2.0.post3",
            ">1.0.post1",
            "===1.0",
            ">=1.0,<1.5,!=1.4.4",
        ];
        for text in specifiers {
            let specifiers = VersionSpecifiers::from_str(text).unwrap();
            let ranges = specifiers_ranges(&specifiers);
            for probe in probes {
                let version = Version::from_str(probe).unwrap();
                // PEP 440 leaves pre-releases to the installer's policy; the set is about
                // the intervals, so compare on what pep440_rs matches when asked plainly.
                assert_eq!(
                    ranges.contains(&version),
                    specifiers.contains(&version),
                    "{probe} in {text}"
                );
            }
        }
    }
}
