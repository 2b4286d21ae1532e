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
//! [`install_wheel`] takes the spec's steps ("Installing a wheel") in order, one function
//! each. It differs from the spec's wording in one way: the archive is never unpacked into
//! site-packages first and its `.data` directory moved afterwards. Each member goes straight
//! to its final place, so a file is written once, and only after it matched `RECORD`.
//!
//! No `.pyc` is compiled: that would run the target's Python (the same rule as conda
//! packages, whose link scripts are not run either).

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    path::{Component, Path, PathBuf},
};

use base64::Engine;
use pep440_rs::Version;
use pep508_rs::PackageName;
use sha2::{Digest, Sha256};

use super::tags::WheelName;
use crate::compression::bounded::{Bound, Bounded, TooLarge, read_to_end_bounded};

/// The most a wheel's own metadata file (`WHEEL`, `RECORD`, `entry_points.txt`) may hold.
const METADATA_LIMIT: u64 = 64 << 20;

type Archive = zip::ZipArchive<fs_err::File>;
type ArchiveEntry<'a> = zip::read::ZipFile<'a, fs_err::File>;

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

    /// The spec's `purelib`. A conda prefix has one site-packages for both libraries.
    fn purelib(&self) -> &str {
        &self.site_packages
    }

    /// The spec's `platlib`: the same site-packages as `purelib`.
    fn platlib(&self) -> &str {
        &self.site_packages
    }

    /// Where the archive's root goes (1.c and 1.d): `purelib` when `WHEEL` says
    /// `Root-Is-Purelib: true`, else `platlib`.
    fn root(&self, root_is_purelib: bool) -> &str {
        if root_is_purelib {
            self.purelib()
        } else {
            self.platlib()
        }
    }
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
    let install = Install {
        wheel_file,
        prefix_dir,
        scheme,
    };
    let (name, mut archive) = open_wheel(wheel_path, &install)?;
    // Every member together may unpack to the ratio bound of the wheel's size.
    let size = fs_err::metadata(wheel_path)
        .map_err(install.io(wheel_path))?
        .len();
    let budget = Bound::ratio(size, format!("wheel `{wheel_file}`"));
    let dist_info = find_dist_info(&archive, &name.name, &install)?;
    let wheel = read_wheel_file(&mut archive, &dist_info, &install)?;
    let record = read_record(&mut archive, &dist_info, &install)?;
    let Unpacked {
        mut installed,
        mtime,
    } = unpack_archive(
        &mut archive,
        &wheel,
        &dist_info,
        &record,
        owned,
        &install,
        &budget,
    )?;
    write_entry_points(&mut archive, &dist_info, owned, &mut installed, &install)?;
    write_installer_metadata(&dist_info, requested, &mut installed, &install)?;
    let record_path = write_record(&dist_info, &installed, &install)?;
    let files = register_files(installed, record_path, &dist_info.dist_name, owned);
    Ok(StagedWheel {
        name: name.name,
        version: name.version,
        dist_name: dist_info.dist_name,
        files,
        mtime,
    })
}

/// The wheel being installed and where it goes: what every step needs, and what its errors
/// name.
struct Install<'a> {
    wheel_file: &'a str,
    prefix_dir: &'a Path,
    scheme: &'a Scheme,
}

impl Install<'_> {
    /// The wheel is refused, for `reason`.
    fn invalid(&self, reason: String) -> WheelInstallError {
        WheelInstallError::Invalid {
            wheel: self.wheel_file.to_string(),
            reason,
        }
    }

    /// An I/O error at `path` (the wheel itself, or a prefix-relative path).
    fn io(&self, path: &Path) -> impl FnOnce(std::io::Error) -> WheelInstallError + use<> {
        let path = path.to_path_buf();
        let wheel = self.wheel_file.to_string();
        move |source| WheelInstallError::Io {
            wheel,
            path,
            source,
        }
    }

    fn conflict(&self, path: String, owner: &str) -> WheelInstallError {
        WheelInstallError::Conflict {
            wheel: self.wheel_file.to_string(),
            path,
            owner: owner.to_string(),
        }
    }
}

