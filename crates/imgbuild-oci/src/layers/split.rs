//! Splitting a large package by file into layers of bounded size (`[layers] split`).
//!
//! containerd and podman decompress and apply one layer on one thread, so a package of
//! 1.4 GB in one layer sets the floor of a cold pull however many cores the node has. Parts
//! of at most the bound are fetched and decompressed side by side.
//!
//! The split depends on nothing but the package's own files and sizes and the bound, so the
//! same package gives the same parts in every image, on every machine and at every `-j`:
//! the part count is the fewest parts of the bound that hold the package's bytes, and files
//! go largest first (then by path) to the part that holds the fewest bytes so far (the first
//! of those on a tie), or to a part of their own when that part would pass the bound. A file
//! larger than the bound has a part to itself. Each part lists its files in path order.

use serde::{Deserialize, Serialize};

/// Which part of its package a layer is: `index` of `count`, counting from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPart {
    pub index: u32,
    pub count: u32,
}

impl LayerPart {
    /// A part as the layer annotation writes it back: `2/3`; `None` for anything else.
    pub fn parse(text: &str) -> Option<LayerPart> {
        let (index, count) = text.split_once('/')?;
        let index: u32 = index.parse().ok()?;
        let count: u32 = count.parse().ok()?;
        (1..=count)
            .contains(&index)
            .then_some(LayerPart { index, count })
    }
}

impl std::fmt::Display for LayerPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// `files` (`(path, size)`, any order) split into parts of at most `bound` bytes each, a
/// file larger than that in a part of its own; one part when they fit in `bound`. Each
/// part is its files in path order and their bytes, and the parts are in the order of their
/// first path.
pub fn split_files(files: &[(&str, u64)], bound: u64) -> Vec<(Vec<String>, u64)> {
    let total: u64 = files.iter().map(|(_, size)| size).sum();
    if total <= bound || files.len() < 2 {
        return vec![part_of(files.iter().collect(), total)];
    }
    let count = total.div_ceil(bound.max(1)) as usize;
    let mut by_size: Vec<&(&str, u64)> = files.iter().collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let mut parts: Vec<(u64, Vec<&(&str, u64)>)> = vec![(0, Vec::new()); count];
    for file in by_size {
        let (least, _) = parts
            .iter()
            .enumerate()
            .min_by_key(|(i, (used, _))| (*used, *i))
            .expect("at least one part");
        let (used, members) = &mut parts[least];
        if *used == 0 || *used + file.1 <= bound {
            *used += file.1;
            members.push(file);
        } else {
            parts.push((file.1, vec![file]));
        }
    }
    let mut parts: Vec<(Vec<String>, u64)> = parts
        .into_iter()
        .filter(|(_, members)| !members.is_empty())
        .map(|(used, members)| part_of(members, used))
        .collect();
    parts.sort();
    parts
}

/// A part of `files`, which hold `bytes`: their paths in order, and the bytes.
fn part_of(files: Vec<&(&str, u64)>, bytes: u64) -> (Vec<String>, u64) {
    let mut paths: Vec<String> = files
        .into_iter()
        .map(|(path, _)| path.to_string())
        .collect();
    paths.sort();
    (paths, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paths of each part.
    fn paths(parts: &[(Vec<String>, u64)]) -> Vec<Vec<String>> {
        parts.iter().map(|(paths, _)| paths.clone()).collect()
    }

    /// The bytes of each part, from the sizes of its files in `of`.
    fn bytes(parts: &[(Vec<String>, u64)], of: &[(&str, u64)]) -> Vec<u64> {
        parts
            .iter()
            .map(|(part, _)| {
                part.iter()
                    .map(|p| of.iter().find(|(q, _)| q == p).unwrap().1)
                    .sum()
            })
            .collect()
    }

    #[test]
    fn a_package_within_the_bound_stays_whole() {
        let of = [("b", 40), ("a", 50)];
        assert_eq!(
            split_files(&of, 100),
            [(vec!["a".to_string(), "b".into()], 90)]
        );
    }

    #[test]
    fn parts_are_balanced_bounded_and_cover_every_file_once() {
        let of = [
            ("lib/big.so", 90),
            ("lib/mid.so", 60),
            ("lib/c.so", 30),
            ("lib/d.so", 30),
            ("share/e", 20),
            ("share/f", 10),
        ];
        let parts = split_files(&of, 100);
        // 240 bytes, bound 100: 3 parts, the 90-byte file alone.
        assert_eq!(parts.len(), 3);
        let sizes = bytes(&parts, &of);
        assert!(sizes.iter().all(|&s| s <= 100), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<u64>(), 240);
        // Each part says its own bytes.
        let said: Vec<u64> = parts.iter().map(|(_, bytes)| *bytes).collect();
        assert_eq!(said, sizes);
        let paths = paths(&parts);
        let mut all: Vec<&String> = paths.iter().flatten().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), of.len());
        for part in &paths {
            assert!(part.windows(2).all(|w| w[0] < w[1]), "{part:?}");
        }
    }

    #[test]
    fn the_split_ignores_the_order_files_come_in() {
        let of = [("x", 70), ("y", 70), ("z", 70), ("w", 5)];
        let mut reversed = of;
        reversed.reverse();
        assert_eq!(split_files(&of, 100), split_files(&reversed, 100));
    }

    #[test]
    fn a_file_over_the_bound_gets_a_part_of_its_own() {
        let of = [("huge", 500), ("small", 1)];
        assert_eq!(paths(&split_files(&of, 100)), [vec!["huge"], vec!["small"]]);
    }

    #[test]
    fn parts_read_back_from_their_annotation() {
        let part = LayerPart { index: 2, count: 3 };
        assert_eq!(LayerPart::parse(&part.to_string()), Some(part));
        for bad in ["0/3", "4/3", "2", "a/b", "2/3/4", ""] {
            assert_eq!(LayerPart::parse(bad), None, "{bad}");
        }
    }
}
