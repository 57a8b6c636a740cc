#!/usr/bin/env bash
# Cold start on a GPU machine (no Go needed there): how long until the
# kernels are ready, on an empty NVRTC cache, a warm one, and a fatbin;
# and what each kernel costs NVRTC. Build the bundle first where Go is
# (`make gpu-bundle`), then from the repository root on the GPU machine:
#
#   tests/gpu/coldstart.sh       # logs to $OUT (default .gpu/coldstart)
#
# Steps (each under its own timeout, all within BUDGET):
#  1. goroutine ranks, world $WORLD: New to ready, empty cache then warm
#     (proof.test TestColdStart; warm must compile nothing)
#  2. process ranks (collgen run -n $WORLD), empty cache then warm
#     (proof.test TestColdStartProcess; ranks share the compiles through
#     the cache's lock files)
#  3. NVRTC cost of the whole kernel set (cuda.test): one empty kernel
#     with the headers; the set on one goroutine per CPU with the first
#     option set of OPTION_SETS (sum-ms/set stands in for the serial cost;
#     the log breaks it down by world size and algorithm and lists the
#     slowest files); the warm load of the set, and of each world size's
#     kernels alone (what a warm New loads)
#  4. fatbin: nvcc builds the kernels of world $WORLD for this GPU
#     (tests/cuda/fatbin.sh), then process ranks load it (New to ready);
#     and New with a fatbin lacking the GPU's architecture must fail
#     naming it (TestFatbinWithoutDeviceArch)
#  then the parallel compile with the other option sets, and (SERIAL=1)
#  the serial compile of the whole set
# NVRTC 12.9 and later keep their own cache of front-end and ptxas
# output in the driver's compute cache (CUDA_CACHE_PATH, default
# ~/.nv/ComputeCache): a program compiled once on a machine compiles again
# in a fraction of the time. Every compiling step here therefore gets a
# fresh, empty CUDA_CACHE_PATH of its own, so its figure is cold however
# many compiles ran on the machine before (docs/cold-start.md).
# Files: coldstart.log (everything), summary.txt (the figures).
# Knobs: OUT, BUDGET (seconds for the whole script, 280), WORLD (2), OPTION_SETS (';'-separated NVRTC option lists;
# default: none, -default-device, -pch, -minimal, --Ofast-compile=min:
# the last changes code, so it needs tests/gpu/bench.sh too), SERIAL (1: also the
# serial compile of the whole set, with SERIAL_OPTIONS, default -minimal), FATBIN (0: skip step 4), SAME_CODE (NVRTC options, e.g.
# -minimal: compile every kernel with and without them and fail on an image that differs).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/coldstart}
WORLD=${WORLD:-2}
OPTION_SETS=${OPTION_SETS:-";-default-device;-pch;-minimal;--Ofast-compile=min"}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$OUT"
LOG="$OUT/coldstart.log"
BUDGET=${BUDGET:-280} # seconds for the whole script; later steps are skipped past it
TMP=$(mktemp -d)
summary() {
  grep -E 'coldstart:|^(Benchmark|fatbin:|FAILED|SKIPPED|--- FAIL|== 3)|coldstart_test.go.*rank [0-9]: |compile time by group|slow: |images (identical|differ)' "$LOG" | sed 's/^ *//' >"$OUT/summary.txt"
  rm -rf "$TMP"
}
trap summary EXIT
unset COLLGEN_FATBIN
for b in .gpu/proof.test .gpu/cuda.test .gpu/collgen; do
  [ -x "$b" ] || { echo "coldstart.sh: $b is missing; run make gpu-bundle" | tee "$LOG" >&2; exit 2; }
done
status=0
step() { echo "== $*" | tee -a "$LOG"; }
try() { # try TIMEOUT CMD...: log the output; say and return a failure
  local t=$1 rc=0 left=$((BUDGET - SECONDS)); shift
  if [ "$left" -lt 10 ]; then echo "SKIPPED (budget of ${BUDGET}s spent): $*" | tee -a "$LOG"; return 1; fi
  [ "$t" -gt "$left" ] && t=$left
  timeout "$t" "$@" >>"$LOG" 2>&1 || rc=$?
  [ $rc -eq 0 ] || echo "FAILED (exit $rc): $*" | tee -a "$LOG"
  return $rc
}
run() { try "$@" || status=1; } # as try, and the script fails
fresh() { # fresh NAME: an empty NVRTC (driver compute) cache for the next step
  export CUDA_CACHE_PATH="$TMP/nvrtc-cache-$1"
}
{
  echo "== date"; date -u
  nvidia-smi -L; nproc
  ls "$CUDA_HOME"/lib64/libnvrtc.so* 2>&1 | head -3
} >"$LOG" 2>&1

