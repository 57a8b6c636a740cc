#!/usr/bin/env bash
# `collgen bench --check` with every rank on GPU 0 (--devices 0,...,0) at
# worlds 3, 4 and 8: every collective and algorithm, f32 and f16, sum and
# max, three sizes and their awkward twins, graph replay, then eager and
# zero-copy at world 4. What a machine of one GPU can say about the
# kernels at worlds it cannot hold: right results, no hang (reliability
# case 97 showed here first), no cliff at awkward sizes. The times are the
# kernels' on one GPU, not link speeds. Build where Go is (`make
# gpu-bundle`, or `go build -o .gpu/collgen ./cmd/collgen`), then on the
# GPU machine, from the repository root:
#
#   OUT=/some/dir tests/gpu/shared-bench.sh
#
# Writes NAME.json and NAME.txt per run to $OUT (default .gpu/out). Knobs:
# SIZES (4KiB,256KiB,4MiB), T (seconds per run, 110). About 95 s on an
# H100. Exit status: non-zero if a run failed, timed out or found a wrong
# result.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-.gpu/out}
SIZES=${SIZES:-4KiB,256KiB,4MiB}
T=${T:-110}
BIN=${BIN:-.gpu/collgen}
[ -x "$BIN" ] || { echo "shared-bench.sh: $BIN is missing; build it with: go build -o .gpu/collgen ./cmd/collgen" >&2; exit 2; }
mkdir -p "$OUT"
export COLLGEN_CACHE_DIR=${COLLGEN_CACHE_DIR:-$(mktemp -d)}
status=0
# run NAME WORLD FLAGS...: one sweep with WORLD ranks on GPU 0.
run() {
  local name=$1 w=$2 devs start rc bad ok
  shift 2
  devs=$(printf '0%.0s,' $(seq "$w")); devs=${devs%,}
  start=$(date +%s)
  timeout "$T" "$BIN" bench --backend gpu -n "$w" --devices "$devs" --dtype f32,f16 --op sum,max \
    --collective allreduce,reduce_scatter,allgather --algorithms all --sizes "$SIZES" --awkward=both \
    --check --iters 3 --json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  bad=$(grep -c 'CHECK FAILED\|^error' "$OUT/$name.txt")
  ok=$(grep -c 'check ok' "$OUT/$name.txt")
  echo "$name: exit $rc after $(( $(date +%s) - start ))s, $ok rows checked, $bad wrong or failed"
  if [ "$rc" -ne 0 ] || [ "$bad" -ne 0 ]; then status=1; fi
}
run w3 3
run w4 4
run w8 8
run w4-eager 4 --eager
run w4-zero-copy 4 --zero-copy
grep -h 'CHECK FAILED\|^error' "$OUT"/*.txt | cut -c1-300 | head -20
exit $status
