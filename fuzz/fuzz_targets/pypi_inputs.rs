//! What imgbuild reads from package indexes and wheels, all of it written by others: project
//! pages (PEP 503 HTML, PEP 691 JSON), core metadata, wheel file names, and whole wheels
//! through the installer. Each must give a result or a refusal, never panic or hang, and
//! the installer must never write outside the prefix it is given.
#![no_main]

use std::collections::BTreeMap;

use imgbuild::pypi::{
    index::parse_page,
    install::{Scheme, install_wheel},
    metadata::CoreMetadata,
    tags::WheelName,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let base = url::Url::parse("https://pypi.example/simple/project/").expect("valid");
    for json in [false, true] {
        let _ = parse_page(&text, json, &base);
    }
    let _ = CoreMetadata::parse(&text);
    for line in text.lines().take(8) {
        let _ = WheelName::parse(line);
    }

    // The bytes as a wheel, installed into a prefix inside a directory of its own.
    // Named after the first `NAME-VERSION.dist-info/` the bytes mention, as the installer
    // checks the wheel's name against its `.dist-info`.
    let dist = text
        .find(".dist-info/")
        .and_then(|end| {
            let start = text[..end]
                .char_indices()
                .rev()
                .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
                .map_or(0, |(i, c)| i + c.len_utf8());
            let stem = &text[start..end];
            stem.contains('-').then(|| stem.to_string())
        })
        .unwrap_or_else(|| "fuzz-1.0".to_string());
    let file_name = format!("{dist}-py3-none-any.whl");
    let dir = tempfile::tempdir().expect("a temp dir");
    let wheel = dir.path().join("wheel.whl");
    std::fs::write(&wheel, data).expect("writing the wheel");
    let root = dir.path().join("root");
    let prefix = root.join("opt/conda");
    std::fs::create_dir_all(&prefix).expect("the prefix");
    let scheme = Scheme::conda("/opt/conda", "3.9");
    if let Ok(staged) = install_wheel(
        &wheel,
        &file_name,
        &prefix,
        &scheme,
        true,
        &mut BTreeMap::new(),
    ) {
        for file in &staged.files {
            assert!(
                prefix.join(file).starts_with(&prefix) && !file.contains(".."),
                "{file} is outside the prefix"
            );
        }
    }
    // Nothing but the prefix (and the wheel) appeared.
    let top: Vec<_> = std::fs::read_dir(&root)
        .expect("the root")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(top, ["opt"], "the installer wrote outside the prefix");
});
