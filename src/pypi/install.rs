//! Installing a wheel into the staged environment, as the binary distribution format spec
//! and PEP 376/627 say, at the in-image prefix:
//! - `purelib`/`platlib` files go to `lib/pythonX.Y/site-packages`; `NAME-VER.data/<scheme>/`
//!   trees to their scheme's directory (`scripts` → `bin`, `headers` →
//!   `include/pythonX.Y/NAME`, `data` → the prefix);
//! - every file is checked against the wheel's `RECORD` (sha256 and size) before it is
//!   written; a path that would leave its directory is refused;
//! - scripts whose first line is `#!python` get the in-image Python, and console and GUI
//!   entry points become scripts with that shebang;
//! - `INSTALLER` says `imgbuild`, `REQUESTED` marks what the recipe asked for, and `RECORD` is
//!   rewritten to list what was installed.
//!
//! No `.pyc` is compiled: that would run the target's Python (the same rule as conda
//! packages, whose link scripts are not run either).

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    path::{Component, Path, PathBuf},
};

use base64::Engine;
use pep440_rs::Version;
use pep508_rs::PackageName;
use sha2::{Digest, Sha256};

/// The most a wheel's own metadata file (`WHEEL`, `RECORD`, `entry_points.txt`) may hold.
const METADATA_LIMIT: u64 = 64 << 20;

/// A wheel installed in the staging tree.
#[derive(Debug, Clone)]
pub struct StagedWheel {
    pub name: PackageName,
    pub version: Version,
    /// `name-version` as PyPI spells it in the wheel (`python_dateutil-2.9.0.post0`).
    pub dist_name: String,
    /// Prefix-relative paths of everything installed, `.dist-info` included.
    pub files: Vec<String>,
    /// Modification time for the layer: the newest entry time in the wheel, so it depends
    /// on the wheel's bytes only.
    pub mtime: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum WheelInstallError {
    #[error("Wheel `{wheel}` is refused: {reason}")]
    Invalid { wheel: String, reason: String },
    #[error("Wheel `{wheel}`: `{path}` is already installed, with other contents, by `{owner}`")]
    Conflict {
        wheel: String,
        path: String,
        owner: String,
    },
    #[error("Failed to install wheel `{wheel}` at `{}`", path.display())]
    Io {
        wheel: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the wheel goes: the prefix's paths, relative to the prefix.
#[derive(Debug, Clone)]
pub struct Scheme {
    /// `lib/python3.9/site-packages`
    pub site_packages: String,
    /// `include/python3.9`
    pub include: String,
    /// The in-image Python for shebangs: `/opt/conda/bin/python3.9`.
    pub python: String,
}

impl Scheme {
    pub fn conda(prefix: &str, python_short: &str) -> Scheme {
        Scheme {
            site_packages: format!("lib/python{python_short}/site-packages"),
            include: format!("include/python{python_short}"),
            python: format!("{}/bin/python{python_short}", prefix.trim_end_matches('/')),
        }
    }
}

/// One `RECORD` line: where, sha256 and size.
struct RecordEntry {
    hash: Option<String>,
    size: Option<u64>,
}

fn parse_record(text: &str) -> BTreeMap<String, RecordEntry> {
    let mut entries = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        // RECORD is CSV; paths with commas are quoted.
        let (path, rest) = if let Some(quoted) = line.strip_prefix('"') {
            match quoted.split_once("\",") {
                Some((path, rest)) => (path.replace("\"\"", "\""), rest),
                None => continue,
            }
        } else {
            match line.split_once(',') {
                Some((path, rest)) => (path.to_string(), rest),
                None => (line.to_string(), ""),
            }
        };
        let (hash, size) = rest.split_once(',').unwrap_or((rest, ""));
        entries.insert(
            path,
            RecordEntry {
                hash: hash.strip_prefix("sha256=").map(str::to_string),
                size: size.trim().parse().ok(),
            },
        );
    }
    entries
}

fn urlsafe_sha256(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes))
}

/// A relative path with no `..`, no root, no `.`-only parts.
fn safe_relative(path: &str) -> Option<PathBuf> {
    let candidate = Path::new(path);
    let mut clean = PathBuf::new();
    for component in candidate.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!clean.as_os_str().is_empty()).then_some(clean)
}

