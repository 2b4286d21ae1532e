#!/bin/bash
# On the device host: eStargz and zstd:chunked with the seekable inputs shelved too.
set -euo pipefail
dev=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/bin
xz -dc "$dev/imgbuild-shelf2.xz" > /tmp/bin/imgbuild-shelf2 && chmod +x /tmp/bin/imgbuild-shelf2
xz -dc "$dev/bench.xz" > /tmp/bin/bench && chmod +x /tmp/bin/bench
export IMGBUILD_BENCH_DIR=/tmp/synb
/tmp/bin/bench --synthetic --jobs 2,16,64 --compressions estargz,zstd:chunked,zstd --imgbuild /tmp/bin/imgbuild-shelf2 2>&1 | grep "^| [0-9]"
