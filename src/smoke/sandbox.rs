//! Runs a program of an unpacked image ([`super::unpack`]) in that image's root, with the
//! host's NVIDIA driver made visible the way the NVIDIA container toolkit does it: the
//! driver's compute libraries bind-mounted (read-only) into the image, and `/dev/nvidia*`
//! bound into its `/dev`. It never runs as root inside.
//!
//! How, in a child process (this executable run again with [`SANDBOX_ARG`], so the setup is
//! single-threaded, as `unshare(CLONE_NEWUSER)` requires):
//! - as root: a private mount namespace, `chroot` into the root, then the image's numeric
//!   user, or `65534:65534` (nobody) when the image runs as root or names a user;
//! - as another user: a user namespace that maps only that user to itself, so the program
//!   runs as that user with no capability left after `exec`.
//!
//! Mount points are made beneath the root by `cap-std` and mounted through their open
//! descriptors (`/proc/self/fd/N`), so a link in the image cannot turn a mount onto the
//! host. The root is mounted `nosuid`; `/dev` and `/tmp` are fresh tmpfs, `/proc` and
//! `/sys` the host's. The driver's libraries go to `/usr/local/nvidia/lib64`, which is
//! appended to `LD_LIBRARY_PATH` (the directory NVIDIA's CUDA images name there): the
//! image's own libraries, `cuda-compat` included, keep precedence, as with the toolkit.

use std::{
    ffi::{CString, OsString},
    os::unix::{ffi::OsStrExt, fs::PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use cap_std::fs::{Dir, OpenOptions};

/// The first argument of the sandbox child.
pub const SANDBOX_ARG: &str = "__imgbuild-sandbox";
/// Where the driver's libraries are seen in the image.
pub const DRIVER_DIR: &str = "usr/local/nvidia/lib64";
/// The user a root image runs as.
const NOBODY: u32 = 65534;

/// The driver's compute libraries, as the NVIDIA container toolkit's `compute` capability
/// lists them (`libnvidia-gpucomp` is needed by `libcuda` from R570 on).
const DRIVER_LIBRARIES: &[&str] = &[
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-cfg.so",
    "libnvidia-allocator.so",
    "libnvidia-opencl.so",
];

/// Where a driver's libraries are looked for, after `LD_LIBRARY_PATH`.
const DRIVER_SEARCH: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
];

/// What the child sets up before it runs the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub root: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// (host file, name in [`DRIVER_DIR`]).
    pub libraries: Vec<(PathBuf, OsString)>,
    /// Host device nodes, bound at the same path beneath the root.
    pub devices: Vec<PathBuf>,
    /// The whole environment of the program, `KEY=VALUE`.
    pub env: Vec<String>,
}

impl Sandbox {
    /// A sandbox for `root`, an image whose config has `user` and `env`, with this host's
    /// driver and devices.
    pub fn for_image(
        root: &Path,
        user: Option<&str>,
        image_env: &[String],
        compat_first: bool,
    ) -> Self {
        // SAFETY: geteuid has no preconditions.
        let root_user = unsafe { libc::geteuid() } == 0;
        let (uid, gid) = if root_user {
            image_user(user)
        } else {
            // SAFETY: as above.
            unsafe { (libc::getuid(), libc::getgid()) }
        };
        Sandbox {
            root: root.to_path_buf(),
            uid,
            gid,
            libraries: driver_libraries(),
            devices: nvidia_devices(),
            env: environment(image_env, compat_first),
        }
    }

    /// The command that runs `program` (an in-image path) with `args` in the sandbox.
    pub fn command(&self, exe: &Path, program: &str, args: &[String]) -> Command {
        let mut command = Command::new(exe);
        command
            .arg(SANDBOX_ARG)
            .arg(&self.root)
            .arg(format!("{}:{}", self.uid, self.gid));
        for (host, name) in &self.libraries {
            let mut arg = OsString::from("--lib=");
            arg.push(name);
            arg.push("=");
            arg.push(host);
            command.arg(arg);
        }
        for device in &self.devices {
            let mut arg = OsString::from("--dev=");
            arg.push(device);
            command.arg(arg);
        }
        for kv in &self.env {
            command.arg(format!("--env={kv}"));
        }
        command.arg("--").arg(program).args(args);
        command.env_clear();
        command
    }
}

