#!/usr/bin/env bash
# Compiles every generated kernel with nvcc for each architecture given
# (default: sm_80 sm_90), so a template error fails even on a machine with no
# GPU. All kernels are compiled as one translation unit per architecture
# (each .cu includes the common header itself; #pragma once keeps it single).
# Usage: tests/cuda/check.sh [cuda-dir] [arch...]
set -euo pipefail
dir=${1:-generated/cuda}; shift || true
archs=("$@"); [ ${#archs[@]} -gt 0 ] || archs=(sm_80 sm_90)
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || { echo "cuda-check: $NVCC not found; install it with .ci/install-cuda.sh" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
n=0
for f in "$dir"/*.cu; do echo "#include \"$(realpath "$f")\""; n=$((n+1)); done > "$tmp/all.cu"
[ "$n" -gt 0 ] || { echo "cuda-check: no .cu files in $dir" >&2; exit 1; }
for arch in "${archs[@]}"; do
  "$NVCC" -std=c++17 -arch="$arch" -I "$dir" -cubin -Werror all-warnings -o "$tmp/all_$arch.cubin" "$tmp/all.cu"
  echo "cuda-check: $n kernels compiled for $arch"
done
