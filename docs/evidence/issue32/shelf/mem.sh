#!/bin/bash
# On the device host: the synthetic bench with the block shelf at three layer budgets.
set -euo pipefail
dev=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/bin
xz -dc "$dev/imgbuild-shelf.xz" > /tmp/bin/imgbuild-shelf && chmod +x /tmp/bin/imgbuild-shelf
xz -dc "$dev/bench.xz" > /tmp/bin/bench && chmod +x /tmp/bin/bench
export IMGBUILD_BENCH_DIR=/tmp/synb
for mem in 134217728 201326592 268435456; do
  echo "== IMGBUILD_LAYER_MEMORY=$mem"
  IMGBUILD_LAYER_MEMORY=$mem /tmp/bin/bench --synthetic --jobs 2,16,64 --compressions zstd,gzip --imgbuild /tmp/bin/imgbuild-shelf 2>&1 | grep "^| [0-9]\|wall\|floor" | grep "^| [0-9]"
done