/// The image's user when it is a number other than 0, else nobody: names would need the
/// image's accounts, and the check must not run as root.
fn image_user(user: Option<&str>) -> (u32, u32) {
    let user = user.unwrap_or("");
    let (u, g) = user.split_once(':').unwrap_or((user, user));
    match (u.parse::<u32>(), g.parse::<u32>()) {
        (Ok(uid), Ok(gid)) if uid != 0 && gid != 0 => (uid, gid),
        (Ok(uid), _) if uid != 0 => (uid, NOBODY),
        _ => (NOBODY, NOBODY),
    }
}

/// The image's environment with [`DRIVER_DIR`] last on `LD_LIBRARY_PATH` and `HOME=/tmp`
/// (the user may have no home in the image); with `compat_first`, NVIDIA's compat directory
/// first, where the toolkit's `00-compat` ld.so.conf.d entry puts it.
fn environment(image_env: &[String], compat_first: bool) -> Vec<String> {
    let driver = format!("/{DRIVER_DIR}");
    let compat = compat_first.then_some(imgbuild_smoke::forward_compat::COMPAT_DIR);
    let mut env: Vec<String> = image_env
        .iter()
        .filter(|kv| !kv.starts_with("HOME=") && !kv.starts_with("LD_LIBRARY_PATH="))
        .cloned()
        .collect();
    let library_path = image_env
        .iter()
        .find_map(|kv| kv.strip_prefix("LD_LIBRARY_PATH="))
        .filter(|p| !p.is_empty())
        .map_or(driver.clone(), |p| format!("{p}:{driver}"));
    let library_path = compat.map_or(library_path.clone(), |c| format!("{c}:{library_path}"));
    env.push(format!("LD_LIBRARY_PATH={library_path}"));
    env.push("HOME=/tmp".into());
    env
}

/// The driver's compute libraries of this host: each `lib*.so*` of [`DRIVER_LIBRARIES`]
/// in the first directory that holds `libcuda.so.1`, resolved to the file it names.
fn driver_libraries() -> Vec<(PathBuf, OsString)> {
    let from_env = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let dirs = from_env
        .split(':')
        .filter(|d| d.starts_with('/'))
        .chain(DRIVER_SEARCH.iter().copied());
    let Some(dir) = dirs
        .map(PathBuf::from)
        .find(|d| d.join("libcuda.so.1").exists())
    else {
        return Vec::new();
    };
    let Ok(entries) = fs_err::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, OsString)> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            DRIVER_LIBRARIES.iter().any(|l| name.starts_with(l))
        })
        .filter_map(|e| {
            let real = fs_err::canonicalize(e.path()).ok()?;
            real.is_file().then(|| (real, e.file_name()))
        })
        .collect();
    found.sort();
    found
}

/// `/dev/nvidia*` and `/dev/nvidia-caps/*` of this host.
fn nvidia_devices() -> Vec<PathBuf> {
    let list = |dir: &str| -> Vec<PathBuf> {
        fs_err::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| !p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut devices: Vec<PathBuf> = list("/dev")
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.as_bytes().starts_with(b"nvidia"))
        })
        .chain(list("/dev/nvidia-caps"))
        .collect();
    devices.sort();
    devices
}

/// The child: sets the sandbox up from `args` (after [`SANDBOX_ARG`]) and executes the
/// program; returns only on failure, having said why on stderr.
#[allow(clippy::print_stderr)]
pub fn sandbox_main(args: impl Iterator<Item = OsString>) -> ExitCode {
    match parse(args).and_then(|(sandbox, argv)| enter(&sandbox).map(|()| (sandbox, argv))) {
        Ok((sandbox, argv)) => {
            let err = exec(&argv, &sandbox.env);
            eprintln!("imgbuild sandbox: cannot run `{}`: {err}", argv[0]);
            ExitCode::from(127)
        }
        Err(err) => {
            eprintln!("imgbuild sandbox: {err}");
            ExitCode::from(126)
        }
    }
}

