#!/bin/bash
# On the device host: the split image from the same lock, at -j 1 and -j 16, and its digest.
set -euo pipefail
dev=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p /tmp/bin && xz -dc "$dev/imgbuild.xz" > /tmp/bin/imgbuild && chmod +x /tmp/bin/imgbuild
xz -dc "$dev/bench.xz" > /tmp/bin/bench && chmod +x /tmp/bin/bench
rm -rf /tmp/split-channel && cp -r "$dev/split/channel" /tmp/split-channel
for j in 1 16; do
  rm -rf /tmp/splitproj-$j && cp -r "$dev/split/proj" /tmp/splitproj-$j
  (cd /tmp/splitproj-$j && IMGBUILD_CACHE_DIR=/tmp/splitcache-$j /tmp/bin/imgbuild --quiet build recipes/split.toml --locked --jobs $j --json | grep '"result"' | python3 -c 'import json,sys; r=json.load(sys.stdin); print("-j", '$j', r["digest"], "layers", r["layers"])')
done
nproc; uname -r