/// Opens the archive, once its file name has been read as a wheel name.
fn open_wheel(
    wheel_path: &Path,
    install: &Install,
) -> Result<(WheelName, Archive), WheelInstallError> {
    let name = WheelName::parse(install.wheel_file)
        .ok_or_else(|| install.invalid("its file name is not a wheel name".to_string()))?;
    let file = fs_err::File::open(wheel_path).map_err(install.io(wheel_path))?;
    let archive = zip::ZipArchive::new(file)
        .map_err(|e| install.invalid(format!("it is not a zip file: {e}")))?;
    Ok((name, archive))
}

/// The wheel's `NAME-VER.dist-info` directory.
struct DistInfo {
    /// `NAME-VER.dist-info`, as the archive spells it.
    dir: String,
    /// `NAME-VER`, which also names the `.data` directory.
    dist_name: String,
}

impl DistInfo {
    /// The archive member `NAME-VER.dist-info/<file>`.
    fn member(&self, file: &str) -> String {
        format!("{}/{file}", self.dir)
    }

    /// `NAME-VER.data`, the top directory of the files that go elsewhere than the root.
    fn data_dir(&self) -> String {
        format!("{}.data", self.dist_name)
    }

    /// Where the directory is installed, relative to the prefix: site-packages.
    fn installed_dir(&self, scheme: &Scheme) -> String {
        format!("{}/{}", scheme.site_packages, self.dir)
    }
}

/// The one top-level `*.dist-info` directory whose name matches the wheel.
fn find_dist_info(
    archive: &Archive,
    name: &PackageName,
    install: &Install,
) -> Result<DistInfo, WheelInstallError> {
    let names = member_names(archive);
    let dir = names
        .iter()
        .filter_map(|n| n.split('/').next())
        .filter(|top| top.ends_with(".dist-info"))
        .find(|top| {
            top.strip_suffix(".dist-info")
                .and_then(|stem| stem.rsplit_once('-'))
                .and_then(|(n, _)| PackageName::new(n.to_string()).ok())
                .is_some_and(|n| n == *name)
        })
        .map(str::to_string)
        .ok_or_else(|| {
            install.invalid("it has no `.dist-info` directory for its own name".to_string())
        })?;
    let dist_name = dir
        .strip_suffix(".dist-info")
        .expect("filtered on the suffix")
        .to_string();
    Ok(DistInfo { dir, dist_name })
}

/// A metadata file of the archive, or `None` when the wheel has none.
fn read_metadata_file(
    archive: &mut Archive,
    member: &str,
    install: &Install,
) -> Result<Option<Vec<u8>>, WheelInstallError> {
    match archive.by_name(member) {
        Ok(entry) => {
            // Metadata files are small; a huge one is a zip bomb, not metadata.
            let bound = Bound::new(
                METADATA_LIMIT,
                format!("`{member}`"),
                "the most a metadata file may hold",
            );
            let bytes =
                read_to_end_bounded(entry, bound).map_err(|e| match TooLarge::in_io(&e) {
                    Some(too_large) => install.invalid(too_large.to_string()),
                    None => install.invalid(format!("`{member}` cannot be read: {e}")),
                })?;
            Ok(Some(bytes))
        }
        Err(zip::result::ZipError::FileNotFound) => Ok(None),
        Err(e) => Err(install.invalid(format!("`{member}` cannot be read: {e}"))),
    }
}

/// What `WHEEL` says that the install depends on.
struct WheelFile {
    root_is_purelib: bool,
}

/// Reads `WHEEL` (1.a) and refuses a `Wheel-Version` whose major version is not 1, the only
/// one there is (1.b).
fn read_wheel_file(
    archive: &mut Archive,
    dist_info: &DistInfo,
    install: &Install,
) -> Result<WheelFile, WheelInstallError> {
    let member = dist_info.member("WHEEL");
    let bytes = read_metadata_file(archive, &member, install)?
        .ok_or_else(|| install.invalid(format!("`{member}` is missing")))?;
    let text = String::from_utf8_lossy(&bytes);
    if let Some(version) = wheel_field(&text, "Wheel-Version")
        && !version.starts_with("1.")
    {
        return Err(install.invalid(format!("its Wheel-Version {version} is not 1.x")));
    }
    let root_is_purelib =
        wheel_field(&text, "Root-Is-Purelib").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    Ok(WheelFile { root_is_purelib })
}

/// The value of the first `key: value` line of `WHEEL` for `key`, any case.
fn wheel_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case(key))
            .map(|(_, v)| v.trim().to_string())
    })
}

/// `RECORD` as the wheel ships it: archive path → what it says of that file.
type Record = BTreeMap<String, RecordEntry>;

