#!/bin/bash
# Runs the current imgbuild's smoke test on the layouts given, on the device machine.
set -u
cd "$(dirname "$0")"
gunzip -c imgbuild.gz > /tmp/imgbuild && chmod +x /tmp/imgbuild
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/host.txt" 2>&1
for layout in "$@"; do
  {
    for i in 1 2 3; do
      echo "### run $i: imgbuild smoke $layout"
      /tmp/imgbuild smoke "$layout"; echo "exit=$?"
    done
  } > "$OUT/$layout.txt" 2>&1
  /tmp/imgbuild smoke "$layout" --json > "$OUT/$layout.json" 2>"$OUT/$layout.stderr"; echo "exit=$?" >> "$OUT/$layout.stderr"
done
ls -la "$OUT"
