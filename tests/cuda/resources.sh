#!/usr/bin/env bash
# Lists what each generated kernel's entry function uses on the GPU, as
# ptxas reports it (`nvcc --resource-usage`): registers per thread, stack
# frame and spill bytes. The runtime compiles with NVRTC, whose ptxas is
# the one of the same CUDA release, so run this with that release's nvcc
# (the GPU machines have CUDA 13.0; CI's Debian nvcc is 11.8, and
# allocates registers differently) to know what the kernels that run
# spill. Spills are local-memory traffic in the hot loops: a kernel that
# spills is the first place to look when it is slower than expected.
# Usage: tests/cuda/resources.sh [cuda-dir] [glob]   (JOBS: parallel
# compiles, default nproc; ARCH: default sm_90)
# Output: $RES_OUT (default: a fresh directory under $TMPDIR, named at the
# end): usage.txt, "program registers stack_bytes spill_store_bytes
# spill_load_bytes" per kernel, sorted by name; spills.txt, the lines of
# usage.txt with spill stores or loads; nvcc.log, nvcc's version. A kernel
# that fails to compile, or whose entry function ptxas does not report,
# fails the script, naming it.
set -euo pipefail
dir=${1:-generated/cuda}
glob=${2:-*.cu}
NVCC=${NVCC:-nvcc}
ARCH=${ARCH:-sm_90}
JOBS=${JOBS:-$(nproc)}
command -v "$NVCC" >/dev/null || { echo "resources: $NVCC not found; install it with .ci/install-cuda.sh" >&2; exit 1; }
out=${RES_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/cuda-resources.XXXXXX")}
mkdir -p "$out/each"
export NVCC ARCH dir out
# one FILE: writes $out/each/NAME.txt, "NAME regs stack spill_st spill_ld".
one() {
  local f=$1 b log
  b=$(basename "$f" .cu)
  log=$out/each/$b.log
  if ! "$NVCC" -std=c++17 -arch="$ARCH" -I "$dir" -cubin -o /dev/null --resource-usage "$f" >"$log" 2>&1; then
    echo "resources: $b failed to compile:" >&2; cat "$log" >&2; return 1
  fi
  # ptxas prints, for the entry function NAME: "Compiling entry function
  # 'NAME'", "Function properties for NAME", then "S bytes stack frame,
  # T bytes spill stores, L bytes spill loads" and "Used R registers".
  awk -v k="$b" '
    $0 ~ "Function properties for " k "$" { p = 1; next }
    p == 1 && /bytes stack frame/ { st = $1; ss = $5; sl = $9; p = 2; next }
    p == 2 && /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1); p = 3 }
    END { if (p == 3) print k, r, st, ss, sl; else exit 1 }' "$log" >"$out/each/$b.txt" ||
    { echo "resources: ptxas reported no entry function '$b' (see $log)" >&2; return 1; }
}
export -f one
shopt -s nullglob
files=("$dir"/$glob)
[ ${#files[@]} -gt 0 ] || { echo "resources: no files match $dir/$glob" >&2; exit 1; }
"$NVCC" --version >"$out/nvcc.log" 2>&1 || true
printf '%s\n' "${files[@]}" | xargs -P "$JOBS" -I{} bash -c 'one "$1"' _ {}
cat "$out"/each/*.txt | sort >"$out/usage.txt"
awk '$4 > 0 || $5 > 0' "$out/usage.txt" >"$out/spills.txt"
echo "resources: ${#files[@]} kernels for $ARCH with $(grep -o 'release [0-9.]*' "$out/nvcc.log" | head -1 || echo 'nvcc'); $(wc -l <"$out/spills.txt") spill; in $out"
