#!/usr/bin/env bash
# Runs tests/gpu/loopback.cu (a generated collective kernel at world W, all
# W ranks on ONE GPU) over the programs of one or more kernel directories
# (by default the 2-byte ones: bf16 all-reduce and reduce-scatter, u16
# all-gather), interleaved, and reports per program and directory
# whether every result was right and the microseconds per collective,
# side by side in $OUT/loopback_table.txt (tests/gpu/loopback_table.py:
# the first directory over each other, per program and size).
# A check of the kernels' logic and local costs when no multi-GPU machine
# is lent; not the proof (docs/gpu-workflow.md, "One-GPU probes").
#
#   tests/gpu/loopback.sh                       # generated/cuda
#   tests/gpu/loopback.sh .gpu/gen_main .gpu/gen_branch
#
# Knobs: PROGRAMS (program names without .cu; default every all-reduce and
# reduce-scatter program of DTYPES and the all-gather ones of their sizes,
# in the first directory), DTYPES (default bf16; any of bf16 f16 f32), LOOPBACK_KIB (sizes,
# default 1,16,64,256,1024,4096), PASSES (default 1), OUT (default
# .gpu/out), NVCC. Exit status: non-zero if any program failed or did not
# build.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
OUT=${OUT:-.gpu/out}
PASSES=${PASSES:-1}
DIRS=("$@")
[ ${#DIRS[@]} -eq 0 ] && DIRS=(generated/cuda)
mkdir -p "$OUT"
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
if [ -z "${PROGRAMS:-}" ]; then
  globs=()
  for t in ${DTYPES:-bf16}; do
    globs+=("allreduce_*_${t}_w*.cu" "reduce_scatter_*_${t}_w*.cu")
    case $t in f32) globs+=("allgather_*_u32_w*.cu") ;; *) globs+=("allgather_*_u16_w*.cu") ;; esac
  done
  PROGRAMS=$(cd "${DIRS[0]}" && ls ${globs[@]} | sort -u | sed 's/\.cu$//' | tr '\n' ' ')
fi
status=0
# Build every (directory, program) in parallel: world from the name, block
# size from the kernel's __launch_bounds__.
jobs=()
for d in "${DIRS[@]}"; do
  for p in $PROGRAMS; do
    w=${p##*_w}
    case $p in reduce_scatter_*) coll=1 ;; allgather_*) coll=2 ;; *) coll=0 ;; esac
    case $p in *_lamport_*) proto=3 ;; *_ll128_*) proto=2 ;; *_ll_*) proto=1 ;; *) proto=0 ;; esac
    case $p in *_f16_*) dtype=1 ;; *_f32_* | *_u32_*) dtype=2 ;; *) dtype=0 ;; esac
    th=$(grep -o '__launch_bounds__([0-9]*)' "$d/$p.cu" | head -1 | tr -dc '0-9')
    tag=$(echo "$d" | tr '/' '_')
    "$NVCC" -O3 -arch=sm_90 -std=c++17 -I"$d" -DWORLD="$w" -DTHREADS="$th" -DCOLL="$coll" -DPROTO="$proto" -DDTYPE="$dtype" \
      -DKFILE="\"$p.cu\"" -DKNAME="$p" -o "$BIN/$tag.$p" tests/gpu/loopback.cu >"$BIN/$tag.$p.log" 2>&1 &
    jobs+=($!)
    if [ ${#jobs[@]} -ge 16 ]; then wait "${jobs[0]}"; jobs=("${jobs[@]:1}"); fi
  done
done
wait
: >"$OUT/loopback.txt"
for pass in $(seq "$PASSES"); do
  for p in $PROGRAMS; do
    for d in "${DIRS[@]}"; do
      tag=$(echo "$d" | tr '/' '_')
      echo "== pass $pass $d $p" >>"$OUT/loopback.txt"
      if [ ! -x "$BIN/$tag.$p" ]; then
        echo "build failed:" >>"$OUT/loopback.txt"
        head -20 "$BIN/$tag.$p.log" >>"$OUT/loopback.txt"
        status=1
        continue
      fi
      timeout 300 "$BIN/$tag.$p" >>"$OUT/loopback.txt" 2>&1
      rc=$?
      [ $rc -ne 0 ] && { status=1; echo "exit $rc" >>"$OUT/loopback.txt"; }
    done
  done
done
if command -v python3 >/dev/null; then
  python3 tests/gpu/loopback_table.py "$OUT/loopback.txt" >"$OUT/loopback_table.txt" || status=1
fi
echo "loopback: $(grep -c '^ok' "$OUT/loopback.txt") ok, $(grep -c '^exit\|^build failed' "$OUT/loopback.txt") failed; $OUT/loopback.txt"
exit $status