/// Entry points of `entry_points.txt`: `(script name, module, function)` of the console and
/// GUI sections.
fn entry_points(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut scripts = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
            continue;
        }
        if section != "console_scripts" && section != "gui_scripts" {
            continue;
        }
        let Some((name, target)) = line.split_once('=') else {
            continue;
        };
        // `module:attr [extra]`: the extras do not change the script.
        let target = target.split('[').next().unwrap_or("").trim();
        let (module, function) = target.split_once(':').unwrap_or((target, ""));
        scripts.push((
            name.trim().to_string(),
            module.trim().to_string(),
            function.trim().to_string(),
        ));
    }
    scripts
}

fn entry_point_script(python: &str, module: &str, function: &str) -> String {
    let (import, call) = match function.split_once('.') {
        Some((head, _)) => (head, function),
        None => (function, function),
    };
    format!(
        "#!{python}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom {module} import {import}\nif __name__ == \"__main__\":\n    sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n    sys.exit({call}())\n"
    )
}

/// Installs the wheel at `wheel_path` into `prefix_dir` (the staging path of the in-image
/// prefix). `owned` holds the prefix-relative paths already installed, with their owner;
/// the wheel's paths are added to it.
pub fn install_wheel(
    wheel_path: &Path,
    wheel_file: &str,
    prefix_dir: &Path,
    scheme: &Scheme,
    requested: bool,
    owned: &mut BTreeMap<String, String>,
) -> Result<StagedWheel, WheelInstallError> {
    let invalid = |reason: String| WheelInstallError::Invalid {
        wheel: wheel_file.to_string(),
        reason,
    };
    let io = |path: &Path| {
        let path = path.to_path_buf();
        let wheel = wheel_file.to_string();
        move |source| WheelInstallError::Io {
            wheel,
            path,
            source,
        }
    };
    let name = super::tags::WheelName::parse(wheel_file)
        .ok_or_else(|| invalid("its file name is not a wheel name".to_string()))?;
    let file = fs_err::File::open(wheel_path).map_err(io(wheel_path))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| invalid(format!("it is not a zip file: {e}")))?;

    // The one top-level `*.dist-info` directory whose name matches the wheel.
    let names = member_names(&archive);
    let dist_info = names
        .iter()
        .filter_map(|n| n.split('/').next())
        .filter(|top| top.ends_with(".dist-info"))
        .find(|top| {
            top.strip_suffix(".dist-info")
                .and_then(|stem| stem.rsplit_once('-'))
                .and_then(|(n, _)| PackageName::new(n.to_string()).ok())
                .is_some_and(|n| n == name.name)
        })
        .map(str::to_string)
        .ok_or_else(|| invalid("it has no `.dist-info` directory for its own name".to_string()))?;
    let dist_name = dist_info
        .strip_suffix(".dist-info")
        .expect("filtered on the suffix")
        .to_string();
    let read = |archive: &mut zip::ZipArchive<fs_err::File>,
                member: &str|
     -> Result<Option<Vec<u8>>, WheelInstallError> {
        match archive.by_name(member) {
            Ok(entry) => {
                // Metadata files are small; a huge one is a zip bomb, not metadata.
                let mut bytes = Vec::new();
                entry
                    .take(METADATA_LIMIT + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| invalid(format!("`{member}` cannot be read: {e}")))?;
                if bytes.len() as u64 > METADATA_LIMIT {
                    return Err(invalid(format!("`{member}` is larger than 64 MiB")));
                }
                Ok(Some(bytes))
            }
            Err(zip::result::ZipError::FileNotFound) => Ok(None),
            Err(e) => Err(invalid(format!("`{member}` cannot be read: {e}"))),
        }
    };
    let wheel_meta = read(&mut archive, &format!("{dist_info}/WHEEL"))?
        .ok_or_else(|| invalid(format!("`{dist_info}/WHEEL` is missing")))?;
    let wheel_meta = String::from_utf8_lossy(&wheel_meta).into_owned();
    let field = |key: &str| {
        wheel_meta.lines().find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.trim().eq_ignore_ascii_case(key))
                .map(|(_, v)| v.trim().to_string())
        })
    };
    if let Some(version) = field("Wheel-Version")
        && !version.starts_with("1.")
    {
        return Err(invalid(format!("its Wheel-Version {version} is not 1.x")));
    }
    let purelib = field("Root-Is-Purelib").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let _ = purelib; // Both roots are site-packages in a conda prefix.
    let record_name = format!("{dist_info}/RECORD");
    let record = read(&mut archive, &record_name)?
        .ok_or_else(|| invalid(format!("`{record_name}` is missing")))?;
    let record = parse_record(&String::from_utf8_lossy(&record));
    let data_dir = format!("{dist_name}.data/");

    let mut installed: BTreeMap<String, (String, u64)> = BTreeMap::new(); // prefix path → (hash, size)
    let mut newest_mtime = 0u64;
    let mut seen = BTreeSet::new();
    for index in 0..archive.len() {
        let mut entry = archive
            .by_index(index)
            .map_err(|e| invalid(format!("entry {index} cannot be read: {e}")))?;
        let member = entry
            .name()
            .map_err(|e| invalid(format!("entry {index} has no readable name: {e}")))?
            .into_owned();
        if entry.is_dir() {
            continue;
        }
        if entry.is_symlink() {
            return Err(invalid(format!(
                "`{member}` is a symbolic link, which wheels cannot hold"
            )));
        }
        let relative = safe_relative(&member)
            .ok_or_else(|| invalid(format!("`{member}` is not a path inside the wheel")))?;
        if member == record_name
            || member.ends_with(".dist-info/RECORD.jws")
            || member.ends_with(".dist-info/RECORD.p7s")
        {
            continue;
        }
        if let Some(time) = entry.last_modified()
            && let Ok(time) = jiff::civil::DateTime::new(
                time.year() as i16,
                time.month() as i8,
                time.day() as i8,
                time.hour() as i8,
                time.minute() as i8,
                time.second() as i8,
                0,
            )
            && let Ok(stamp) = time.to_zoned(jiff::tz::TimeZone::UTC)
        {
            newest_mtime = newest_mtime.max(stamp.timestamp().as_second().max(0) as u64);
        }
        let executable = entry.unix_mode().is_some_and(|m| m & 0o111 != 0);
        let (expected_hash, expected_size) = match record.get(&member) {
            Some(RecordEntry {
                hash: Some(hash),
                size,
            }) => (hash.clone(), *size),
            _ => return Err(invalid(format!("`{member}` has no sha256 in RECORD"))),
        };
        // Where the file goes, relative to the prefix.
        let mut script = false;
        let destination: PathBuf = match relative.strip_prefix(data_dir.trim_end_matches('/')) {
            Ok(rest) => {
                let mut parts = rest.components();
                let scheme_name = parts
                    .next()
                    .and_then(|c| c.as_os_str().to_str())
                    .unwrap_or("")
                    .to_string();
                let rest: PathBuf = parts.collect();
                match scheme_name.as_str() {
                    "purelib" | "platlib" => Path::new(&scheme.site_packages).join(rest),
                    "scripts" => {
                        script = true;
                        Path::new("bin").join(rest)
                    }
                    "headers" => Path::new(&scheme.include)
                        .join(dist_name.split('-').next().unwrap_or(&dist_name))
                        .join(rest),
                    "data" => rest,
                    other => {
                        return Err(invalid(format!(
                            "`{member}` is in the unknown data scheme `{other}`"
                        )));
                    }
                }
            }
            Err(_) => Path::new(&scheme.site_packages).join(&relative),
        };
        if destination.components().count() == 0 {
            return Err(invalid(format!("`{member}` names no file")));
        }
        let destination_text = destination
            .to_str()
            .ok_or_else(|| invalid(format!("`{member}` is not UTF-8")))?
            .to_string();
        if !seen.insert(destination_text.clone()) {
            return Err(invalid(format!(
                "`{destination_text}` is in the wheel twice"
            )));
        }

        // Streamed into a temporary file beside its destination (a 1 GB library is never
        // in memory), hashed as it comes, and checked against RECORD before it is moved
        // into place; a file larger than RECORD says is refused as soon as it is.
        let target = prefix_dir.join(&destination);
        let parent = target.parent().expect("a file under the prefix");
        fs_err::create_dir_all(parent).map_err(io(&destination))?;
        let mut temp = tempfile::NamedTempFile::new_in(parent).map_err(io(&destination))?;
        let copied = copy_checked(
            &mut entry,
            temp.as_file_mut(),
            expected_size,
            (script).then_some(scheme.python.as_str()),
        )
        .map_err(|e| match e {
            CopyError::Read(e) => invalid(format!("`{member}` cannot be read: {e}")),
            CopyError::TooLarge => {
                invalid(format!("`{member}` is larger than its RECORD entry says"))
            }
            CopyError::Write(e) => WheelInstallError::Io {
                wheel: wheel_file.to_string(),
                path: destination.clone(),
                source: e,
            },
        })?;
        drop(entry);
        if copied.original_hash != expected_hash
            || expected_size.is_some_and(|s| s != copied.original_size)
        {
            return Err(invalid(format!(
                "`{member}` does not match its RECORD entry (sha256 or size)"
            )));
        }
        let mode = if executable || script { 0o755 } else { 0o644 };
        if let Some(owner) = owned.get(&destination_text) {
            // Namespace packages: NVIDIA's wheels all ship the same empty
            // `nvidia/__init__.py`. The same bytes are the same file (and stay in each
            // wheel's layer, so every layer stands alone); different bytes would make the
            // environment depend on install order.
            let existing = hash_file(&target).map_err(io(&destination))?;
            if existing != copied.installed_hash {
                return Err(WheelInstallError::Conflict {
                    wheel: wheel_file.to_string(),
                    path: destination_text,
                    owner: owner.clone(),
                });
            }
        } else {
            use std::os::unix::fs::PermissionsExt;
            temp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(io(&destination))?;
            temp.persist(&target)
                .map_err(|e| io(&destination)(e.error))?;
        }
        installed.insert(
            destination_text,
            (copied.installed_hash, copied.installed_size),
        );
    }

    let dist_info_dir = format!("{}/{dist_info}", scheme.site_packages);
    // Entry points become scripts.
    if let Some(text) = read(&mut archive, &format!("{dist_info}/entry_points.txt"))? {
        for (script_name, module, function) in entry_points(&String::from_utf8_lossy(&text)) {
            if safe_relative(&script_name).is_none_or(|p| p.components().count() != 1) {
                return Err(invalid(format!(
                    "entry point `{script_name}` is not a file name"
                )));
            }
            let destination = format!("bin/{script_name}");
            if let Some(owner) = owned.get(&destination) {
                return Err(WheelInstallError::Conflict {
                    wheel: wheel_file.to_string(),
                    path: destination,
                    owner: owner.clone(),
                });
            }
            let bytes = entry_point_script(&scheme.python, &module, &function).into_bytes();
            write_file(&prefix_dir.join(&destination), &bytes, 0o755)
                .map_err(io(Path::new(&destination)))?;
            installed.insert(destination, (urlsafe_sha256(&bytes), bytes.len() as u64));
        }
    }
    let mut extra_files = vec![(format!("{dist_info_dir}/INSTALLER"), b"imgbuild\n".to_vec())];
    if requested {
        extra_files.push((format!("{dist_info_dir}/REQUESTED"), Vec::new()));
    }
    for (path, bytes) in extra_files {
        write_file(&prefix_dir.join(&path), &bytes, 0o644).map_err(io(Path::new(&path)))?;
        installed.insert(path, (urlsafe_sha256(&bytes), bytes.len() as u64));
    }
    // RECORD lists paths relative to site-packages; files elsewhere get `../` paths.
    let record_path = format!("{dist_info_dir}/RECORD");
    let depth = scheme.site_packages.split('/').count();
    let mut record_text = String::new();
    for (path, (hash, size)) in &installed {
        let relative = match path.strip_prefix(&format!("{}/", scheme.site_packages)) {
            Some(inside) => inside.to_string(),
            None => format!("{}{path}", "../".repeat(depth)),
        };
        record_text.push_str(&csv_field(&relative));
        record_text.push_str(&format!(",sha256={hash},{size}\n"));
    }
    record_text.push_str(&csv_field(&format!("{dist_info}/RECORD")));
    record_text.push_str(",,\n");
    write_file(
        &prefix_dir.join(&record_path),
        record_text.as_bytes(),
        0o644,
    )
    .map_err(io(Path::new(&record_path)))?;

    let mut files: Vec<String> = installed.into_keys().collect();
    files.push(record_path);
    files.sort();
    let label = format!("pypi {dist_name}");
    for file in &files {
        owned.entry(file.clone()).or_insert_with(|| label.clone());
    }
    Ok(StagedWheel {
        name: name.name,
        version: name.version,
        dist_name,
        files,
        mtime: newest_mtime,
    })
}

