//! A lock file's text: locks arrive in pull requests beside their recipes. imgbuild must
//! read the lock or refuse it with an error (rattler_lock and pep508_rs underneath: a panic
//! there, as pep508_rs 0.9.2 gives for `torch-- >=1`, is a crash here), and a lock it read
//! must render to text it reads again.
#![no_main]

use std::path::Path;

use imgbuild::lock::Lock;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Locks are read as UTF-8; anything else is refused before parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/fuzz/recipes/image.lock");
    let lock = match Lock::parse(text, path) {
        Ok(lock) => lock,
        Err(err) => {
            let _ = err.to_string();
            return;
        }
    };
    let again = lock
        .render("image.toml", Path::new("/fuzz/recipes"))
        .unwrap_or_else(|e| panic!("a lock imgbuild read does not render: {e}\n{text}"));
    if let Err(e) = Lock::parse(&again, path) {
        panic!("a rendered lock does not read back: {e}\n{again}");
    }
});
