#!/bin/bash
# Issue 21 evidence (section 3): `imgbuild smoke --attest` on the device machine's GPU, for
# the layouts given. Run from the repository root:
#   docs/evidence/issue21/run.sh images/.ev21/layout-118
# Writes into $OUT: host.txt and nvidia-smi.txt (the device), imgbuild.txt (the binary's
# version and sha256), and per layout NAME.txt (the text report of a run with --attest, its
# exit code), NAME.intoto.json (that run's attestation), NAME.json (the --json report of a
# second run with --attest), NAME.json.intoto.json (its attestation) and NAME.stderr.
set -u
gunzip -c images/.ev21/imgbuild.gz > /tmp/imgbuild && chmod +x /tmp/imgbuild
{ /tmp/imgbuild --version; sha256sum /tmp/imgbuild; } > "$OUT/imgbuild.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,mig.mode.current,mig.mode.pending --format=csv > "$OUT/host.txt" 2>&1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
for layout in "$@"; do
  name=$(basename "$layout")
  {
    echo "### imgbuild smoke $layout --attest \$OUT/$name.intoto.json"
    /tmp/imgbuild smoke "$layout" --attest "$OUT/$name.intoto.json"; echo "exit=$?"
  } > "$OUT/$name.txt" 2>&1
  /tmp/imgbuild smoke "$layout" --json --attest "$OUT/$name.json.intoto.json" > "$OUT/$name.json" 2>"$OUT/$name.stderr"; echo "exit=$?" >> "$OUT/$name.stderr"
done
ls -la "$OUT"