/// What [`copy_checked`] copied: the hash and size of the wheel's bytes (for RECORD) and
/// of the file as installed (a rewritten shebang differs).
struct Copied {
    original_hash: String,
    original_size: u64,
    installed_hash: String,
    installed_size: u64,
}

enum CopyError {
    Read(std::io::Error),
    Write(std::io::Error),
    TooLarge,
}

/// Copies `from` to `to` in pieces, hashing both sides. With `python`, a first line
/// `#!python…` becomes `#!<python>`.
fn copy_checked(
    from: &mut impl Read,
    to: &mut impl Write,
    limit: Option<u64>,
    python: Option<&str>,
) -> Result<Copied, CopyError> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, from);
    let mut original = Sha256::new();
    let mut installed = Sha256::new();
    let (mut original_size, mut installed_size) = (0u64, 0u64);
    let mut put = |bytes: &[u8], rewritten: Option<&[u8]>| -> Result<(), CopyError> {
        original.update(bytes);
        original_size += bytes.len() as u64;
        if limit.is_some_and(|limit| original_size > limit) {
            return Err(CopyError::TooLarge);
        }
        let out = rewritten.unwrap_or(bytes);
        installed.update(out);
        installed_size += out.len() as u64;
        to.write_all(out).map_err(CopyError::Write)
    };
    if let Some(python) = python {
        // The first line, at most 4 KiB of it.
        let mut head = Vec::new();
        (&mut reader)
            .take(4096)
            .read_until(b'\n', &mut head)
            .map_err(CopyError::Read)?;
        if head.starts_with(b"#!python") {
            let newline = if head.ends_with(b"\n") { "\n" } else { "" };
            let rewritten = format!("#!{python}{newline}");
            put(&head, Some(rewritten.as_bytes()))?;
        } else {
            put(&head, None)?;
        }
    }
    loop {
        let chunk = reader.fill_buf().map_err(CopyError::Read)?;
        if chunk.is_empty() {
            break;
        }
        let len = chunk.len();
        put(chunk, None)?;
        reader.consume(len);
    }
    let encode =
        |hasher: Sha256| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hasher.finalize());
    Ok(Copied {
        original_hash: encode(original),
        original_size,
        installed_hash: encode(installed),
        installed_size,
    })
}

