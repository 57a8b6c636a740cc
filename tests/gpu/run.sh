#!/usr/bin/env bash
# Runs collgen's GPU test bundle on a GPU machine (no Go needed there).
# Build the bundle first where Go is: `make gpu-bundle` (.gpu/*.test and
# .gpu/collgen). Then, from the repository root on the GPU machine:
#
#   tests/gpu/run.sh            # logs to $OUT (default .gpu/out)
#
# Logs: env.log (machine, libraries, nvcc fatbin build), abi.log
# (tests/gpu/abi_check.c against the real headers), one <pkg>.log per test
# binary, bench.log, summary.txt: 10 files with make gpu-bundle's binaries,
# more than the device tool brings back (8), so with it set OUT to a
# directory under /tmp and tar that into the tool's $OUT.
# proof.test is not run here: tests/proof/run.sh runs the proof and
# tests/gpu/groups.sh its group and fault tests (longer than one binary's
# PER_TEST_TIMEOUT).
# Knobs: OUT, PER_TEST_TIMEOUT (s, default 120), RUN_SERIAL_BENCH (1/0),
# COLLGEN_CUDA_DIR (kernel set for the benchmarks).
# Exit status: non-zero if any test binary failed.
set -uo pipefail

# NVLink multicast stays off: it can take the host's shared GPUs down.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/out}
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export COLLGEN_CACHE_DIR="$TMP/cache" # never touch a real user cache
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PER_TEST_TIMEOUT=${PER_TEST_TIMEOUT:-120}

{
  echo "== date"; date -u
  echo "== nvidia-smi"; nvidia-smi 2>&1 | head -30
  echo "== topology"; nvidia-smi topo -m 2>&1 | head -12
  echo "== libraries"; ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvrtc|libnccl' | head -20
  ls "$CUDA_HOME"/lib64/libnvrtc* 2>&1 | head
  echo "== nccl.h"; grep -hE '#define NCCL_(MAJOR|MINOR|PATCH)|ncclFloat8e' /usr/include/nccl.h /usr/local/include/nccl.h 2>/dev/null | head
  echo "== nvcc"; "$CUDA_HOME"/bin/nvcc --version 2>&1 | tail -2
  echo "== collgen"; [ -x .gpu/collgen ] && .gpu/collgen --help 2>&1 | head -20
  echo "== fatbin of the test kernels (nvcc)"
  if "$CUDA_HOME"/bin/nvcc -std=c++17 -fatbin -gencode arch=compute_90,code=sm_90 \
      -I runtime/cuda/testdata -o "$TMP/test_kernels.fatbin" runtime/cuda/testdata/test_kernels.cu; then
    export COLLGEN_TEST_FATBIN="$TMP/test_kernels.fatbin"
    ls -l "$COLLGEN_TEST_FATBIN"
  else
    echo "nvcc fatbin build failed; TestFatbin will skip its fatbin half"
  fi
} >"$OUT/env.log" 2>&1

{
  echo "== gcc -I$CUDA_HOME/include tests/gpu/abi_check.c"
  gcc -std=gnu11 -I"$CUDA_HOME/include" tests/gpu/abi_check.c -o "$TMP/abi_check" && "$TMP/abi_check"
  echo "abi_check exit: $?"
} >"$OUT/abi.log" 2>&1

status=0
: >"$OUT/summary.txt"
for bin in .gpu/*.test; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin" .test)
  if [ "$name" = proof ]; then
    echo "== proof: not run here (tests/proof/run.sh, tests/gpu/groups.sh)" >>"$OUT/summary.txt"
    continue
  fi
  echo "== $bin" >"$OUT/$name.log"
  # topo.test: only the test that needs the machine's NVML; its other tests
  # are CPU tests (CI runs them) that read testdata relative to the package.
  only=()
  [ "$name" = topo ] && only=(-test.run 'TestRealMachine')
  timeout "$PER_TEST_TIMEOUT" "$bin" -test.v -test.count=1 -test.timeout="$((PER_TEST_TIMEOUT - 10))s" "${only[@]}" >>"$OUT/$name.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  {
    echo "== $name: exit $rc"
    grep -E '^(--- |ok|FAIL|PASS)' "$OUT/$name.log"
  } >>"$OUT/summary.txt"
done

# Benchmarks: the generated kernel set if present, else the test kernels.
if [ -x .gpu/cuda.test ]; then
  if [ -z "${COLLGEN_CUDA_DIR:-}" ]; then
    if [ -d generated/cuda ]; then COLLGEN_CUDA_DIR=generated/cuda; else COLLGEN_CUDA_DIR=runtime/cuda/testdata; fi
  fi
  export COLLGEN_CUDA_DIR
  # NVRTC 13.0 rejects __builtin_offsetof (generated layout asserts): strip
  # those lines for the benchmark only, and say so in the log.
  if grep -qs __builtin_offsetof "$COLLGEN_CUDA_DIR"/*.cuh; then export COLLGEN_BENCH_STRIP_OFFSETOF=1; fi
  {
    echo "== kernel set: $COLLGEN_CUDA_DIR ($(ls "$COLLGEN_CUDA_DIR"/*.cu | wc -l) .cu files), strip offsetof: ${COLLGEN_BENCH_STRIP_OFFSETOF:-0}"
    echo "== warm (cached) load of the set, 10 iterations"
    timeout 120 .gpu/cuda.test -test.run='^$' -test.bench='WarmLoad' -test.benchtime=10x -test.v 2>&1
    echo "== cold NVRTC compile of the set, one goroutine per CPU"
    timeout 120 .gpu/cuda.test -test.run='^$' -test.bench='NVRTCCompileParallel' -test.benchtime=1x 2>&1
    if [ "${RUN_SERIAL_BENCH:-1}" = 1 ]; then
      echo "== cold NVRTC compile of the set, serial"
      timeout 200 .gpu/cuda.test -test.run='^$' -test.bench='NVRTCCompile$' -test.benchtime=1x 2>&1
    fi
  } >"$OUT/bench.log" 2>&1
  grep -E '^(Benchmark|--- |ok|FAIL)' "$OUT/bench.log" | sed 's/^/bench: /' >>"$OUT/summary.txt"
fi

# Symmetric memory: stream-ordered signals replayed from CUDA graphs on two
# GPUs (barrier and put/wait round trips), appended to bench.log.
if [ -x .gpu/symm.test ]; then
  {
    echo "== symm: signal round trips inside a CUDA graph (2 GPUs; flag floor 1.48 us)"
    timeout 120 .gpu/symm.test -test.run='^$' -test.bench='CUDASignalGraph' -test.benchtime=200x -test.v 2>&1
  } >>"$OUT/bench.log" 2>&1
  grep -E 'CUDASignalGraph|us per round trip' "$OUT/bench.log" | sed 's/^/bench: /' >>"$OUT/summary.txt"
fi

cat "$OUT/summary.txt"
exit $status
