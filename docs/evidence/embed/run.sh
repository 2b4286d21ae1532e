#!/bin/sh
# Runs the embedded imgbuild-smoke of the two embed images on the device: the executable,
# loader, glibc (Debian bullseye 2.31) and CUDA libraries all taken from the image's layers
# (umoci unpack on the build machine), the driver from the host, as the NVIDIA container
# toolkit provides it to a container.
set -u
REPO=$PWD
W=/tmp/embed-smoke
mkdir -p $W
nvidia-smi > $OUT/nvidia-smi.txt 2>&1
{
  cat /proc/driver/nvidia/version
  echo "which runc podman docker: $(which runc podman docker 2>/dev/null | tr '\n' ' ')"
  echo "libcuda: $(ldconfig -p | grep 'libcuda.so.1' | head -2 | tr '\n' ' ')"
  ls /usr/local/nvidia/lib64 2>/dev/null | head -5
} > $OUT/host.txt 2>&1
for v in 118 132; do
  mkdir -p $W/$v && tar -xJf $REPO/.devrun/rootfs-$v.tar.xz -C $W/$v
  R=$W/$v/rootfs
  case $v in 118) CV=11.8.89;; 132) CV=13.2.86;; esac
  LP="$R/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu:/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
  run() {
    env -i CUDA_VERSION=$CV PATH=/usr/bin:/bin "$(ls $R/lib/x86_64-linux-gnu/ld-2.*.so)" --library-path "$LP" \
      "$R/opt/imgbuild/bin/imgbuild-smoke" --prefix "$R/opt/conda" "$@"
  }
  {
    echo "\$ imgbuild-smoke --prefix <image>/opt/conda   (image loader + glibc: $(ls $R/lib/x86_64-linux-gnu/libc-*.so))"
    run; echo "exit code: $?"
    echo
    echo "libraries the process mapped (LD_DEBUG=libs, libc and libcuda lines):"
    env -i LD_DEBUG=libs CUDA_VERSION=$CV "$(ls $R/lib/x86_64-linux-gnu/ld-2.*.so)" --library-path "$LP" \
      "$R/opt/imgbuild/bin/imgbuild-smoke" --prefix "$R/opt/conda" 2>&1 >/dev/null \
      | grep -E "calling init: .*(libc\.so|libcuda|libnvrtc|libcudart)" | sed "s|$W|<unpacked>|g"
  } > $OUT/embed-cuda$v.txt 2>&1
  run --json > $OUT/embed-cuda$v.json 2>>$OUT/embed-cuda$v.txt
  echo "--json exit code: $?" >> $OUT/embed-cuda$v.txt
  echo "two more runs:" >> $OUT/embed-cuda$v.txt
  for i in 1 2; do run | grep -E "^run|^verdict"; done >> $OUT/embed-cuda$v.txt 2>&1
done
ls -la $OUT
