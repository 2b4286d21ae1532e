#!/usr/bin/env python3
"""Writes an OCI layout whose one layer is the GPU host's own Python environment, for the
H200 framework evidence of `imgbuild smoke` through its local sandbox (issue 30).

A CUDA PyTorch image is gigabytes and a device call carries 64 MiB, so no image built here
can reach the GPU. The host has a real PyTorch, CuPy and JAX environment; this puts it, as
it is on disk, into an image (same absolute paths, one uncompressed layer), which
`imgbuild smoke` then unpacks into its private root and runs there, as it would an image
of its own. Only the standard library is used.

    host_env_image.py VENV OUT_LAYOUT

VENV is the environment (its interpreter's sys.base_prefix comes too); the layer also holds
/usr, /etc and the top-level links, without the CUDA toolkit under /usr/local and without
the driver's libraries (the sandbox binds the host's, as the NVIDIA toolkit does).
"""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

SKIP_PREFIXES = ("usr/local/cuda", "usr/local/nvidia", "usr/share/doc", "usr/share/man",
                 "usr/share/locale", "usr/src")
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-", "libcudadebugger")


def skipped(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return name.startswith(SKIP_PREFIXES) or base.startswith(DRIVER_LIBRARIES) \
        or "__pycache__" in name


def normalized(info: tarfile.TarInfo):
    if skipped(info.name) or not (info.isfile() or info.isdir() or info.issym() or info.islnk()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    if info.isdir():
        # The sandbox runs as a user that is not root: every directory on the way must open.
        info.mode |= 0o755
    elif info.isfile():
        info.mode |= 0o444
    return info


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def put_file(layout: Path, path: Path) -> tuple[str, int]:
    digest = sha256_file(path)
    target = layout / "blobs" / "sha256" / digest.split(":")[1]
    path.rename(target)
    return digest, target.stat().st_size


def put_bytes(layout: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest.split(":")[1]).write_bytes(data)
    return digest, len(data)


def main() -> None:
    venv, out = Path(sys.argv[1]), Path(sys.argv[2])
    python = venv / "bin" / "python3"
    base = subprocess.run([str(python), "-c", "import sys; print(sys.base_prefix)"],
                          check=True, capture_output=True, text=True).stdout.strip()
    versions = subprocess.run(
        [str(python), "-c",
         "import importlib.metadata as m\n"
         "for n in ('torch', 'cupy-cuda13x', 'cupy-cuda12x', 'jax'):\n"
         "    try: print(f'pypi:{n}-{m.version(n)}')\n"
         "    except m.PackageNotFoundError: pass"],
        check=True, capture_output=True, text=True).stdout.split()
    (out / "blobs" / "sha256").mkdir(parents=True)
    layer = out / "layer.tar"
    roots = ["usr", "etc", venv.as_posix().lstrip("/"), base.lstrip("/")]
    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
        for top in ["bin", "sbin", "lib", "lib64"]:
            if os.path.islink("/" + top):
                tar.add("/" + top, arcname=top, filter=normalized)
        seen = set()
        for root in roots:
            parts = root.split("/")
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                if parent not in seen and parent not in roots:
                    seen.add(parent)
                    tar.add("/" + parent, arcname=parent, recursive=False, filter=normalized)
            if root in seen or any(root.startswith(r + "/") for r in roots if r != root):
                continue
            seen.add(root)
            tar.add("/" + root, arcname=root, filter=normalized)
    diff_id, size = put_file(out, layer)
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Env": [f"PATH={venv}/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
                   "User": "1000:1000"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config_digest, config_size = put_bytes(out, json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": diff_id, "size": size,
                    "annotations": {"dev.imgbuild.layer.packages": ",".join(versions)}}],
    }
    digest, msize = put_bytes(out, json.dumps(manifest).encode())
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (out / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "manifests": [{
            "mediaType": manifest["mediaType"], "digest": digest, "size": msize,
            "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}))
    print(f"{out}: one layer of {size / 2**30:.2f} GiB ({', '.join(versions)}; "
          f"base prefix {base}), manifest {digest}")


if __name__ == "__main__":
    main()