/// One `RECORD` line: where, sha256 and size.
struct RecordEntry {
    hash: Option<String>,
    size: Option<u64>,
}

/// Reads the wheel's `RECORD`, which every member is checked against as it is unpacked.
fn read_record(
    archive: &mut Archive,
    dist_info: &DistInfo,
    install: &Install,
) -> Result<Record, WheelInstallError> {
    let member = dist_info.member("RECORD");
    let bytes = read_metadata_file(archive, &member, install)?
        .ok_or_else(|| install.invalid(format!("`{member}` is missing")))?;
    Ok(parse_record(&String::from_utf8_lossy(&bytes)))
}

fn parse_record(text: &str) -> Record {
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

/// What the install has written: prefix-relative path → the file as installed.
type Installed = BTreeMap<String, InstalledFile>;

/// A file as installed, for the new `RECORD`: its hash (urlsafe base64 sha256) and size.
struct InstalledFile {
    hash: String,
    size: u64,
}

impl InstalledFile {
    fn of(bytes: &[u8]) -> InstalledFile {
        InstalledFile {
            hash: urlsafe_sha256(bytes),
            size: bytes.len() as u64,
        }
    }
}

/// What [`unpack_archive`] wrote, and the newest entry time among the members it read.
struct Unpacked {
    installed: Installed,
    mtime: u64,
}

/// Unpacks every member to its place (1.c and 1.d for the root, 2.b for `NAME-VER.data/`),
/// each checked against `RECORD` before it is moved there, with the shebangs of scripts
/// rewritten as they are copied (2.c).
fn unpack_archive(
    archive: &mut Archive,
    wheel: &WheelFile,
    dist_info: &DistInfo,
    record: &Record,
    owned: &BTreeMap<String, String>,
    install: &Install,
    budget: &Bound,
) -> Result<Unpacked, WheelInstallError> {
    let record_name = dist_info.member("RECORD");
    let mut installed = Installed::new();
    let mut newest_mtime = 0u64;
    let mut unpacked = 0u64;
    for index in 0..archive.len() {
        let mut entry = archive
            .by_index(index)
            .map_err(|e| install.invalid(format!("entry {index} cannot be read: {e}")))?;
        let Some(member) = check_member(&entry, index, &record_name, install)? else {
            continue;
        };
        if let Some(time) = entry_time(&entry) {
            newest_mtime = newest_mtime.max(time);
        }
        let recorded = recorded(record, &member.name, install)?;
        let destination = destination(&member, wheel, dist_info, install)?;
        // Every path written so far is in `installed`, so a second member for one path
        // (`a.py` at the root and in `.data/purelib`) is found here.
        if installed.contains_key(&destination.text) {
            return Err(install.invalid(format!("`{}` is in the wheel twice", destination.text)));
        }
        let bound = Bound::new(
            budget.max.saturating_sub(unpacked),
            format!("`{}` in wheel `{}`", member.name, install.wheel_file),
            format!(
                "what is left of the {} bytes all members together may hold: {}",
                budget.max, budget.rule
            ),
        );
        let mut entry = Bounded::new(&mut entry, bound);
        let (temp, copied) = copy_verified(&mut entry, &member, &destination, &recorded, install)?;
        unpacked += copied.original_size;
        drop(entry);
        let mode = if member.executable || destination.script {
            0o755
        } else {
            0o644
        };
        place(
            temp,
            &destination,
            mode,
            &copied.installed_hash,
            owned,
            install,
        )?;
        installed.insert(
            destination.text,
            InstalledFile {
                hash: copied.installed_hash,
                size: copied.installed_size,
            },
        );
    }
    Ok(Unpacked {
        installed,
        mtime: newest_mtime,
    })
}

/// A file member of the archive, at a path inside the wheel.
struct WheelMember {
    name: String,
    relative: PathBuf,
    executable: bool,
}

/// Refuses a symbolic link or a path that leaves the wheel. `None` for the members that are
/// not unpacked: directories, `RECORD` (rewritten at the end) and its signatures, which sign
/// the `RECORD` replaced.
fn check_member(
    entry: &ArchiveEntry,
    index: usize,
    record_name: &str,
    install: &Install,
) -> Result<Option<WheelMember>, WheelInstallError> {
    let name = entry
        .name()
        .map_err(|e| install.invalid(format!("entry {index} has no readable name: {e}")))?
        .into_owned();
    if entry.is_dir() {
        return Ok(None);
    }
    if entry.is_symlink() {
        return Err(install.invalid(format!(
            "`{name}` is a symbolic link, which wheels cannot hold"
        )));
    }
    let relative = safe_relative(&name)
        .ok_or_else(|| install.invalid(format!("`{name}` is not a path inside the wheel")))?;
    if name == record_name
        || name.ends_with(".dist-info/RECORD.jws")
        || name.ends_with(".dist-info/RECORD.p7s")
    {
        return Ok(None);
    }
    let executable = entry.unix_mode().is_some_and(|m| m & 0o111 != 0);
    Ok(Some(WheelMember {
        name,
        relative,
        executable,
    }))
}

/// An entry's modification time in seconds since the epoch. Zip times carry no zone; they
/// are read as UTC, so the result depends on the wheel's bytes only.
fn entry_time(entry: &ArchiveEntry) -> Option<u64> {
    let time = entry.last_modified()?;
    let civil = jiff::civil::DateTime::new(
        time.year() as i16,
        time.month() as i8,
        time.day() as i8,
        time.hour() as i8,
        time.minute() as i8,
        time.second() as i8,
        0,
    )
    .ok()?;
    let stamp = civil.to_zoned(jiff::tz::TimeZone::UTC).ok()?;
    Some(stamp.timestamp().as_second().max(0) as u64)
}

/// What `RECORD` says a member holds. A member it gives no sha256 for is refused: nothing is
/// installed that `RECORD` does not vouch for.
struct RecordedMember<'a> {
    hash: &'a str,
    size: Option<u64>,
}

