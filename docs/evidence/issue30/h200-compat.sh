#!/bin/bash
# Forward compatibility on the H200 (issue 30, part 3), run from the repository root of the
# device's copy with the release binaries carried xz-compressed in target/dev/ and the CUDA
# 11.8 smoke layout (examples/make_cuda_smoke_images.rs) in target/dev/smoke-cuda118.
# Writes to $OUT. Nothing is installed: the compat libraries come from the host.
set -u
D=target/dev
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for f in imgbuild imgbuild-smoke; do
    [ -x "$D/$f" ] || { xz -dkf "$D/$f.xz" && chmod +x "$D/$f"; }
done
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python3)
DRV=/usr/local/nvidia/lib64
{
    echo "# host"; cat /proc/driver/nvidia/version; ls -l /usr/local/cuda/compat/ "$DRV"/libcuda.so* 
} > "$OUT/host.txt" 2>&1
OLD=$(ls /usr/local/cuda/compat/libcuda.so.*.* | sed 's/.*libcuda\.so\.//')
# The older branch: NVIDIA's real compat package of this host (CUDA 13.0, libcuda $OLD).
"$PY" docs/evidence/issue30/add_compat_layer.py "$D/smoke-cuda118" latest /usr/local/cuda/compat "$OLD" /tmp/c-old
# The newer branch, a stand-in: this host driver's own libcuda and PTX JIT under 590.
"$PY" docs/evidence/issue30/add_compat_layer.py "$D/smoke-cuda118" latest "$DRV" 590.0.0 /tmp/c-new
for b in old new; do
    "$D/imgbuild" smoke /tmp/c-$b > "$OUT/smoke-compat-$b.txt" 2>&1; echo "exit $?" >> "$OUT/smoke-compat-$b.txt"
    "$D/imgbuild" smoke /tmp/c-$b --json > "$OUT/smoke-compat-$b.json" 2>/dev/null
done
# In the image, the runtime decides; the host stands in for a container whose toolkit put
# nothing first (the decision), then for the old unconditional LD_LIBRARY_PATH.
P=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia | head -1)
"$D/imgbuild-smoke" --prefix "$P" --no-framework > "$OUT/in-image-decided.txt" 2>&1; echo "exit $?" >> "$OUT/in-image-decided.txt"
LD_LIBRARY_PATH=/usr/local/cuda/compat:${LD_LIBRARY_PATH:-} "$D/imgbuild-smoke" --prefix "$P" --no-framework > "$OUT/in-image-compat-forced.txt" 2>&1; echo "exit $?" >> "$OUT/in-image-compat-forced.txt"
tail -n 3 "$OUT"/*.txt