fn parse(mut args: impl Iterator<Item = OsString>) -> std::io::Result<(Sandbox, Vec<String>)> {
    let bad = |what: &str| std::io::Error::other(format!("bad sandbox arguments: {what}"));
    let root = PathBuf::from(args.next().ok_or_else(|| bad("no root"))?);
    let ids = args.next().ok_or_else(|| bad("no user"))?;
    let (uid, gid) = ids
        .to_str()
        .and_then(|s| s.split_once(':'))
        .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
        .ok_or_else(|| bad("user"))?;
    let mut sandbox = Sandbox {
        root,
        uid,
        gid,
        libraries: Vec::new(),
        devices: Vec::new(),
        env: Vec::new(),
    };
    for arg in args.by_ref() {
        let bytes = arg.as_bytes();
        if bytes == b"--" {
            break;
        } else if let Some(rest) = bytes.strip_prefix(b"--lib=") {
            let at = rest
                .iter()
                .position(|&b| b == b'=')
                .ok_or_else(|| bad("lib"))?;
            let name = OsString::from(std::ffi::OsStr::from_bytes(&rest[..at]));
            let host = PathBuf::from(std::ffi::OsStr::from_bytes(&rest[at + 1..]));
            sandbox.libraries.push((host, name));
        } else if let Some(rest) = bytes.strip_prefix(b"--dev=") {
            sandbox
                .devices
                .push(PathBuf::from(std::ffi::OsStr::from_bytes(rest)));
        } else if let Some(rest) = arg.to_str().and_then(|s| s.strip_prefix("--env=")) {
            sandbox.env.push(rest.to_string());
        } else {
            return Err(bad("unknown option"));
        }
    }
    let argv: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    if argv.is_empty() {
        return Err(bad("no program"));
    }
    Ok((sandbox, argv))
}

fn check(ret: libc::c_int, what: &str) -> std::io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        let err = std::io::Error::last_os_error();
        Err(std::io::Error::new(err.kind(), format!("{what}: {err}")))
    }
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)
}

/// Namespaces, mounts, chroot and user: everything before `exec`.
fn enter(sandbox: &Sandbox) -> std::io::Result<()> {
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    if as_root {
        // SAFETY: unshare with a flag constant; this process is single-threaded here.
        check(unsafe { libc::unshare(libc::CLONE_NEWNS) }, "unshare")?;
    } else {
        user_namespace(sandbox.uid, sandbox.gid)?;
    }
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE)?;
    mount(
        Some(&sandbox.root),
        &sandbox.root,
        None,
        libc::MS_BIND | libc::MS_REC,
    )?;
    mount(
        None,
        &sandbox.root,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID,
    )?;
    let dir = Dir::open_ambient_dir(&sandbox.root, cap_std::ambient_authority())?;
    mount_tmpfs(&dir, "dev", "mode=755")?;
    mount_tmpfs(&dir, "tmp", "mode=1777")?;
    bind_dir(&dir, "proc", Path::new("/proc"))?;
    bind_dir(&dir, "sys", Path::new("/sys"))?;
    let dev = dir.open_dir("dev")?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(name);
        if host.exists() {
            bind_file(&dev, Path::new(name), &host)?;
        }
    }
    dev.create_dir_all("shm")?;
    for device in &sandbox.devices {
        let rel = device.strip_prefix("/dev").unwrap_or(device);
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            dev.create_dir_all(parent)?;
        }
        bind_file(&dev, rel, device)?;
    }
    if !sandbox.libraries.is_empty() {
        dir.create_dir_all(DRIVER_DIR)?;
        mount_tmpfs(&dir, DRIVER_DIR, "mode=755")?;
        let libs = dir.open_dir(DRIVER_DIR)?;
        for (host, name) in &sandbox.libraries {
            bind_file(&libs, Path::new(name), host)?;
        }
    }
    drop(dir);
    // SAFETY: `root` is a NUL-terminated path; chdir("/") follows inside the new root.
    check(
        unsafe { libc::chroot(c_path(&sandbox.root)?.as_ptr()) },
        "chroot",
    )?;
    check(unsafe { libc::chdir(c"/".as_ptr()) }, "chdir")?;
    if as_root {
        // SAFETY: plain id calls; the group list is emptied before the ids change.
        check(unsafe { libc::setgroups(0, std::ptr::null()) }, "setgroups")?;
        check(unsafe { libc::setgid(sandbox.gid) }, "setgid")?;
        check(unsafe { libc::setuid(sandbox.uid) }, "setuid")?;
    }
    Ok(())
}

/// A user namespace in which only this user (and group) exists, as itself.
fn user_namespace(uid: u32, gid: u32) -> std::io::Result<()> {
    // SAFETY: as in `enter`.
    check(
        unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) },
        "unshare (user namespaces may be off here)",
    )?;
    fs_err::write("/proc/self/setgroups", "deny")?;
    fs_err::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    fs_err::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    Ok(())
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
) -> std::io::Result<()> {
    mount_data(source, target, fstype, flags, None)
}

