# A conda channel of one package of three 12 MiB files, for building the split image on two machines.
import hashlib, io, json, os, random, tarfile, bz2, sys
root = sys.argv[1]
sub = os.path.join(root, "linux-64"); os.makedirs(sub, exist_ok=True); os.makedirs(os.path.join(root, "noarch"), exist_ok=True)
rng = random.Random(32)
files = {}
for i in range(3):
    # Compressible about 2:1, not trivially.
    files[f"lib/libpart{i}.so"] = bytes(rng.choice(b"abcdefghijklmnop") for _ in range(12 << 20))
files["bin/hello"] = b"#!/bin/sh\necho hello\n"
index = {"name": "bigpkg", "version": "1.0", "build": "h0_0", "build_number": 0, "depends": [], "subdir": "linux-64", "platform": "linux", "arch": "x86_64", "timestamp": 1700000000000, "license": "MIT"}
paths = {"paths": [{"_path": p, "path_type": "hardlink", "sha256": hashlib.sha256(b).hexdigest(), "size_in_bytes": len(b)} for p, b in sorted(files.items())], "paths_version": 1}
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as tar:
    def add(name, data, mode=0o644):
        ti = tarfile.TarInfo(name); ti.size = len(data); ti.mode = mode; ti.mtime = 1700000000
        tar.addfile(ti, io.BytesIO(data))
    for p, b in sorted(files.items()):
        add(p, b, 0o755)
    add("info/index.json", json.dumps(index).encode())
    add("info/paths.json", json.dumps(paths).encode())
    add("info/files", "\n".join(sorted(files)).encode() + b"\n")
data = bz2.compress(buf.getvalue(), 9)
name = "bigpkg-1.0-h0_0.tar.bz2"
open(os.path.join(sub, name), "wb").write(data)
rec = dict(index); rec.update(sha256=hashlib.sha256(data).hexdigest(), md5=hashlib.md5(data).hexdigest(), size=len(data))
json.dump({"info": {"subdir": "linux-64"}, "packages": {name: rec}, "packages.conda": {}}, open(os.path.join(sub, "repodata.json"), "w"))
json.dump({"info": {"subdir": "noarch"}, "packages": {}, "packages.conda": {}}, open(os.path.join(root, "noarch", "repodata.json"), "w"))
print(name, len(data))
