#!/usr/bin/env bash
# Installs Debian's CUDA 11.8 toolkit (nvcc for sm_80/sm_90) from the non-free
# archive, for compile checks of the generated kernels on machines with no GPU.
set -euo pipefail
if command -v nvcc >/dev/null 2>&1; then exit 0; fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO tee /etc/apt/sources.list.d/collgen-nonfree.sources >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit >/dev/null
nvcc --version | tail -1
