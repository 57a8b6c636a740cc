#!/usr/bin/env bash
# Builds one fatbin holding every generated kernel for sm_90 (and sm_80), for
# the runtime to load instead of compiling with NVRTC.
# Usage: tests/cuda/fatbin.sh [cuda-dir] [out.fatbin]
# ONLY: a glob over kernel names (e.g. '*_ll128_*') to build a subset.
set -euo pipefail
dir=${1:-generated/cuda}; out=${2:-.gpu/collgen.fatbin}
NVCC=${NVCC:-nvcc}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ONLY=${ONLY:-*}
for f in "$dir"/$ONLY.cu; do [ -e "$f" ] || continue; echo "#include \"$(realpath "$f")\""; done > "$tmp/all.cu"
"$NVCC" -std=c++17 -I "$dir" -fatbin -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 -o "$out" "$tmp/all.cu"
echo "fatbin: $out"