fn mount_data(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> std::io::Result<()> {
    let source = source.map(c_path).transpose()?;
    let target_c = c_path(target)?;
    let fstype = fstype
        .map(CString::new)
        .transpose()
        .map_err(std::io::Error::other)?;
    let data = data
        .map(CString::new)
        .transpose()
        .map_err(std::io::Error::other)?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            ptr(&source),
            target_c.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    check(ret, &format!("mount on `{}`", target.display()))
}

/// The `/proc/self/fd` path of `file`: a mount there lands on the opened file itself.
fn fd_path(file: &impl std::os::fd::AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

fn mount_tmpfs(dir: &Dir, rel: &str, options: &str) -> std::io::Result<()> {
    dir.create_dir_all(rel)?;
    let target = dir.open_dir(rel)?;
    mount_data(
        Some(Path::new("tmpfs")),
        &fd_path(&target),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(options),
    )
}

fn bind_dir(dir: &Dir, rel: &str, host: &Path) -> std::io::Result<()> {
    dir.create_dir_all(rel)?;
    let target = dir.open_dir(rel)?;
    mount(
        Some(host),
        &fd_path(&target),
        None,
        libc::MS_BIND | libc::MS_REC,
    )
}

/// Binds the host file `host` onto a new empty file `rel` beneath `dir`.
fn bind_file(dir: &Dir, rel: &Path, host: &Path) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create(true);
    let target = dir.open_with(rel, &options)?;
    target.set_permissions(cap_std::fs::Permissions::from_std(
        std::fs::Permissions::from_mode(0o644),
    ))?;
    mount(Some(host), &fd_path(&target), None, libc::MS_BIND)?;
    Ok(())
}

/// `execve(argv[0], argv, env)`; returns only its error.
fn exec(argv: &[String], env: &[String]) -> std::io::Error {
    let to_c = |s: &String| CString::new(s.as_bytes()).map_err(std::io::Error::other);
    let (argv, env) = match (
        argv.iter().map(to_c).collect::<Result<Vec<_>, _>>(),
        env.iter().map(to_c).collect::<Result<Vec<_>, _>>(),
    ) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(err), _) | (_, Err(err)) => return err,
    };
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    // SAFETY: both arrays are NULL-terminated and point into CStrings alive for the call.
    unsafe { libc::execve(argv_ptrs[0], argv_ptrs.as_ptr(), env_ptrs.as_ptr()) };
    std::io::Error::last_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_root_inside() {
        assert_eq!(image_user(None), (NOBODY, NOBODY));
        assert_eq!(image_user(Some("0:0")), (NOBODY, NOBODY));
        assert_eq!(image_user(Some("root")), (NOBODY, NOBODY));
        assert_eq!(image_user(Some("1000:1000")), (1000, 1000));
        assert_eq!(image_user(Some("1000")), (1000, 1000));
        assert_eq!(image_user(Some("1000:0")), (1000, NOBODY));
    }

    #[test]
    fn driver_directory_comes_last() {
        let env = environment(
            &[
                "PATH=/opt/conda/bin:/usr/bin".into(),
                "LD_LIBRARY_PATH=/opt/conda/lib".into(),
                "HOME=/root".into(),
            ],
            false,
        );
        assert_eq!(
            env,
            [
                "PATH=/opt/conda/bin:/usr/bin",
                "LD_LIBRARY_PATH=/opt/conda/lib:/usr/local/nvidia/lib64",
                "HOME=/tmp"
            ]
        );
    }

    #[test]
    fn compat_directory_comes_first_only_when_decided() {
        let image = ["LD_LIBRARY_PATH=/opt/conda/lib".to_string()];
        assert_eq!(
            environment(&image, true)[0],
            "LD_LIBRARY_PATH=/usr/local/cuda/compat:/opt/conda/lib:/usr/local/nvidia/lib64"
        );
        assert_eq!(
            environment(&[], true)[0],
            "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/nvidia/lib64"
        );
        assert_eq!(
            environment(&image, false)[0],
            "LD_LIBRARY_PATH=/opt/conda/lib:/usr/local/nvidia/lib64"
        );
    }

    #[test]
    fn arguments_round_trip() {
        let sandbox = Sandbox {
            root: "/tmp/r".into(),
            uid: 65534,
            gid: 65534,
            libraries: vec![("/usr/lib/libcuda.so.580.1".into(), "libcuda.so.1".into())],
            devices: vec!["/dev/nvidia0".into(), "/dev/nvidia-caps/nvidia-cap1".into()],
            env: vec!["A=b=c".into()],
        };
        let command = sandbox.command(Path::new("/x"), "/usr/bin/python3", &["-c".into()]);
        let args: Vec<OsString> = command.get_args().map(OsString::from).collect();
        assert_eq!(args[0], SANDBOX_ARG);
        let (parsed, argv) = parse(args.into_iter().skip(1)).unwrap();
        assert_eq!(parsed, sandbox);
        assert_eq!(argv, ["/usr/bin/python3", "-c"]);
    }
}
