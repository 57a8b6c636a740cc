#!/usr/bin/env bash
# A/B benchmark of two collgen builds on a GPU machine (no Go needed
# there), interleaved so that drift in clocks or the machine hits both:
# A, B, A, B, ... (PASSES pairs, default 2), every run with the same
# `collgen bench --backend gpu` flags. Each B run reports its rows against
# the A run just before it (--baseline: "vs baseline" above 1 = B faster),
# each later A run against the B before it, so a gain that holds shows in
# every pair and one that flips is noise.
#
#   tests/gpu/ab.sh A_COLLGEN B_COLLGEN BENCH_FLAGS...
#   e.g. (a kernel branch against main, its bundle in .gpu/llf):
#   tests/gpu/ab.sh .gpu/collgen .gpu/llf/collgen -n 2 --processes \
#     --dtype bf16 --op sum --check --collective allreduce \
#     --sizes 1KiB..4MiB:x4 --algorithms auto,oneshot_ll128,twoshot_ll128
#
# Files in $OUT (default .gpu/ab): a1.json, b1.json, a2.json, ... and
# ab.log (every run's table). Knobs: OUT, PASSES, RUN_TIMEOUT (s per run;
# default 560 over the 2*PASSES runs, so all of them fit one 600 s call).
# Exit status: non-zero if any run failed (a wrong result under --check
# included).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ $# -lt 2 ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
a=$1 b=$2
shift 2
for bin in "$a" "$b"; do
  [ -x "$bin" ] || { echo "ab.sh: $bin is not an executable collgen" >&2; exit 2; }
done
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/ab}
mkdir -p "$OUT"
log=$OUT/ab.log
: >"$log"
status=0
prev=""
PASSES=${PASSES:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-$((560 / (2 * PASSES)))}
for i in $(seq 1 "$PASSES"); do
  for side in a b; do
    bin=$a
    [ "$side" = b ] && bin=$b
    name=$side$i
    base=()
    [ -n "$prev" ] && base=(--baseline "$prev")
    echo "== $name: $bin bench --backend gpu $* ${base[*]}" | tee -a "$log"
    if ! timeout "$RUN_TIMEOUT" "$bin" bench --backend gpu "$@" "${base[@]}" --json "$OUT/$name.json" >>"$log" 2>&1; then
      echo "$name failed (see $log)" | tee -a "$log"
      status=1
    fi
    # A run that wrote no results gives the next one no baseline.
    if [ -s "$OUT/$name.json" ]; then prev=$OUT/$name.json; else prev=""; fi
  done
done
exit $status