export COLDSTART=1 COLDSTART_WORLD=$WORLD
step "1. goroutine ranks, world $WORLD: New to ready, cold then warm cache"
fresh goroutine
run 120 .gpu/proof.test -test.v -test.count=1 -test.run '^TestColdStart$'

step "2. process ranks, world $WORLD: New to ready, cold then warm cache"
export COLLGEN_CACHE_DIR="$TMP/proc-cache"
fresh process
for phase in cold warm; do
  run 120 env COLDSTART_PHASE=$phase .gpu/collgen run -n "$WORLD" -- .gpu/proof.test -test.count=1 -test.run '^TestColdStartProcess$'
done

step "3. NVRTC cost of the kernel set (generated/cuda)"
export COLLGEN_CUDA_DIR=generated/cuda COLLGEN_CACHE_DIR="$TMP/bench-cache"
run 60 .gpu/cuda.test -test.run '^$' -test.bench 'NVRTCHeaderOnly' -test.benchtime 5x
IFS=';' read -ra sets <<<"$OPTION_SETS"
sets_run=0
options() { # options SET...: the parallel cold compile with each option set
  local opts
  for opts in "$@"; do
    step "3. parallel cold compile, options: '${opts}'"
    sets_run=$((sets_run + 1)); fresh "parallel-$sets_run"
    # an option this NVRTC lacks fails its set only
    try 90 env COLLGEN_NVRTC_OPTIONS="$opts" .gpu/cuda.test -test.run '^$' -test.bench 'NVRTCCompileParallel' -test.benchtime 1x -test.v
  done
}
options "${sets[0]:-}"
run 90 .gpu/cuda.test -test.run '^$' -test.bench 'WarmLoad' -test.benchtime 10x

if [ "${FATBIN:-1}" = 1 ]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
  step "4. fatbin of the world-$WORLD kernels for sm_$arch (nvcc), then process ranks load it"
  if try 150 env ONLY="*_w$WORLD" FATBIN_ARCHS="sm_$arch" NVCC="$CUDA_HOME/bin/nvcc" tests/cuda/fatbin.sh generated/cuda "$TMP/w$WORLD.fatbin"; then
    run 60 env COLLGEN_FATBIN="$TMP/w$WORLD.fatbin" COLLGEN_CACHE_DIR="$TMP/unused-cache" COLDSTART_PHASE=fatbin \
      .gpu/collgen run -n "$WORLD" -- .gpu/proof.test -test.count=1 -test.run '^TestColdStartProcess$'
  else
    status=1
  fi
  run 60 .gpu/proof.test -test.v -test.count=1 -test.run '^TestFatbinWithoutDeviceArch$'
  step "4. a fatbin lacking kernels (the world-2 LL one-shots only) names itself"
  if try 90 env ONLY='allreduce_oneshot_ll_*_w2' FATBIN_ARCHS="sm_$arch" NVCC="$CUDA_HOME/bin/nvcc" tests/cuda/fatbin.sh generated/cuda "$TMP/partial.fatbin"; then
    run 60 env COLLGEN_TEST_SHARE_GPU=1 COLLGEN_TEST_WORLD=2 COLLGEN_TEST_PARTIAL_FATBIN="$TMP/partial.fatbin" .gpu/proof.test -test.v -test.count=1 -test.run '^TestFatbinLacksKernel$'
  else
    status=1
  fi
fi

options "${sets[@]:1}"
if [ -n "${SAME_CODE:-}" ]; then
  step "3. same code with and without NVRTC options '$SAME_CODE'"
  run 120 env COLLGEN_SAME_CODE_OPTIONS="$SAME_CODE" .gpu/cuda.test -test.run '^TestNVRTCOptionsSameCode$' -test.v
fi
if [ "${SERIAL:-0}" = 1 ]; then
  step "3. serial cold compile of the set"
  fresh serial
  # with comm's options (-minimal where NVRTC has it; COLLGEN_NVRTC_OPTIONS to try others)
  run 300 env COLLGEN_NVRTC_OPTIONS="${SERIAL_OPTIONS--minimal}" .gpu/cuda.test -test.run '^$' -test.bench 'NVRTCCompile$' -test.benchtime 1x
fi

summary
trap - EXIT
cat "$OUT/summary.txt"
exit $status
