#!/bin/bash
# Issue 16 evidence: the current imgbuild's smoke test (with the CPU/GPU ping-pong run and the
# kernel-images case) on the layouts given, on the device machine. Run from the repository
# root: docs/evidence/issue16/run.sh images/.ev16/layout-118
set -u
gunzip -c images/.ev16/imgbuild.gz > /tmp/imgbuild && chmod +x /tmp/imgbuild
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv > "$OUT/host.txt" 2>&1
for layout in "$@"; do
  name=$(basename "$layout")
  {
    for i in 1 2 3; do
      echo "### run $i: imgbuild smoke $name"
      /tmp/imgbuild smoke "$layout"; echo "exit=$?"
    done
  } > "$OUT/$name.txt" 2>&1
  /tmp/imgbuild smoke "$layout" --json > "$OUT/$name.json" 2>"$OUT/$name.stderr"; echo "exit=$?" >> "$OUT/$name.stderr"
done
ls -la "$OUT"
