#!/usr/bin/env bash
# Builds one fatbin holding every generated kernel for the architectures in
# FATBIN_ARCHS (default "sm_90 sm_80"; e.g. "sm_90 sm_100"), for the runtime
# to load instead of compiling with NVRTC (comm.Config.FatbinPath or
# Config.Fatbin, or $COLLGEN_FATBIN). Each architecture gets a cubin; the
# newest also gets its PTX, which the driver compiles for newer devices.
# nvcc compiles the architectures in parallel (--threads 0).
# Usage: tests/cuda/fatbin.sh [cuda-dir] [out.fatbin]
# ONLY: a glob over kernel names (e.g. '*_ll128_*' or '*_w2') to build a subset.
set -euo pipefail
dir=${1:-generated/cuda}; out=${2:-.gpu/collgen.fatbin}
NVCC=${NVCC:-nvcc}
read -ra archs <<<"${FATBIN_ARCHS:-sm_90 sm_80}"
[ ${#archs[@]} -gt 0 ] || { echo "fatbin: FATBIN_ARCHS names no architecture" >&2; exit 1; }
gencode=()
newest=0
for a in "${archs[@]}"; do
  n=${a#sm_}
  [[ "$a" == sm_* && "$n" =~ ^[0-9]+[a-z]?$ ]] || { echo "fatbin: bad architecture $a in FATBIN_ARCHS (want sm_NN)" >&2; exit 1; }
  gencode+=(-gencode "arch=compute_$n,code=sm_$n")
  [ "${n%%[a-z]}" -gt "${newest%%[a-z]}" ] && newest=$n
done
gencode+=(-gencode "arch=compute_$newest,code=compute_$newest")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ONLY=${ONLY:-*}
n=0
for f in "$dir"/$ONLY.cu; do [ -e "$f" ] || continue; echo "#include \"$(realpath "$f")\""; n=$((n+1)); done > "$tmp/all.cu"
[ "$n" -gt 0 ] || { echo "fatbin: no kernels match $dir/$ONLY.cu" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
start=$SECONDS
"$NVCC" -std=c++17 -I "$dir" -fatbin --threads 0 "${gencode[@]}" -o "$out" "$tmp/all.cu"
echo "fatbin: $out ($n kernels; ${archs[*]} + compute_$newest PTX) in $((SECONDS - start))s"
