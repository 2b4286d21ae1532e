#!/bin/bash
# The framework check through `imgbuild smoke`'s local sandbox on the H200 (issue 30): the
# host's Python environment made into an image (host_env_image.py), unpacked into the
# private root and run there. Run from the repository root of the device's copy with the
# release imgbuild carried xz-compressed in target/dev/. Writes to $OUT.
set -u
D=target/dev
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -x "$D/imgbuild" ] || { xz -dkf "$D/imgbuild.xz" && chmod +x "$D/imgbuild"; }
{ df -h /tmp; nproc; } > "$OUT/host.txt" 2>&1
/usr/bin/time -v python3 docs/evidence/issue30/host_env_image.py /opt/torch/.venv /tmp/hostenv \
    > "$OUT/image.txt" 2>&1
/usr/bin/time -v timeout 400 "$D/imgbuild" smoke /tmp/hostenv --attest "$OUT/attestation.json" \
    > "$OUT/smoke.txt" 2> "$OUT/smoke-time.txt"
echo "exit $?" >> "$OUT/smoke.txt"
cat "$OUT/image.txt" "$OUT/smoke.txt"; tail -n 25 "$OUT/smoke-time.txt"