fn recorded<'a>(
    record: &'a Record,
    member: &str,
    install: &Install,
) -> Result<RecordedMember<'a>, WheelInstallError> {
    match record.get(member) {
        Some(RecordEntry {
            hash: Some(hash),
            size,
        }) => Ok(RecordedMember { hash, size: *size }),
        _ => Err(install.invalid(format!("`{member}` has no sha256 in RECORD"))),
    }
}

/// Where a member goes, relative to the prefix.
struct Destination {
    path: PathBuf,
    /// The same path as UTF-8: the key of `installed` and `owned`.
    text: String,
    /// A file of `NAME-VER.data/scripts`: executable, with its `#!python` rewritten.
    script: bool,
}

/// The root of the archive goes to purelib or platlib (1.c and 1.d); a member under
/// `NAME-VER.data/` goes where its scheme says (2.b).
fn destination(
    member: &WheelMember,
    wheel: &WheelFile,
    dist_info: &DistInfo,
    install: &Install,
) -> Result<Destination, WheelInstallError> {
    let (path, script) = match member.relative.strip_prefix(dist_info.data_dir()) {
        Ok(rest) => data_destination(rest, member, dist_info, install)?,
        Err(_) => (
            Path::new(install.scheme.root(wheel.root_is_purelib)).join(&member.relative),
            false,
        ),
    };
    if path.components().count() == 0 {
        return Err(install.invalid(format!("`{}` names no file", member.name)));
    }
    let text = path
        .to_str()
        .ok_or_else(|| install.invalid(format!("`{}` is not UTF-8", member.name)))?
        .to_string();
    Ok(Destination { path, text, script })
}

/// Where `NAME-VER.data/<scheme>/<rest>` goes, and whether it is a script: `purelib` and
/// `platlib` to site-packages, `scripts` to `bin`, `headers` to `include/pythonX.Y/NAME`,
/// `data` to the prefix. Any other scheme is refused.
fn data_destination(
    rest: &Path,
    member: &WheelMember,
    dist_info: &DistInfo,
    install: &Install,
) -> Result<(PathBuf, bool), WheelInstallError> {
    let mut parts = rest.components();
    let scheme_name = parts
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or("")
        .to_string();
    let rest: PathBuf = parts.collect();
    let scheme = install.scheme;
    let dist_name = &dist_info.dist_name;
    Ok(match scheme_name.as_str() {
        "purelib" => (Path::new(scheme.purelib()).join(rest), false),
        "platlib" => (Path::new(scheme.platlib()).join(rest), false),
        "scripts" => (Path::new("bin").join(rest), true),
        "headers" => (
            Path::new(&scheme.include)
                .join(dist_name.split('-').next().unwrap_or(dist_name))
                .join(rest),
            false,
        ),
        "data" => (rest, false),
        other => {
            return Err(install.invalid(format!(
                "`{}` is in the unknown data scheme `{other}`",
                member.name
            )));
        }
    })
}

