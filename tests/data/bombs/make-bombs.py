#!/usr/bin/env python3
"""Writes the two decompression bombs that tests/it/hostile.rs installs.

`bomb-1.0-h0_0.tar.bz2` and `bomb-1.0-h1_0.conda` are honest conda packages (their
info/paths.json declares the one payload file with its true size and sha256) whose payload is
1 GiB of zeros: under 1 KB of bzip2 and about 33 KB of zstd. Run from this directory; needs
the `zstd` command. The output is the same bytes on every run (fixed mtimes, fixed order).
"""
import bz2
import hashlib
import io
import json
import subprocess
import tarfile
import threading
import zipfile

SIZE = 1 << 30
CHUNK = 1 << 20
MTIME = 1700000000
PAYLOAD = "share/zeros.bin"


class Zeros(io.RawIOBase):
    def __init__(self, size):
        self.left = size

    def readable(self):
        return True

    def readinto(self, buf):
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


def zeros_sha256():
    digest = hashlib.sha256()
    block = bytes(CHUNK)
    for _ in range(SIZE // CHUNK):
        digest.update(block)
    return digest.hexdigest()


def info_files(build, sha256):
    index = {
        "arch": "x86_64", "build": build, "build_number": 0, "depends": [],
        "license": "MIT", "name": "bomb", "platform": "linux", "subdir": "linux-64",
        "timestamp": MTIME * 1000, "version": "1.0",
    }
    paths = {"paths": [{"_path": PAYLOAD, "path_type": "hardlink", "sha256": sha256,
                        "size_in_bytes": SIZE}], "paths_version": 1}
    return [("info/index.json", json.dumps(index, indent=2).encode()),
            ("info/paths.json", json.dumps(paths, indent=2).encode())]


def add(tar, name, data=None, size=None):
    info = tarfile.TarInfo(name)
    info.mtime = MTIME
    info.mode = 0o644
    info.size = len(data) if data is not None else size
    tar.addfile(info, io.BytesIO(data) if data is not None else io.BufferedReader(Zeros(size), CHUNK))


def tar_bytes(entries):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in entries:
            add(tar, name, data)
    return out.getvalue()


def write_tar_bz2(sha256):
    compressor = bz2.BZ2File("bomb-1.0-h0_0.tar.bz2", "wb", compresslevel=9)
    with tarfile.open(fileobj=compressor, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for name, data in info_files("h0_0", sha256):
            add(tar, name, data)
        add(tar, PAYLOAD, size=SIZE)
    compressor.close()


def zstd(data_or_stream):
    return subprocess.run(["zstd", "-19", "-q", "-c"], input=data_or_stream,
                          capture_output=True, check=True).stdout


def write_conda(sha256):
    info = zstd(tar_bytes(info_files("h1_0", sha256)))
    # The payload tar streamed into zstd, never held whole.
    proc = subprocess.Popen(["zstd", "-19", "-q", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        add(tar, PAYLOAD, size=SIZE)
    proc.stdin.close()
    reader.join()
    proc.wait()
    with zipfile.ZipFile("bomb-1.0-h1_0.conda", "w", zipfile.ZIP_STORED) as z:
        for name, data in [("metadata.json", b'{"conda_pkg_format_version": 2}'),
                           ("pkg-bomb-1.0-h1_0.tar.zst", out[0]),
                           ("info-bomb-1.0-h1_0.tar.zst", info)]:
            member = zipfile.ZipInfo(name, date_time=(2023, 11, 14, 22, 13, 20))
            z.writestr(member, data)


if __name__ == "__main__":
    sha256 = zeros_sha256()
    write_tar_bz2(sha256)
    write_conda(sha256)
