#!/bin/sh
# Before/after the blob hash on the writer thread: the synthetic bench, zstd and gzip, -j 2 and 16.
set -e
cd "$(dirname "$0")"
for f in imgbuild-new imgbuild-old bench; do [ -x $f ] || { xz -dkf $f.xz; chmod +x $f; }; done
export IMGBUILD_BENCH_DIR=/tmp/synb
nproc > $OUT/host.txt; lscpu | grep -i "model name\|sha" >> $OUT/host.txt || true
for round in 1 2; do
  for which in old new; do
    ./bench --synthetic --jobs 2,16 --compressions zstd,gzip --imgbuild "$(pwd)/imgbuild-$which" \
      --label "$which round $round" --out $OUT/benchmarks.md 2>>$OUT/bench.log
  done
done
