#!/usr/bin/env bash
# Compare collgen's host backend with PyTorch gloo all-reduce on this host's
# CPUs (f32 sum): for each world size, gloo once, then SWEEPS back-to-back
# collgen sweeps of the same sizes, summarised per size as the best and the
# median of the sweeps' medians, their worst/best ratio (a cliff shows as a
# ratio far above 1), gloo's median and the speed-up. Needs python3 with
# torch (numpy optional) and a collgen binary; no Go, no GPU.
#
#   tests/host/compare.sh                       # uses .gpu/collgen
#   WORLDS="2 4" SIZES=4KiB-1MiB SWEEPS=3 OUT=/tmp/cmp COLLGEN=/path/to/collgen tests/host/compare.sh
#
# Writes to $OUT: table.md (the summary), compare.log (everything printed)
# and raw.tgz (gloo and collgen JSON per world and sweep, collgen's tables,
# memcpy). Exits 1 when a size's worst sweep is more than STABILITY times
# its best, slower than gloo, or above a MAX_US latency target.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
COLLGEN=${COLLGEN:-$root/.gpu/collgen}
WORLDS=${WORLDS:-2 4 8}
SIZES=${SIZES:-4KiB-64MiB}
SWEEPS=${SWEEPS:-5}
STABILITY=${STABILITY:-1.5}
MAX_US=${MAX_US:-4:4KiB=6,4:16MiB=1500}
GLOO_SECONDS=${GLOO_SECONDS:-0.5}
OUT=${OUT:-$(mktemp -d /tmp/collgen-compare.XXXXXX)}
PY=${PYTHON:-python3}

[ -x "$COLLGEN" ] || { echo "compare.sh: no collgen binary at $COLLGEN (set COLLGEN=...)" >&2; exit 2; }
"$PY" -c 'import torch, torch.distributed' 2>/dev/null || { echo "compare.sh: $PY cannot import torch" >&2; exit 2; }
mkdir -p "$OUT"
raw=$(mktemp -d /tmp/collgen-compare-raw.XXXXXX)

# main is the whole run (its body is not indented: it holds a here-document).
main() {
# gloo_bench.py takes a list of sizes; expand FROM-TO ranges (doubling).
sizes=$("$PY" - "$SIZES" <<'EOF'
import re, sys
units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
def size(s):
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", s.strip())
    return int(m.group(1)) * units[m.group(2) or "B"]
out = []
for part in sys.argv[1].split(","):
    lo, _, hi = part.partition("-")
    x, top = size(lo), size(hi or lo)
    while x <= top:
        out.append(str(x))
        x *= 2
print(",".join(out))
EOF
)

echo "== host: $(nproc) CPUs, $(uname -r), torch $("$PY" -c 'import torch; print(torch.__version__)')"
echo "== /dev/shm: $(df -h --output=size,avail /dev/shm | tail -1)"
# A CPU quota lowers Go's GOMAXPROCS below nproc, and with it the lanes
# and the spinning (docs/host-backend.md, "Lanes").
echo "== cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none), cpus allowed: $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)"
echo "== worlds $WORLDS, sizes $SIZES, $SWEEPS collgen sweeps per world"

start=$SECONDS
for w in $WORLDS; do
	# The host backend needs about w * 4 slots * slot bytes of /dev/shm; on
	# a small tmpfs (docker's default is 64 MiB) shrink the slots to fit
	# half of it.
	slot_args=()
	avail_kib=$(df -k --output=avail /dev/shm | tail -1 | tr -d ' ')
	if [ -n "${SLOT_BYTES:-}" ]; then
		slot_args=(--slot-bytes "$SLOT_BYTES")
	elif [ "$avail_kib" -lt $((w * 4 * 8 * 1024 * 2)) ]; then
		slot=$((avail_kib * 1024 / 2 / w / 4 / 4096 * 4096))
		echo "== small /dev/shm: using --slot-bytes $slot"
		slot_args=(--slot-bytes "$slot")
	fi
	echo "== world $w: gloo ($((SECONDS - start)) s)"
	"$PY" "$here/gloo_bench.py" bench --world "$w" --sizes "$sizes" --seconds "$GLOO_SECONDS" --out "$raw/gloo-w$w.json"
	for s in $(seq 1 "$SWEEPS"); do
		echo "== world $w: collgen sweep $s of $SWEEPS ($((SECONDS - start)) s)"
		check=()
		[ "$s" = 1 ] && check=(--check) # results are verified once per world
		"$COLLGEN" bench --backend host -n "$w" --sizes "$SIZES" --dtype f32 --op sum --collective allreduce \
			"${check[@]}" --baseline "$raw/gloo-w$w.json" --json "$raw/host-w$w-s$s.json" "${slot_args[@]}" \
			> "$raw/host-w$w-s$s.txt"
	done
	cat "$raw/host-w$w-s$SWEEPS.txt"
done

echo "== memcpy ($((SECONDS - start)) s)"
"$PY" "$here/gloo_bench.py" memcpy --out "$raw/memcpy.json"

echo "== summary ($((SECONDS - start)) s; table in $OUT/table.md)"
"$PY" "$here/gloo_bench.py" report --gloo "$raw"/gloo-w*.json --host "$raw"/host-w*-s*.json --sweeps "$SWEEPS" \
	--stability "$STABILITY" --max-us "$MAX_US" --memcpy "$raw/memcpy.json" --out "$OUT/table.md" \
	--title "collgen host backend vs gloo, f32 sum all-reduce, $SWEEPS sweeps per world, medians in us: $(date -u +%F), $(nproc) CPUs ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)), torch $("$PY" -c 'import torch; print(torch.__version__)')"
}

# Everything printed also goes to compare.log; whatever happens, the raw
# results end up in $OUT/raw.tgz.
set +e
(set -e; main) 2>&1 | tee "$OUT/compare.log"
rc=${PIPESTATUS[0]}
tar czf "$OUT/raw.tgz" -C "$raw" . && rm -rf "$raw"
exit "$rc"
