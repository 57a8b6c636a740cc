#!/usr/bin/env bash
# Compiles every generated kernel with nvcc for each architecture given
# (default: sm_80 sm_90), so a template error fails even on a machine with no
# GPU. All kernels are compiled as one translation unit per architecture
# (each .cu includes the common header itself; #pragma once keeps it single).
# The architectures compile side by side, one background job each (nvcc uses
# one core per job); every job's exit code is checked, and each job's output
# is kept in $CUDA_CHECK_LOGS (default: a fresh directory under $TMPDIR,
# named at the end) and printed once all have finished.
# The check wants compile errors, not fast code, so ptxas runs at -O0
# (CUDA_CHECK_FLAGS, default "-Xptxas -O0"; with nvcc 11.8 ptxas takes
# 47 s of CPU over the whole sm_90 unit instead of 83 s at -O3):
# the front end still sees every line, and ptxas still assembles and
# checks every instruction.
# Usage: tests/cuda/check.sh [cuda-dir] [arch...]
set -euo pipefail
dir=${1:-generated/cuda}; shift || true
archs=("$@"); [ ${#archs[@]} -gt 0 ] || archs=(sm_80 sm_90)
NVCC=${NVCC:-nvcc}
read -ra flags <<<"${CUDA_CHECK_FLAGS--Xptxas -O0}"
command -v "$NVCC" >/dev/null || { echo "cuda-check: $NVCC not found; install it with .ci/install-cuda.sh" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
logs=${CUDA_CHECK_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/cuda-check-logs.XXXXXX")}
mkdir -p "$logs"
n=0
for f in "$dir"/*.cu; do echo "#include \"$(realpath "$f")\""; n=$((n+1)); done > "$tmp/all.cu"
# collgen_symm.cuh (runtime/symm's header for users' kernels) is included
# by no kernel; compile it too.
[ -f "$dir/collgen_symm.cuh" ] && echo "#include \"$(realpath "$dir/collgen_symm.cuh")\"" >> "$tmp/all.cu"
[ "$n" -gt 0 ] || { echo "cuda-check: no .cu files in $dir" >&2; exit 1; }

declare -A pids
start=$SECONDS
for arch in "${archs[@]}"; do
  "$NVCC" -std=c++17 -arch="$arch" -I "$dir" -cubin -Werror all-warnings "${flags[@]}" \
    -o "$tmp/all_$arch.cubin" "$tmp/all.cu" >"$logs/$arch.log" 2>&1 &
  pids[$arch]=$!
done
failed=()
for arch in "${archs[@]}"; do
  if wait "${pids[$arch]}"; then
    echo "cuda-check: $n kernels compiled for $arch"
  else
    rc=$?
    echo "cuda-check: $arch failed (exit $rc)" >&2
    failed+=("$arch")
  fi
done
for arch in "${archs[@]}"; do
  if [ -s "$logs/$arch.log" ]; then
    echo "---- nvcc output for $arch ($logs/$arch.log)"
    cat "$logs/$arch.log"
  fi
done
echo "cuda-check: ${#archs[@]} architecture(s) in $((SECONDS - start))s; logs in $logs"
[ ${#failed[@]} -eq 0 ] || { echo "cuda-check: failed for ${failed[*]}" >&2; exit 1; }