/// The RECORD-style hash (urlsafe base64 sha256) of a file.
fn hash_file(path: &Path) -> std::io::Result<String> {
    let digest = rattler_digest::compute_file_digest::<rattler_digest::Sha256>(path)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest))
}

/// Every member name of a wheel that is valid UTF-8.
pub(super) fn member_names(archive: &zip::ZipArchive<fs_err::File>) -> Vec<String> {
    archive
        .file_names()
        .filter_map(Result::ok)
        .map(|n| n.into_owned())
        .collect()
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        fs_err::create_dir_all(parent)?;
    }
    let mut file = fs_err::File::create(path)?;
    file.write_all(bytes)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_lines_parse_with_quotes_and_without_hashes() {
        let record = parse_record(
            "six.py,sha256=abc,34549\n\"odd,name.py\",sha256=def,1\nsix-1.16.0.dist-info/RECORD,,\n",
        );
        assert_eq!(record["six.py"].hash.as_deref(), Some("abc"));
        assert_eq!(record["six.py"].size, Some(34549));
        assert_eq!(record["odd,name.py"].hash.as_deref(), Some("def"));
        assert!(record["six-1.16.0.dist-info/RECORD"].hash.is_none());
    }

    #[test]
    fn entry_points_give_console_and_gui_scripts_only() {
        let scripts = entry_points(
            "[console_scripts]\npyflakes = pyflakes.api:main\n\n[gui_scripts]\nx=a.b:c.d [extra]\n[other]\ny = z:w\n",
        );
        assert_eq!(
            scripts,
            vec![
                ("pyflakes".into(), "pyflakes.api".into(), "main".into()),
                ("x".into(), "a.b".into(), "c.d".into())
            ]
        );
        let script = entry_point_script("/opt/conda/bin/python3.9", "a.b", "c.d");
        assert!(script.starts_with("#!/opt/conda/bin/python3.9\n"));
        assert!(script.contains("from a.b import c\n") && script.contains("sys.exit(c.d())"));
    }

    /// A wheel `demo-1.0` holding `files`, with a RECORD that lists them truthfully except
    /// for the entries of `record_lies` (path, line).
    fn wheel(dir: &Path, files: &[(&str, &[u8])], record_lies: &[(&str, &str)]) -> PathBuf {
        use zip::write::SimpleFileOptions;
        let path = dir.join("demo-1.0-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let options = SimpleFileOptions::default().unix_permissions(0o644);
        let mut record = String::new();
        let mut all: Vec<(&str, &[u8])> = files.to_vec();
        all.push((
            "demo-1.0.dist-info/WHEEL",
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n",
        ));
        all.push((
            "demo-1.0.dist-info/METADATA",
            b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
        ));
        for (name, bytes) in &all {
            zip.start_file(*name, options).unwrap();
            zip.write_all(bytes).unwrap();
            match record_lies.iter().find(|(n, _)| n == name) {
                Some((_, line)) => record.push_str(&format!("{line}\n")),
                None => record.push_str(&format!(
                    "{name},sha256={},{}\n",
                    urlsafe_sha256(bytes),
                    bytes.len()
                )),
            }
        }
        record.push_str("demo-1.0.dist-info/RECORD,,\n");
        zip.start_file("demo-1.0.dist-info/RECORD", options)
            .unwrap();
        zip.write_all(record.as_bytes()).unwrap();
        zip.finish().unwrap();
        path
    }

    fn install(
        dir: &Path,
        wheel: &Path,
        owned: &mut BTreeMap<String, String>,
    ) -> Result<StagedWheel, WheelInstallError> {
        let prefix = dir.join("prefix");
        fs_err::create_dir_all(&prefix).unwrap();
        install_wheel(
            wheel,
            "demo-1.0-py3-none-any.whl",
            &prefix,
            &Scheme::conda("/opt/conda", "3.9"),
            true,
            owned,
        )
    }

    #[test]
    fn a_wheel_installs_with_its_scripts_entry_points_and_a_true_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = wheel(
            dir.path(),
            &[
                ("demo/__init__.py", b"x = 1\n"),
                (
                    "demo-1.0.data/scripts/demo-tool",
                    b"#!python\nprint('hi')\n",
                ),
                ("demo-1.0.data/data/share/demo.txt", b"data\n"),
                (
                    "demo-1.0.dist-info/entry_points.txt",
                    b"[console_scripts]\ndemo = demo:main\n",
                ),
            ],
            &[],
        );
        let staged = install(dir.path(), &path, &mut BTreeMap::new()).unwrap();
        let prefix = dir.path().join("prefix");
        let site = "lib/python3.9/site-packages";
        assert_eq!(
            fs_err::read_to_string(prefix.join("bin/demo-tool")).unwrap(),
            "#!/opt/conda/bin/python3.9\nprint('hi')\n"
        );
        assert!(
            fs_err::read_to_string(prefix.join("bin/demo"))
                .unwrap()
                .contains("from demo import main")
        );
        assert_eq!(
            fs_err::read_to_string(prefix.join("share/demo.txt")).unwrap(),
            "data\n"
        );
        assert_eq!(
            fs_err::read_to_string(prefix.join(format!("{site}/demo-1.0.dist-info/INSTALLER")))
                .unwrap(),
            "imgbuild\n"
        );
        // RECORD lists what is installed, with the rewritten script's own hash.
        let record =
            fs_err::read_to_string(prefix.join(format!("{site}/demo-1.0.dist-info/RECORD")))
                .unwrap();
        let script = fs_err::read(prefix.join("bin/demo-tool")).unwrap();
        assert!(
            record.contains(&format!(
                "../../../bin/demo-tool,sha256={},{}",
                urlsafe_sha256(&script),
                script.len()
            )),
            "{record}"
        );
        assert!(record.contains("demo-1.0.dist-info/REQUESTED,"), "{record}");
        assert!(staged.files.contains(&"bin/demo".to_string()));
        assert!(staged.files.contains(&format!("{site}/demo/__init__.py")));
    }

    #[test]
    fn a_file_that_does_not_match_record_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let lie = format!("demo/__init__.py,sha256={},6", urlsafe_sha256(b"other\n"));
        let path = wheel(
            dir.path(),
            &[("demo/__init__.py", b"x = 1\n")],
            &[("demo/__init__.py", &lie)],
        );
        let err = install(dir.path(), &path, &mut BTreeMap::new()).unwrap_err();
        assert!(
            err.to_string().contains("does not match its RECORD entry"),
            "{err}"
        );
        let left: Vec<_> = walkdir::WalkDir::new(dir.path().join("prefix"))
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_file())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_file_larger_than_record_says_is_refused_while_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![b'a'; 1 << 20];
        let lie = format!("demo/big.bin,sha256={},10", urlsafe_sha256(&big[..10]));
        let path = wheel(
            dir.path(),
            &[("demo/big.bin", &big)],
            &[("demo/big.bin", &lie)],
        );
        let err = install(dir.path(), &path, &mut BTreeMap::new()).unwrap_err();
        assert!(
            err.to_string()
                .contains("larger than its RECORD entry says"),
            "{err}"
        );
    }

    #[test]
    fn a_path_out_of_the_wheel_or_a_file_without_a_hash_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = wheel(
            dir.path(),
            &[("demo/x.py", b"")],
            &[("demo/x.py", "demo/x.py,,")],
        );
        let err = install(dir.path(), &path, &mut BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("has no sha256 in RECORD"), "{err}");
        let path = wheel(dir.path(), &[("../escape.py", b"")], &[]);
        let err = install(dir.path(), &path, &mut BTreeMap::new()).unwrap_err();
        assert!(
            err.to_string().contains("is not a path inside the wheel"),
            "{err}"
        );
        assert!(!dir.path().join("escape.py").exists());
    }

    #[test]
    fn a_file_another_package_installed_is_shared_only_when_identical() {
        let dir = tempfile::tempdir().unwrap();
        let site = "lib/python3.9/site-packages";
        let shared = dir.path().join(format!("prefix/{site}/demo/__init__.py"));
        fs_err::create_dir_all(shared.parent().unwrap()).unwrap();
        let mut owned = BTreeMap::from([(
            format!("{site}/demo/__init__.py"),
            "pypi other-1".to_string(),
        )]);
        fs_err::write(&shared, "").unwrap();
        let path = wheel(dir.path(), &[("demo/__init__.py", b"")], &[]);
        install(dir.path(), &path, &mut owned).unwrap();
        assert_eq!(owned[&format!("{site}/demo/__init__.py")], "pypi other-1");

        fs_err::remove_dir_all(dir.path().join(format!("prefix/{site}/demo-1.0.dist-info")))
            .unwrap();
        let path = wheel(dir.path(), &[("demo/__init__.py", b"different\n")], &[]);
        let err = install(dir.path(), &path, &mut owned).unwrap_err();
        assert!(
            err.to_string()
                .contains("already installed, with other contents, by `pypi other-1`"),
            "{err}"
        );
        assert_eq!(
            fs_err::read_to_string(&shared).unwrap(),
            "",
            "the first file is kept"
        );
    }

    #[test]
    fn paths_leaving_the_wheel_are_not_relative_paths() {
        assert!(safe_relative("../etc/passwd").is_none());
        assert!(safe_relative("/etc/passwd").is_none());
        assert!(safe_relative("a/../../b").is_none());
        assert_eq!(safe_relative("./a/b.py"), Some(PathBuf::from("a/b.py")));
    }
}
