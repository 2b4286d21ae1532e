#!/bin/sh
# Installs what the tests run against: real OCI consumers and a runtime from Debian.
# Needs root (or sudo) on Debian/Ubuntu. Safe to run again.
set -eu
PACKAGES="umoci skopeo oci-image-tool runc busybox-static docker-registry apache2-utils podman"
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
