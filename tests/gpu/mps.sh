#!/usr/bin/env bash
# The group and fault tests with every process a client of an MPS server
# (reliability case 36), under an MPS control daemon of its own (its pipes
# in a temporary directory) for the length of the run:
#
#  1. tests/gpu/groups.sh at symm worlds 2 and 4 with
#     CUDA_DEVICE_MAX_CONNECTIONS=32, which goroutine ranks sharing a GPU
#     need (case 34; collgen leaves the variable unset under MPS), but
#     without symm's process-rank tests: MPS clients share one pool of
#     work queues, and at 32 each only three processes fit on an H100;
#     Nor TestPeerFaultGPU: a peer process SIGKILLed while the survivor's
#     LL kernel writes into its memory faults the MPS server and every
#     client on the GPU until the server restarts (case 37);
#  2. symm's process-rank tests at worlds 2, 4 and 8 (up to nine client
#     processes on the GPU) with the variable unset, as collgen leaves it.
#
# Run from the repository root on a GPU machine with groups.sh's bundle:
#
#   OUT=/some/dir tests/gpu/mps.sh
#
# Writes the logs, summary.txt and the daemon's logs to $OUT. Exit status:
# non-zero if any test failed or was skipped.
#
# Time: the script ends within BUDGET seconds (default 570, under the
# device tool's 600 s a call), or by DEADLINE (seconds since the epoch)
# when that is set. groups.sh (T, 150 s, a binary: six binaries) and three
# process worlds at 200 s each would take far longer, so:
#  - starting the daemon and nvidia-smi are bounded (22 s each), and so is
#    stopping the daemon at exit (10 s; a faulted MPS server can hang
#    there), for which the last 15 s before the deadline are kept;
#  - groups.sh gets the deadline less RESERVE s a process world (60: they
#    take seconds when they pass, about 35 when a rank cannot join), so
#    the process worlds are reached even when groups.sh runs out its time;
#    groups.sh says in its summary what it skipped;
#  - each process world gets PROCESS_T s (200) or what is left before the
#    deadline less 15 + 7 s, whichever is less (TERM at the limit, after
#    Go's -test.timeout 5 s sooner, KILL 5 s later); one that would get
#    less than MIN_STEP s (20) is skipped and reported in summary.txt.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEADLINE=${DEADLINE:-$(( $(date +%s) + ${BUDGET:-570} ))}
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-.gpu/out/mps}
PROCESS_WORLDS=${PROCESS_WORLDS:-2 4 8}
PROCESS_T=${PROCESS_T:-200}
RESERVE=${RESERVE:-60}
MIN_STEP=${MIN_STEP:-20}
END=$(( DEADLINE - 15 )) # the steps' deadline: the exit trap has the rest
mkdir -p "$OUT"
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  echo "mps.sh: no nvidia-cuda-mps-control on this machine" >&2
  exit 1
fi
unset CUDA_DEVICE_MAX_CONNECTIONS
CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d)
CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
timeout -k 2 20 nvidia-cuda-mps-control -d || { echo "mps.sh: the MPS control daemon did not start" >&2; exit 1; }
trap 'echo quit | timeout -k 2 8 nvidia-cuda-mps-control; sleep 1; cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$OUT"/ 2>/dev/null; rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"' EXIT
ls -l "$CUDA_MPS_PIPE_DIRECTORY" >"$OUT/pipes.txt"
. tests/gpu/steps.sh # (the repository root is the working directory)
status=0
: >"$OUT/summary.txt"
nworlds=$(wc -w <<<"$PROCESS_WORLDS")
CUDA_DEVICE_MAX_CONNECTIONS=32 OUT=$OUT/goroutines WORLDS="2 4" SYMM_SKIP='TestCUDAProcessRanks|TestCUDAKilledRank' \
  PROOF_SKIP=TestPeerFaultGPU DEADLINE=$(( END - RESERVE * nworlds )) MIN_STEP=$MIN_STEP tests/gpu/groups.sh || status=1
[ "$(timeout -k 2 20 nvidia-smi -L | wc -l)" -le 1 ] && export COLLGEN_TEST_SHARE_GPU=1
for w in $PROCESS_WORLDS; do
  start=$(date +%s)
  limit=$(step_limit "$END" "$PROCESS_T" "$MIN_STEP" "symm process ranks, world $w" "$OUT/summary.txt") || { status=1; continue; }
  COLLGEN_TEST_WORLD=$w timeout -k 5 "$limit" .gpu/symm.test -test.v -test.count=1 -test.timeout="$(( limit - 5 ))s" \
    -test.run 'TestCUDAProcessRanks|TestCUDAKilledRank' >"$OUT/processes-w$w.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  note=$(timeout_note $rc "$limit" "$OUT/processes-w$w.log")
  { echo "== symm process ranks, world $w, the variable unset: exit $rc after $(( $(date +%s) - start ))s$note"
    grep -E '^ *--- |^(ok|FAIL|PASS)$' "$OUT/processes-w$w.log"; } >>"$OUT/summary.txt"
done
cat "$OUT/goroutines/summary.txt" >>"$OUT/summary.txt"
exit $status
