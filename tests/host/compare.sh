#!/usr/bin/env bash
# Compare collgen's host backend with PyTorch gloo all-reduce on this host's
# CPUs, side by side in one run (f32 sum, 4 processes by default), with
# copy bandwidth for reference. Needs python3 with torch (numpy optional) and
# a collgen binary; no Go, no GPU.
#
#   tests/host/compare.sh                      # uses .gpu/collgen
#   COLLGEN=/path/to/collgen WORLD=4 SIZES=4KiB,64KiB,1MiB,16MiB OUT=/tmp/cmp tests/host/compare.sh
#
# Exits 1 when a speed-up target (TARGETS, default 4KiB=30,16MiB=3) is missed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
COLLGEN=${COLLGEN:-$root/.gpu/collgen}
WORLD=${WORLD:-4}
SIZES=${SIZES:-4KiB,64KiB,1MiB,16MiB}
TARGETS=${TARGETS:-4KiB=30,16MiB=3}
OUT=${OUT:-$(mktemp -d /tmp/collgen-compare.XXXXXX)}
PY=${PYTHON:-python3}

[ -x "$COLLGEN" ] || { echo "compare.sh: no collgen binary at $COLLGEN (set COLLGEN=...)" >&2; exit 2; }
"$PY" -c 'import torch, torch.distributed' 2>/dev/null || { echo "compare.sh: $PY cannot import torch" >&2; exit 2; }
mkdir -p "$OUT"

echo "== host: $(nproc) CPUs, $(uname -r), torch $("$PY" -c 'import torch; print(torch.__version__)')"
echo "== /dev/shm: $(df -h --output=size,avail /dev/shm | tail -1)"

# The host backend needs about WORLD * 4 slots * slot bytes of /dev/shm; on a
# small tmpfs (docker's default is 64 MiB) shrink the slots to fit half of it.
slot_args=()
avail_kib=$(df -k --output=avail /dev/shm | tail -1 | tr -d ' ')
if [ -n "${SLOT_BYTES:-}" ]; then
	slot_args=(--slot-bytes "$SLOT_BYTES")
elif [ "$avail_kib" -lt $((WORLD * 4 * 8 * 1024 * 2)) ]; then
	slot=$((avail_kib * 1024 / 2 / WORLD / 4 / 4096 * 4096))
	echo "== small /dev/shm: using --slot-bytes $slot"
	slot_args=(--slot-bytes "$slot")
fi

echo "== gloo all-reduce ($WORLD processes)"
"$PY" "$here/gloo_bench.py" bench --world "$WORLD" --sizes "$SIZES" --out "$OUT/gloo.json"

echo "== collgen host all-reduce ($WORLD processes)"
"$COLLGEN" bench --backend host -n "$WORLD" --sizes "$SIZES" --dtype f32 --op sum --collective allreduce \
	--check --baseline "$OUT/gloo.json" --json "$OUT/host.json" --memcpy "${slot_args[@]}" | tee "$OUT/host.txt"

echo "== memcpy"
"$PY" "$here/gloo_bench.py" memcpy --out "$OUT/memcpy.json"

echo "== comparison (results in $OUT)"
"$PY" "$here/gloo_bench.py" report "$OUT/gloo.json" "$OUT/host.json" --memcpy "$OUT/memcpy.json" --targets "$TARGETS"
