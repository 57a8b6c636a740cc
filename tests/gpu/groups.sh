#!/usr/bin/env bash
# The runtime's multi-GPU group and fault tests in one command: symmetric
# memory's group tests (at each of WORLDS), NCCL (collectives,
# registration, windows, bounded init, abort), IPC, CUDA peer access, and
# the proof's NCCL registration and window, abort, peer-fault,
# recycled-region, timeout, refusal, debug-check, mixed-protocol and
# world-1 tests. On a one-GPU machine every rank shares GPU 0
# (COLLGEN_TEST_SHARE_GPU=1; the tests of NCCL groups skip there, NCCL at
# one rank runs). Build the bundle where Go is:
#
#   make gpu-bundle GPU_TEST_PKGS="./runtime/symm ./runtime/nccl ./runtime/ipc ./runtime/cuda ./tests/proof"
#
# then on the GPU machine, from the repository root:
#
#   OUT=/some/dir tests/gpu/groups.sh
#
# Writes one log per binary (and per world for symm) and summary.txt to
# $OUT. Knobs: WORLDS (symm's worlds; default 2 3 4 on one GPU, else the
# GPU count), SYMM_SKIP and PROOF_SKIP (-test.skip patterns for symm's and
# the proof's tests), T (seconds per binary, 150), BUDGET and DEADLINE
# (below). Exit status: non-zero if any binary failed or was skipped.
#
# Time: the script ends within BUDGET seconds (default 570, under the
# device tool's 600 s a call), or by DEADLINE (seconds since the epoch)
# when that is set, as mps.sh sets it. Seven binaries at T each (ten with
# WORLDS="2 3 4") would take far longer, so each binary gets T or what is
# left before the deadline less 7 s, whichever is less: it is sent TERM at
# its limit (after Go's -test.timeout, 5 s sooner, has printed the stacks)
# and KILL 5 s later, so it has ended 2 s before the deadline, leaving time
# for the summary. A binary that would get less than MIN_STEP seconds (20)
# is not started: summary.txt says "skipped" and how much time was left,
# and the exit status is non-zero. A binary stopped at its limit is
# "timed out" there.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEADLINE=${DEADLINE:-$(( $(date +%s) + ${BUDGET:-570} ))}
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-.gpu/out}
T=${T:-150}
MIN_STEP=${MIN_STEP:-20}
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export COLLGEN_CACHE_DIR=$TMP/cache # never touch a real user cache
ngpu=$(timeout -k 2 20 nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ngpu" -le 1 ]; then
  export COLLGEN_TEST_SHARE_GPU=1
  WORLDS=${WORLDS:-2 3 4}
else
  WORLDS=${WORLDS:-$ngpu}
fi
. tests/gpu/steps.sh # (the repository root is the working directory)
status=0
: >"$OUT/summary.txt"
# run NAME BINARY ARGS...: one test binary, its log, its summary lines;
# within min(T, time left before DEADLINE - 7) seconds, or skipped.
run() {
  local name=$1 start limit rc note
  shift
  start=$(date +%s)
  limit=$(step_limit "$DEADLINE" "$T" "$MIN_STEP" "$name" "$OUT/summary.txt") || { status=1; return; }
  timeout -k 5 "$limit" "$@" -test.v -test.count=1 -test.timeout="$(( limit - 5 ))s" >"$OUT/$name.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note=$(timeout_note $rc "$limit" "$OUT/$name.log")
  {
    echo "== $name: exit $rc after $(( $(date +%s) - start ))s$note"
    grep -E '^ *--- (FAIL|SKIP)|^(ok|FAIL|PASS)$' "$OUT/$name.log"
    grep -cE '^ *--- PASS' "$OUT/$name.log" | sed 's/^/passed: /'
  } >>"$OUT/summary.txt"
}
for w in $WORLDS; do
  export COLLGEN_TEST_WORLD=$w
  run "symm-w$w" .gpu/symm.test -test.run CUDA ${SYMM_SKIP:+-test.skip "$SYMM_SKIP"}
done
unset COLLGEN_TEST_WORLD
run nccl .gpu/nccl.test
run ipc .gpu/ipc.test
run cuda-peer .gpu/cuda.test -test.run 'TestPeerAccess'
run proof .gpu/proof.test -test.run 'TestNCCLRegistrationGPU|TestNCCLAllocWindowsGPU|TestAbortGPU|TestAbortOneRankGPU|TestPeerFaultGPU|TestRecycledRegionGPU|TestTimeoutReported|TestMismatchReportedGPU|TestForcedAlgorithmRefused|TestDebugCheckGPU|TestMixedProtocols|TestWorldOneGPU|TestLazyKernelsSharedGPU|TestWorkQueuesGPU|TestAbortQueuesGPU|TestAbortDuringCloseGPU|TestCloseWhilePeerWaitsGPU|TestNewWhilePeerWaitsGPU|TestNCCLFirstCallAbsentPeerGPU|TestBackToBackGPU|TestStackReservedGPU' ${PROOF_SKIP:+-test.skip "$PROOF_SKIP"}
cat "$OUT/summary.txt"
exit $status
