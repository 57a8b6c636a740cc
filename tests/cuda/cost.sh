#!/usr/bin/env bash
# Measures what each generated kernel costs the CUDA compiler, as a proxy
# for NVRTC's compile time on a machine without a GPU: per kernel file,
# the CPU time (user + system, so other load on the machine matters
# little) of `nvcc -ptx` (preprocessor and cicc, the front end and
# optimiser) and of `ptxas -O3` on its PTX (NVRTC's default), then the
# sums per family (collective, algorithm, protocol) and per world size.
# nvcc also parses host-side headers that NVRTC does not have: the fixed
# cost of one empty kernel with the header is measured too and subtracted
# in the "net" column, the part that depends on the kernel's code. Compare
# runs of this script with each other, not with NVRTC.
# Usage: tests/cuda/cost.sh [cuda-dir] [glob]   (JOBS: parallel runs, default nproc; ARCH: sm_90)
# Output: $COST_OUT (default: a fresh directory under $TMPDIR, named at
# the end): files.txt ("file front_ms ptxas_ms" per kernel), summary.txt.
set -euo pipefail
dir=${1:-generated/cuda}
glob=${2:-*.cu}
NVCC=${NVCC:-nvcc}
PTXAS=${PTXAS:-$(dirname "$(command -v "$NVCC" || echo nvcc)")/ptxas}
ARCH=${ARCH:-sm_90}
JOBS=${JOBS:-$(nproc)}
command -v "$NVCC" >/dev/null || { echo "cost: $NVCC not found; install it with .ci/install-cuda.sh" >&2; exit 1; }
out=${COST_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/cuda-cost.XXXXXX")}
mkdir -p "$out/ptx"
export NVCC PTXAS ARCH dir out
# one FILE: "name front_ms ptxas_ms", CPU milliseconds.
one() {
  local f=$1 b t1 t2
  b=$(basename "$f" .cu)
  TIMEFORMAT='%3U %3S'
  t1=$({ time "$NVCC" -std=c++17 -arch="$ARCH" -ptx -I "$dir" -o "$out/ptx/$b.ptx" "$f" >/dev/null 2>"$out/ptx/$b.err"; } 2>&1) ||
    { echo "cost: $b failed (see $out/ptx/$b.err)" >&2; return 1; }
  t2=$({ time "$PTXAS" -arch="$ARCH" -O3 -o /dev/null "$out/ptx/$b.ptx" >/dev/null 2>>"$out/ptx/$b.err"; } 2>&1) ||
    { echo "cost: ptxas $b failed (see $out/ptx/$b.err)" >&2; return 1; }
  rm -f "$out/ptx/$b.ptx"
  echo "$b $t1 $t2" | awk '{ printf "%s %.0f %.0f\n", $1, ($2 + $3) * 1000, ($4 + $5) * 1000 }'
}
export -f one
start=$SECONDS
printf '#include "collgen_common.cuh"\nextern "C" __global__ void header_only() {}\n' >"$out/header_only.cu"
fixed=$(for _ in 1 2 3; do one "$out/header_only.cu"; done | sort -k2n | sed -n 2p) # the median of three
# shellcheck disable=SC2086
ls "$dir"/$glob | xargs -P "$JOBS" -I{} bash -c 'one "$@"' _ {} | sort >"$out/files.txt"
echo "$fixed" | awk '{ printf "fixed cost per file (one empty kernel with the header): front %d ms, ptxas %d ms\n", $2, $3 }' >"$out/summary.txt"
awk -v ff="$(echo "$fixed" | cut -d' ' -f2)" -v fp="$(echo "$fixed" | cut -d' ' -f3)" '
  function row(g, k, n, c, p) { printf "%d %-30s %5d %9.1f %9.1f %9.1f %9.1f %7.0f\n", g, k, n, c/1000, p/1000, (c+p)/1000, (c+p-n*(ff+fp))/1000, (c+p-n*(ff+fp))/n }
  {
    f = $1; w = f; sub(/.*_w/, "w", w)
    fam = f; sub(/_(f32|f16|bf16|f64|i32|i64|e4m3|e5m2)(_[a-z]+)?_w[0-9]+$/, "", fam)
    c[fam] += $2; p[fam] += $3; n[fam]++
    cw[w] += $2; pw[w] += $3; nw[w]++
    tc += $2; tp += $3; tn++
  }
  END {
    printf "0 %-30s %5s %9s %9s %9s %9s %7s\n", "family (CPU seconds)", "files", "front", "ptxas", "total", "net", "net/file ms"
    for (k in c) row(1, k, n[k], c[k], p[k])
    for (k in cw) row(2, k, nw[k], cw[k], pw[k])
    row(3, "all", tn, tc, tp)
  }' "$out/files.txt" | sort -k1,1n -k2,2 | cut -d' ' -f2- >>"$out/summary.txt"
cat "$out/summary.txt"
echo "cost: $(wc -l <"$out/files.txt") files in $((SECONDS - start))s with $JOBS jobs; per-file figures in $out/files.txt"
