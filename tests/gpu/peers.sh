#!/usr/bin/env bash
# The README's world-2 table: collgen staged and zero-copy, NCCL, NCCL
# windows and PyTorch symmetric memory, all in one run (bf16, graph replay,
# process per GPU). Build the bundle where Go is (`make gpu-bundle`); the
# peers' scripts are in tests/gpu/anchors. Then from the repository root on
# the GPU machine:
#
#   OUT=/some/dir tests/gpu/peers.sh
#
# Writes $OUT/peers.tgz (JSON of every run, logs). Knobs: WORLD (2),
# SIZES, ANCHORS (tests/gpu/anchors). Exit status: non-zero if any step
# failed or timed out, or a --check found a wrong result.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/out}
WORLD=${WORLD:-2}
SIZES=${SIZES:-1KiB,8KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB}
ANCHORS=${ANCHORS:-tests/gpu/anchors}
R=$(mktemp -d)
mkdir -p "$OUT"
trap 'tar czf "$OUT/peers.tgz" -C "$R" --exclude=cache . 2>/dev/null; rm -rf "$R"' EXIT
export COLLGEN_CACHE_DIR=$R/cache
status=0
# el RC WHAT: the step's time and exit status; a failed step fails the script.
t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s] $2 rc=$1"; [ "$1" -eq 0 ] || status=1; }
B=(.gpu/collgen bench --backend gpu -n "$WORLD" --processes --dtype bf16 --op sum
   --collective allreduce,reduce_scatter,allgather --sizes "$SIZES" --check)
timeout 150 "${B[@]}" --algorithms auto,nccl --json "$R/staged.json" >"$R/staged.txt" 2>&1; el $? staged
timeout 150 "${B[@]}" --algorithms auto,oneshot,nccl --zero-copy --json "$R/zc.json" >"$R/zc.txt" 2>&1; el $? zero-copy
timeout 120 python3 "$ANCHORS/torch_anchor_bench.py" "$R/torch.json" "$WORLD" >"$R/torch.log" 2>&1; el $? torch
timeout 60 python3 "$ANCHORS/torch_rsag_bench.py" "$R/torch_rsag.json" "$WORLD" >"$R/torch_rsag.log" 2>&1; el $? "torch rs/ag"
timeout 90 python3 "$ANCHORS/nccl_window_bench.py" "$R/ncclwin.json" "$WORLD" >"$R/ncclwin.log" 2>&1; el $? "nccl window"
for f in staged zc; do grep -A11 "per-op latency" "$R/$f.txt"; done
grep -c "FAILED" "$R/staged.txt" "$R/zc.txt"
grep -q "FAILED" "$R/staged.txt" "$R/zc.txt" && status=1
exit $status
