//! The package reader imgbuild runs on every archive before trusting it
//! (`imgbuild::install::scan`), on arbitrary bytes as a `.tar.bz2` and as a `.conda`: it must
//! return a refusal or a count of entries, never panic, hang or read out of bounds.
#![no_main]

use std::io::Cursor;

use imgbuild::install::scan::{ArchiveKind, scan_archive};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for kind in [ArchiveKind::TarBz2, ArchiveKind::Conda] {
        let _ = scan_archive(Cursor::new(data), kind, "fuzz.pkg");
    }
});