/// Streams a member into a temporary file beside its destination (a 1 GB library is never
/// in memory), hashed as it comes, and checks it against RECORD; a file larger than RECORD
/// says is refused as soon as it is. A script's `#!python` becomes the in-image Python
/// (2.c).
fn copy_verified(
    entry: &mut impl Read,
    member: &WheelMember,
    destination: &Destination,
    recorded: &RecordedMember,
    install: &Install,
) -> Result<(tempfile::NamedTempFile, Copied), WheelInstallError> {
    let target = install.prefix_dir.join(&destination.path);
    let parent = target.parent().expect("a file under the prefix");
    fs_err::create_dir_all(parent).map_err(install.io(&destination.path))?;
    let mut temp =
        tempfile::NamedTempFile::new_in(parent).map_err(install.io(&destination.path))?;
    let name = &member.name;
    let copied = copy_checked(
        entry,
        temp.as_file_mut(),
        recorded.size,
        (destination.script).then_some(install.scheme.python.as_str()),
    )
    .map_err(|e| match e {
        CopyError::Read(e) => match TooLarge::in_io(&e) {
            Some(too_large) => install.invalid(too_large.to_string()),
            None => install.invalid(format!("`{name}` cannot be read: {e}")),
        },
        CopyError::TooLarge => {
            install.invalid(format!("`{name}` is larger than its RECORD entry says"))
        }
        CopyError::Write(e) => install.io(&destination.path)(e),
    })?;
    if copied.original_hash != recorded.hash
        || recorded.size.is_some_and(|s| s != copied.original_size)
    {
        return Err(install.invalid(format!(
            "`{name}` does not match its RECORD entry (sha256 or size)"
        )));
    }
    Ok((temp, copied))
}

/// Moves a verified file into place with `mode`, unless another package installed that path.
fn place(
    temp: tempfile::NamedTempFile,
    destination: &Destination,
    mode: u32,
    installed_hash: &str,
    owned: &BTreeMap<String, String>,
    install: &Install,
) -> Result<(), WheelInstallError> {
    let target = install.prefix_dir.join(&destination.path);
    if let Some(owner) = owned.get(&destination.text) {
        // Namespace packages: NVIDIA's wheels all ship the same empty
        // `nvidia/__init__.py`. The same bytes are the same file (and stay in each
        // wheel's layer, so every layer stands alone); different bytes would make the
        // environment depend on install order.
        let existing = hash_file(&target).map_err(install.io(&destination.path))?;
        if existing != installed_hash {
            return Err(install.conflict(destination.text.clone(), owner));
        }
    } else {
        use std::os::unix::fs::PermissionsExt;
        temp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(install.io(&destination.path))?;
        temp.persist(&target)
            .map_err(|e| install.io(&destination.path)(e.error))?;
    }
    Ok(())
}

