#!/usr/bin/env bash
# Runs `collgen bench --backend gpu` sweeps on a GPU machine (no Go needed
# there). Build the binary first where Go is:
#
#   go build -o .gpu/collgen ./cmd/collgen
#
# Then, from the repository root on the GPU machine:
#
#   tests/gpu/bench.sh          # results to $OUT (default .gpu/bench)
#
# For each world size in WORLDS (default "4 2", skipping any the machine has
# too few GPUs for): bf16 sum all-reduce, reduce-scatter and all-gather over
# SIZES (default 1KiB-256MiB), every generated algorithm forced, auto and
# NCCL side by side, CUDA-graph replay. Files (at most 8, for the device
# tool): bench.log (machine, every table, notes), w<W>.json, w<W>.csv and
# w<W>.png per world.
# Knobs: OUT, WORLDS, SIZES, DTYPE (bf16), OP (sum), COLLECTIVES
# (allreduce,reduce_scatter,allgather), CHECK (1: --check), EXTRA (more
# flags, e.g. "--eager" or "--processes"), PER_WORLD_TIMEOUT (s; default
# 560 over the worlds in WORLDS, so the sweeps fit one 600 s call).
# Exit status: non-zero if any sweep failed or a check found a wrong result.
set -uo pipefail

# NVLink multicast stays off: it can take the host's shared GPUs down.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/bench}
WORLDS=${WORLDS:-"4 2"}
SIZES=${SIZES:-1KiB-256MiB}
DTYPE=${DTYPE:-bf16}
OP=${OP:-sum}
COLLECTIVES=${COLLECTIVES:-allreduce,reduce_scatter,allgather}
CHECK=${CHECK:-1}
EXTRA=${EXTRA:-}
nworlds=$(echo $WORLDS | wc -w)
PER_WORLD_TIMEOUT=${PER_WORLD_TIMEOUT:-$((560 / (nworlds > 0 ? nworlds : 1)))}
BIN=${BIN:-.gpu/collgen}
mkdir -p "$OUT"
LOG="$OUT/bench.log"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export COLLGEN_CACHE_DIR=${COLLGEN_CACHE_DIR:-$TMP/cache} # never touch a real user cache

if [ ! -x "$BIN" ]; then
  echo "bench.sh: $BIN is missing; build it with: go build -o .gpu/collgen ./cmd/collgen" | tee "$LOG" >&2
  exit 2
fi

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
{
  echo "== date"; date -u
  echo "== nvidia-smi"; nvidia-smi 2>&1 | head -20
  echo "== topology"; nvidia-smi topo -m 2>&1 | head -12
  echo "== libraries"; ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvrtc|libnccl' | head
  echo "== GPUs: $ngpu; worlds: $WORLDS; sizes: $SIZES; $DTYPE $OP; collectives: $COLLECTIVES; check: $CHECK; extra: $EXTRA"
} >"$LOG" 2>&1

status=0
for w in $WORLDS; do
  if [ "$w" -gt "$ngpu" ]; then
    echo "== world $w: skipped, this machine has $ngpu GPU(s)" | tee -a "$LOG"
    continue
  fi
  args=(bench --backend gpu -n "$w" --dtype "$DTYPE" --op "$OP" --collective "$COLLECTIVES" --sizes "$SIZES"
    --json "$OUT/w$w.json" --csv "$OUT/w$w.csv" --png "$OUT/w$w.png")
  [ "$CHECK" = 1 ] && args+=(--check)
  # shellcheck disable=SC2206
  [ -n "$EXTRA" ] && args+=($EXTRA)
  echo "== world $w: $BIN ${args[*]}" | tee -a "$LOG"
  start=$(date +%s)
  timeout "$PER_WORLD_TIMEOUT" "$BIN" "${args[@]}" >>"$LOG" 2>&1
  rc=$?
  echo "== world $w: exit $rc after $(($(date +%s) - start))s" | tee -a "$LOG"
  [ $rc -ne 0 ] && status=1
done

# The side-by-side summaries and every failure, for a quick look.
grep -E '^(CHECK FAILED|FAILED|collgen:)' "$LOG"
awk '/per-op latency/{p=1} p{print} /^$/{p=0}' "$LOG"
exit $status
