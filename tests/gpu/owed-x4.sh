#!/usr/bin/env bash
# The runs owed on nvidia-h200-x4 (issue 22's worlds 3 and 4, issue 16;
# docs/gpu-workflow.md, "When a 4-GPU machine is lent"), one step per
# device call in the order to run them, each bounded to fit the call's
# 600 s and leaving everything in $OUT/STEP.tgz. A session's 30 minutes
# hold the first three; numbers count only after both proof steps pass.
# Build where Go is (`make gpu-bundle`), carry what the step names, then
# on the machine, from the repository root:
#
#   tests/gpu/owed-x4.sh STEP
#
#   step              carry
#   proof-goroutines  .gpu/proof.test .gpu/collgen
#   proof-processes   .gpu/proof.test .gpu/collgen
#   bench             .gpu/collgen
#   groups            .gpu/symm.test .gpu/nccl.test .gpu/ipc.test .gpu/cuda.test .gpu/proof.test
#   peers             .gpu/collgen
#
# `tests/gpu/owed-x4.sh list` prints this table. Exit status: the step's
# (non-zero if any part failed, timed out or found a wrong result).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# shellcheck source=steps.sh
. "$(dirname "$0")/steps.sh"
owed_step "$0" "$@"
cd "$(dirname "$0")/../.." || exit 2
owed_begin owed-x4.sh "$STEP"
# need FILES...: the step's carry is here, and so are four GPUs.
need() {
  need_files "$@"
  local ngpu
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  [ "${ngpu:-0}" -ge 4 ] || { echo "owed-x4.sh: $STEP needs four GPUs, this machine has ${ngpu:-0}" >&2; exit 2; }
}
export COLLGEN_CACHE_DIR=$R/cache

case $STEP in
  proof-goroutines)
    # Every world-3 and world-4 kernel, goroutine ranks (NVRTC), the
    # windows meeting and zero-copy included: 209 s plus TestProofWindows'
    # 150 s on 2026-11-22.
    need .gpu/proof.test .gpu/collgen
    OUT=$R/proof PROOF_WORLDS=3,4 PROOF_ONLY='*_w[34]' PROOF_PARTS=goroutines GOROUTINE_TIMEOUT=560 \
      tests/proof/run.sh >"$R/proof.log" 2>&1
    part $? proof
    ;;
  proof-processes)
    need .gpu/proof.test .gpu/collgen
    OUT=$R/proof PROOF_WORLDS=3,4 PROOF_ONLY='*_w[34]' PROOF_PARTS=processes FATBIN_ARCHS=sm_90 \
      FATBIN_TIMEOUT=150 PROCESS_TIMEOUT=190 tests/proof/run.sh >"$R/proof.log" 2>&1
    part $? proof
    ;;
  bench)
    # Issue 22's tables: every algorithm, auto and NCCL at worlds 4 and 3,
    # process per GPU, each size with its one-element-short twin and
    # pointers one element off (--awkward=both), every row --check'ed;
    # the CSVs feed `collgen tune --from w4.csv --from w3.csv` where Go is.
    need .gpu/collgen
    OUT=$R/bench WORLDS="4 3" SIZES=1KiB..256MiB:x4 EXTRA="--processes --awkward=both" PER_WORLD_TIMEOUT=280 \
      tests/gpu/bench.sh >"$R/bench.txt" 2>&1
    part $? bench
    ;;
  groups)
    # The runtime's group and fault tests at worlds 4 and 3 (symmetric
    # memory, NCCL, IPC, peer access, the proof's fault tests).
    need .gpu/symm.test .gpu/nccl.test .gpu/ipc.test .gpu/cuda.test .gpu/proof.test
    OUT=$R/groups WORLDS="4 3" BUDGET=570 tests/gpu/groups.sh >"$R/groups.log" 2>&1
    part $? groups
    ;;
  peers)
    # The topology as the runtime sees it (docs/topology.md), then the
    # README's world-4 table: collgen, NCCL, NCCL windows and PyTorch's
    # symmetric memory in one run.
    need .gpu/collgen
    timeout 60 .gpu/collgen topo >"$R/topo.txt" 2>&1
    part $? topo
    timeout 60 .gpu/collgen topo --spec >"$R/topo-spec.yaml" 2>&1
    part $? "topo --spec"
    OUT=$R WORLD=4 timeout 480 tests/gpu/peers.sh >"$R/peers.log" 2>&1
    part $? peers
    ;;
esac
exit $status
