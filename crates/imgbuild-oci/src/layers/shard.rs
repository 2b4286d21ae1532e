//! Which worker of a sharded build compresses which layer (`build --shard I/N`). Pure, and
//! the same on every worker: each one computes the assignment from the same distinct layers
//! (the union over every variant and platform of a matrix) and takes its own part, so the
//! workers need to say nothing to one another.

use std::collections::BTreeMap;

/// `I/N`: worker `index` (from 0) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

/// More shards than any array or Indexed Job a matrix would want, and few enough that a
/// typo (`--shard 3/40000`) is caught.
pub const MAX_SHARDS: usize = 1000;

impl Shard {
    /// `I/N`, as Slurm's `$SLURM_ARRAY_TASK_ID` and Kubernetes' completion index give `I`:
    /// from 0, below `N`.
    pub fn parse(text: &str) -> Result<Shard, String> {
        let expected = || {
            format!(
                "`{text}` is not a shard: expected `I/N`, worker I of N counting from 0 (`0/4` … `3/4`), N at most {MAX_SHARDS}"
            )
        };
        let (index, count) = text.split_once('/').ok_or_else(expected)?;
        let number = |s: &str| {
            // Digits only: `+1` and ` 1` are not what a scheduler writes.
            s.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| s.parse::<usize>().ok())
                .flatten()
        };
        match (number(index), number(count)) {
            (Some(index), Some(count)) if index < count && count <= MAX_SHARDS => {
                Ok(Shard { index, count })
            }
            _ => Err(expected()),
        }
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The shard of each distinct layer, by its layer-cache key. `layers` are `(key, bytes)`:
/// the bytes are what compressing the layer costs, its file data. Longest processing time
/// first: the largest layer goes to the shard with the fewest bytes so far, then the next;
/// equal sizes in key order and equal loads to the lowest shard, so every worker computes
/// the same map. A key given twice is one layer.
pub fn assign(layers: &[(String, u64)], count: usize) -> BTreeMap<String, usize> {
    let mut distinct: BTreeMap<&str, u64> = BTreeMap::new();
    for (key, size) in layers {
        let size_of = distinct.entry(key).or_insert(*size);
        // The same key is the same layer; the larger figure, should two ever differ.
        *size_of = (*size_of).max(*size);
    }
    let mut order: Vec<(&str, u64)> = distinct.into_iter().collect();
    order.sort_by(|(ka, a), (kb, b)| b.cmp(a).then(ka.cmp(kb)));
    let mut loads = vec![0u64; count.max(1)];
    order
        .into_iter()
        .map(|(key, size)| {
            let shard = (0..loads.len())
                .min_by_key(|&i| (loads[i], i))
                .expect("at least one shard");
            loads[shard] += size;
            (key.to_string(), shard)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(sizes: &[(&str, u64)]) -> Vec<(String, u64)> {
        sizes.iter().map(|(k, s)| (k.to_string(), *s)).collect()
    }

    #[test]
    fn parses_what_schedulers_write() {
        assert_eq!(Shard::parse("0/4"), Ok(Shard { index: 0, count: 4 }));
        assert_eq!(Shard::parse("3/4"), Ok(Shard { index: 3, count: 4 }));
        assert_eq!(Shard::parse("0/1"), Ok(Shard { index: 0, count: 1 }));
        for bad in [
            "4/4", "1/0", "0/0", "-1/4", "+1/4", "1", "1/", "/4", "a/4", " 1/4", "0/1001",
        ] {
            let err = Shard::parse(bad).unwrap_err();
            assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
        }
    }

    #[test]
    fn largest_first_to_the_least_loaded_shard() {
        let assigned = assign(
            &layers(&[("a", 100), ("b", 60), ("c", 50), ("d", 40), ("e", 10)]),
            2,
        );
        // a→0 (100); b→1 (60); c→1 (110); d→0 (140); e→1 (120).
        let expected = [("a", 0), ("b", 1), ("c", 1), ("d", 0), ("e", 1)];
        for (key, shard) in expected {
            assert_eq!(assigned[key], shard, "{key}");
        }
    }

    #[test]
    fn the_same_on_every_worker_whatever_the_order_given() {
        let forward = layers(&[("x", 5), ("y", 5), ("z", 5), ("w", 9), ("x", 5)]);
        let mut backward = forward.clone();
        backward.reverse();
        assert_eq!(assign(&forward, 3), assign(&backward, 3));
        assert_eq!(assign(&forward, 3).len(), 4, "x twice is one layer");
    }

    #[test]
    fn every_layer_has_exactly_one_shard_and_loads_stay_balanced() {
        let many: Vec<(String, u64)> = (0..40u64)
            .map(|i| (format!("k{i:02}"), 1 + (i * 7919) % 1000))
            .collect();
        for count in [1, 2, 3, 4, 7] {
            let assigned = assign(&many, count);
            assert_eq!(assigned.len(), many.len());
            let mut loads = vec![0u64; count];
            for (key, size) in &many {
                loads[assigned[key]] += size;
            }
            let (max, min) = (loads.iter().max().unwrap(), loads.iter().min().unwrap());
            // LPT: no shard exceeds another by more than the largest layer.
            assert!(max - min <= 1000, "{count}: {loads:?}");
        }
    }

    #[test]
    fn more_shards_than_layers_leaves_some_empty() {
        let assigned = assign(&layers(&[("a", 3), ("b", 2)]), 4);
        assert_eq!((assigned["a"], assigned["b"]), (0, 1));
    }
}