/// Console and GUI entry points become scripts in `bin` with the in-image Python's shebang.
/// A name that is not a plain file name, or a script another package installed, is refused.
fn write_entry_points(
    archive: &mut Archive,
    dist_info: &DistInfo,
    owned: &BTreeMap<String, String>,
    installed: &mut Installed,
    install: &Install,
) -> Result<(), WheelInstallError> {
    let member = dist_info.member("entry_points.txt");
    let Some(text) = read_metadata_file(archive, &member, install)? else {
        return Ok(());
    };
    for (script_name, module, function) in entry_points(&String::from_utf8_lossy(&text)) {
        if safe_relative(&script_name).is_none_or(|p| p.components().count() != 1) {
            return Err(install.invalid(format!("entry point `{script_name}` is not a file name")));
        }
        let destination = format!("bin/{script_name}");
        if let Some(owner) = owned.get(&destination) {
            return Err(install.conflict(destination, owner));
        }
        let bytes = entry_point_script(&install.scheme.python, &module, &function).into_bytes();
        write_file(&install.prefix_dir.join(&destination), &bytes, 0o755)
            .map_err(install.io(Path::new(&destination)))?;
        installed.insert(destination, InstalledFile::of(&bytes));
    }
    Ok(())
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

/// `INSTALLER` says `imgbuild`; `REQUESTED` marks a wheel the recipe asked for, not one
/// pulled in by another.
fn write_installer_metadata(
    dist_info: &DistInfo,
    requested: bool,
    installed: &mut Installed,
    install: &Install,
) -> Result<(), WheelInstallError> {
    let dir = dist_info.installed_dir(install.scheme);
    let mut files = vec![(format!("{dir}/INSTALLER"), b"imgbuild\n".to_vec())];
    if requested {
        files.push((format!("{dir}/REQUESTED"), Vec::new()));
    }
    for (path, bytes) in files {
        write_file(&install.prefix_dir.join(&path), &bytes, 0o644)
            .map_err(install.io(Path::new(&path)))?;
        installed.insert(path, InstalledFile::of(&bytes));
    }
    Ok(())
}

/// Rewrites `RECORD` to list what was installed, with each file's hash as installed (a
/// rewritten shebang differs from the wheel's). Returns its prefix-relative path.
fn write_record(
    dist_info: &DistInfo,
    installed: &Installed,
    install: &Install,
) -> Result<String, WheelInstallError> {
    let record_path = format!("{}/RECORD", dist_info.installed_dir(install.scheme));
    let text = record_text(installed, &install.scheme.site_packages, &dist_info.dir);
    write_file(
        &install.prefix_dir.join(&record_path),
        text.as_bytes(),
        0o644,
    )
    .map_err(install.io(Path::new(&record_path)))?;
    Ok(record_path)
}

/// `RECORD`'s lines: paths relative to site-packages, where files elsewhere get `../`
/// paths, and last `RECORD` itself, with no hash.
fn record_text(installed: &Installed, site_packages: &str, dist_info_dir: &str) -> String {
    let depth = site_packages.split('/').count();
    let mut text = String::new();
    for (path, file) in installed {
        let relative = match path.strip_prefix(&format!("{site_packages}/")) {
            Some(inside) => inside.to_string(),
            None => format!("{}{path}", "../".repeat(depth)),
        };
        text.push_str(&csv_field(&relative));
        text.push_str(&format!(",sha256={},{}\n", file.hash, file.size));
    }
    text.push_str(&csv_field(&format!("{dist_info_dir}/RECORD")));
    text.push_str(",,\n");
    text
}

/// Every path the wheel installed, `RECORD` included, sorted. Each is added to `owned` for
/// the wheel, unless another package owns it already (an identical shared file).
fn register_files(
    installed: Installed,
    record_path: String,
    dist_name: &str,
    owned: &mut BTreeMap<String, String>,
) -> Vec<String> {
    let mut files: Vec<String> = installed.into_keys().collect();
    files.push(record_path);
    files.sort();
    let label = format!("pypi {dist_name}");
    for file in &files {
        owned.entry(file.clone()).or_insert_with(|| label.clone());
    }
    files
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
        let mut zip = zip::ZipWriter::new(fs_err::File::create(&path).unwrap());
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
    fn data_schemes_go_to_their_directories_and_an_unknown_one_or_a_path_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = wheel(
            dir.path(),
            &[
                ("demo-1.0.data/purelib/demo/pure.py", b"p\n"),
                ("demo-1.0.data/platlib/demo/plat.py", b"q\n"),
                ("demo-1.0.data/headers/demo.h", b"h\n"),
            ],
            &[],
        );
        let staged = install(dir.path(), &path, &mut BTreeMap::new()).unwrap();
        let site = "lib/python3.9/site-packages";
        for file in [
            format!("{site}/demo/pure.py"),
            format!("{site}/demo/plat.py"),
            "include/python3.9/demo/demo.h".to_string(),
        ] {
            assert!(staged.files.contains(&file), "{file}: {:?}", staged.files);
            assert!(dir.path().join("prefix").join(&file).is_file(), "{file}");
        }

        let dir = tempfile::tempdir().unwrap();
        let path = wheel(dir.path(), &[("demo-1.0.data/etc/x.conf", b"")], &[]);
        let err = install(dir.path(), &path, &mut BTreeMap::new()).unwrap_err();
        assert!(
            err.to_string()
                .contains("`demo-1.0.data/etc/x.conf` is in the unknown data scheme `etc`"),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        let path = wheel(
            dir.path(),
            &[
                ("demo/a.py", b"1\n"),
                ("demo-1.0.data/purelib/demo/a.py", b"2\n"),
            ],
            &[],
        );
        let err = install(dir.path(), &path, &mut BTreeMap::new()).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("`{site}/demo/a.py` is in the wheel twice")),
            "{err}"
        );
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
