//! "Did you mean" suggestions: the closest known word to a misspelt one, by edit distance
//! (Damerau-Levenshtein from `strsim`, so a swap of two letters counts as one edit).

/// The most edits a suggestion may be away from `word`: one for short words, a third of the
/// word's length for longer ones, so `nmae` finds `name` but `x` does not find `tags`.
fn max_distance(word: &str) -> usize {
    (word.chars().count() / 3).max(1)
}

/// Up to `limit` candidates close enough to `word`, closest first (ties by name).
/// A candidate equal to `word` is not a suggestion.
pub fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    limit: usize,
) -> Vec<&'a str> {
    let lower = word.to_lowercase();
    let max = max_distance(word);
    let mut scored: Vec<(usize, &'a str)> = candidates
        .into_iter()
        .filter(|c| *c != word)
        // Cheap filter first: lengths that differ by more than `max` cannot be close.
        .filter(|c| c.chars().count().abs_diff(word.chars().count()) <= max)
        .map(|c| (strsim::damerau_levenshtein(&lower, &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= max)
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(limit).map(|(_, c)| c).collect()
}

/// For serde's `unknown field `X`, expected one of `a`, `b`` (or `expected `a``), the
/// expected key closest to `X`, if one is close enough.
pub(crate) fn for_unknown_key(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (word, rest) = rest.split_once('`')?;
    let expected = rest.split_once("expected")?.1;
    let keys: Vec<&str> = expected
        .split('`')
        .enumerate()
        // Backtick-quoted names sit at the odd positions.
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s)
        .collect();
    if let Some(close) = closest(word, keys.iter().copied(), 1).first() {
        return Some((*close).to_string());
    }
    // `maximum` for `max`: a word that starts with exactly one expected key (or is the
    // start of one), too long for the edit distance.
    let mut prefixed = keys.iter().filter(|k| {
        k.len() >= 3 && word.len() >= 3 && (word.starts_with(**k) || k.starts_with(word))
    });
    match (prefixed.next(), prefixed.next()) {
        (Some(key), None) => Some((*key).to_string()),
        _ => None,
    }
}

/// The package names the solver found no candidates for: resolvo says
/// `No candidates were found for NAME SPEC.`
pub fn missing_packages(explanation: &str) -> Vec<String> {
    let mut names: Vec<String> = explanation
        .lines()
        .filter_map(|line| {
            line.split_once("No candidates were found for ")
                .map(|(_, r)| r)
        })
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|name| name.trim_end_matches('.').to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_gets_the_closest_expected_one() {
        let message = "unknown field `nmae`, expected one of `name`, `tags`, `base`, `platforms`";
        assert_eq!(for_unknown_key(message).as_deref(), Some("name"));
        assert_eq!(
            for_unknown_key("unknown field `dependecies`, expected `channels` or `dependencies`")
                .as_deref(),
            Some("dependencies")
        );
        assert_eq!(
            for_unknown_key("unknown field `zzz`, expected one of `name`, `tags`"),
            None
        );
        assert_eq!(for_unknown_key("invalid type: string"), None);
        assert_eq!(
            for_unknown_key("unknown field `maximum`, expected `max`").as_deref(),
            Some("max")
        );
    }

    #[test]
    fn closest_ranks_by_distance_and_skips_far_and_equal_words() {
        let names = ["numpy", "numba", "numpy-base", "pandas", "nump"];
        assert_eq!(closest("numpyy", names, 3), vec!["numpy", "nump"]);
        assert_eq!(closest("pnadas", names, 3), vec!["pandas"]);
        assert!(closest("numpy", ["numpy"], 3).is_empty());
        assert!(closest("x", names, 3).is_empty());
    }

    #[test]
    fn missing_packages_are_read_from_the_explanation() {
        let explanation = "The following packages are incompatible\n└─ helo * cannot be installed because there are no viable options:\n   └─ No candidates were found for helo *.\n";
        assert_eq!(missing_packages(explanation), vec!["helo"]);
        assert_eq!(
            missing_packages("└─ No candidates were found for torch >=2."),
            vec!["torch"]
        );
    }
}
