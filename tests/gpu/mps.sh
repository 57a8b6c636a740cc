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
# non-zero if any test failed.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/out/mps}
mkdir -p "$OUT"
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  echo "mps.sh: no nvidia-cuda-mps-control on this machine" >&2
  exit 1
fi
unset CUDA_DEVICE_MAX_CONNECTIONS
export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
nvidia-cuda-mps-control -d || { echo "mps.sh: the MPS control daemon did not start" >&2; exit 1; }
trap 'echo quit | nvidia-cuda-mps-control; sleep 1; cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$OUT"/ 2>/dev/null; rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"' EXIT
ls -l "$CUDA_MPS_PIPE_DIRECTORY" >"$OUT/pipes.txt"
status=0
CUDA_DEVICE_MAX_CONNECTIONS=32 OUT=$OUT/goroutines WORLDS="2 4" SYMM_SKIP='TestCUDAProcessRanks|TestCUDAKilledRank' \
  PROOF_SKIP=TestPeerFaultGPU tests/gpu/groups.sh || status=1
[ "$(nvidia-smi -L | wc -l)" -le 1 ] && export COLLGEN_TEST_SHARE_GPU=1
for w in ${PROCESS_WORLDS:-2 4 8}; do
  COLLGEN_TEST_WORLD=$w timeout 200 .gpu/symm.test -test.v -test.count=1 -test.run 'TestCUDAProcessRanks|TestCUDAKilledRank' \
    >"$OUT/processes-w$w.log" 2>&1 || status=1
  { echo "== symm process ranks, world $w, the variable unset"; grep -E '^ *--- |^(ok|FAIL|PASS)$' "$OUT/processes-w$w.log"; } >>"$OUT/summary.txt"
done
cat "$OUT/goroutines/summary.txt" >>"$OUT/summary.txt"
exit $status
