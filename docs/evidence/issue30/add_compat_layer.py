#!/usr/bin/env python3
"""Adds a layer holding CUDA forward-compatibility libraries to an OCI layout, for the H200
forward-compat evidence (README.md beside this file). The GPU host has no conda channel and
nothing can be installed there, so the compat libraries of this run come from the host
itself: NVIDIA's real /usr/local/cuda/compat (the older branch) or a copy of the host
driver's libcuda under a newer-branch name (a stand-in for the newer branch).

    add_compat_layer.py LAYOUT TAG SRC_DIR VERSION OUT_LAYOUT

copies LAYOUT to OUT_LAYOUT and adds one layer: usr/local/cuda/compat/libcuda.so.VERSION
(the bytes of SRC_DIR's libcuda.so.*.*), libcuda.so.1 -> it, and the same for
libnvidia-ptxjitcompiler when SRC_DIR has it. Only the standard library is used.
"""

import gzip
import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path


def blob_path(layout: Path, digest: str) -> Path:
    algo, hex_ = digest.split(":")
    return layout / "blobs" / algo / hex_


def put_blob(layout: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blob_path(layout, digest).write_bytes(data)
    return digest


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o755, 0
    tar.addfile(info, io.BytesIO(data))


def add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
    tar.addfile(info)


def layer_tar(src: Path, version: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for d in ["usr", "usr/local", "usr/local/cuda", "usr/local/cuda/compat"]:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for stem in ["libcuda", "libnvidia-ptxjitcompiler"]:
            found = sorted(p for p in src.glob(stem + ".so.*.*") if not p.is_symlink())
            if not found:
                continue
            name = f"{stem}.so.{version}"
            add_file(tar, f"usr/local/cuda/compat/{name}", found[0].read_bytes())
            add_link(tar, f"usr/local/cuda/compat/{stem}.so.1", name)
    return out.getvalue()


def main() -> None:
    layout, tag, src, version, out = sys.argv[1:6]
    layout, out, src = Path(layout), Path(out), Path(src)
    shutil.copytree(layout, out, symlinks=True)
    index = json.loads((out / "index.json").read_text())
    entry = next(m for m in index["manifests"]
                 if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    manifest = json.loads(blob_path(out, entry["digest"]).read_bytes())
    if manifest.get("mediaType", "").endswith("image.index.v1+json"):
        sub = manifest["manifests"][0]
        manifest = json.loads(blob_path(out, sub["digest"]).read_bytes())
    config = json.loads(blob_path(out, manifest["config"]["digest"]).read_bytes())
    tar = layer_tar(src, version)
    gz = gzip.compress(tar, mtime=0)
    config["rootfs"]["diff_ids"].append("sha256:" + hashlib.sha256(tar).hexdigest())
    manifest["layers"].append({
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": put_blob(out, gz),
        "size": len(gz),
    })
    config_bytes = json.dumps(config).encode()
    manifest["config"]["digest"] = put_blob(out, config_bytes)
    manifest["config"]["size"] = len(config_bytes)
    manifest_bytes = json.dumps(manifest).encode()
    entry.update(digest=put_blob(out, manifest_bytes), size=len(manifest_bytes),
                 mediaType=manifest["mediaType"])
    (out / "index.json").write_text(json.dumps(index))
    print(f"{out}: added compat layer libcuda.so.{version} from {src}")


if __name__ == "__main__":
    main()
