//! Issue 30, part 3: forward compatibility that switches itself off. A `compat = true` image
//! no longer puts its `cuda-compat` libraries first on `LD_LIBRARY_PATH` (error 803 on every
//! driver of the same or a newer branch); it links them to `/usr/local/cuda/compat`, where
//! NVIDIA's container toolkit finds them, and the toolkit's rule decides at container start.
//! `imgbuild smoke` decides the same way; here with stand-in host drivers on both branches,
//! since CI has no driver (the H200 runs are in docs/evidence/issue30/).

use std::path::Path;

use imgbuild::smoke::extract::{extract_cuda_libraries, open_image};
use imgbuild_smoke::{compat::DriverVersion, forward_compat};

use crate::{
    common::{LayoutView, Project, env_of, unpack},
    support::{
        channel::{Entry, index_channel, linux64_index, write_package},
        shared_channel,
    },
};

/// The stand-in compat library's version: CUDA 11.8's GA driver, as NVIDIA's
/// `cuda-compat-11-8` package holds it.
const COMPAT_VERSION: &str = "520.61.05";

/// A channel holding only `cuda-compat` 11.8: a stand-in `libcuda.so.520.61.05` (bytes, not
/// NVIDIA's library, which is not redistributable from PyPI) and its soname link, where
/// conda-forge's package puts them.
fn compat_channel(dir: &Path) {
    let file = format!("cuda-compat/libcuda.so.{COMPAT_VERSION}");
    let entries = [
        Entry::File {
            path: file.clone(),
            bytes: b"\x7fELF stand-in compat libcuda".to_vec(),
            executable: false,
            file_mode: None,
        },
        Entry::Symlink {
            path: "cuda-compat/libcuda.so.1".into(),
            target: format!("libcuda.so.{COMPAT_VERSION}"),
        },
    ];
    fs_err::create_dir_all(dir.join("linux-64")).unwrap();
    fs_err::create_dir_all(dir.join("noarch")).unwrap();
    write_package(
        &dir.join("linux-64/cuda-compat-11.8.0-h0_0.conda"),
        linux64_index("cuda-compat", "11.8.0", &[]),
        &entries,
        None,
    )
    .unwrap();
    index_channel(dir).unwrap();
}

fn recipe(compat_channel: &Path) -> String {
    let url = |p: &Path| url::Url::from_file_path(p).unwrap().to_string();
    format!(
        r#"[image]
name = "compat"
base = "scratch"
platforms = ["linux-64"]

[cuda]
version = "11.8"
compat = true

[conda]
channels = ["{}", "{}"]
dependencies = ["cuda-cudart"]
"#,
        url(shared_channel()),
        url(compat_channel)
    )
}

#[test]
fn compat_libraries_are_linked_for_the_toolkit_and_decided_by_the_host_driver() {
    let project = Project::new();
    let channel = tempfile::tempdir().unwrap();
    compat_channel(channel.path());
    project.write_recipe(&recipe(channel.path()));
    project.build(&[]).success();
    let layout_dir = project.path().join("images/compat");

    // Nothing puts the compat libraries first unconditionally.
    let config = LayoutView::new(&layout_dir).config();
    let env = env_of(&config);
    assert!(
        env.contains(&"LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64"),
        "{env:?}"
    );
    assert!(!env.iter().any(|kv| kv.contains("cuda-compat")), "{env:?}");

    // umoci unpacks the link where the toolkit looks, naming the environment's libraries.
    let bundle = tempfile::tempdir().unwrap();
    let rootfs = unpack(&layout_dir, "latest", &bundle.path().join("b"));
    let link = fs_err::read_link(rootfs.join("usr/local/cuda/compat")).unwrap();
    assert_eq!(link, Path::new("/opt/conda/cuda-compat"));
    let in_root = rootfs.join(link.strip_prefix("/").unwrap());
    assert_eq!(
        forward_compat::find_in(&in_root).map(|v| v.to_string()),
        Some(COMPAT_VERSION.to_string())
    );

    // The smoke test finds the same library in the layers, and decides with the toolkit's
    // rule: first on a driver of an older branch, never on one of its own or a newer one.
    let image = open_image(&layout_dir, "latest").unwrap();
    let cuda = extract_cuda_libraries(&image).unwrap();
    let dir = cuda
        .libraries
        .compat_dir
        .as_deref()
        .expect("compat libraries");
    let compat = forward_compat::find_in(dir).expect("one compat libcuda");
    assert!(
        dir.join("libcuda.so.1").exists(),
        "the soname link resolves"
    );
    let host = |v: &str| v.parse::<DriverVersion>().unwrap();
    let older = forward_compat::ForwardCompat::decide(&host("470.82.01"), &compat);
    assert!(older.used, "{older:?}");
    for newer in ["520.61.05", "525.60.13", "580.159.04"] {
        let decision = forward_compat::ForwardCompat::decide(&host(newer), &compat);
        assert!(!decision.used, "{decision:?}");
    }
    // The CUDA libraries the run loads are not the compat ones.
    assert!(cuda.libraries.cudart.is_some());
    assert!(!cuda.libraries.cudart.as_deref().unwrap().starts_with(dir));
}
