#!/usr/bin/env bash
# The runs owed on nvidia-h200-x2 (docs/gpu-workflow.md, "Owed on
# nvidia-h200-x2"), one step per device call, each bounded to fit the
# call's 600 s and leaving everything in $OUT/STEP.tgz. Build where Go is
# first (the carry column), then on the machine, from the repository root:
#
#   tests/gpu/owed-x2.sh STEP
#
#   step              carry                                  builds (here)
#   peers             .gpu/collgen                           make gpu-bundle
#   max-blocks        .gpu/collgen .gpu/max-blocks           + tests/gpu/patch-bundle.sh tests/gpu/patches/max-blocks.patch
#   lamport           .gpu/lamport                           tests/gpu/patch-bundle.sh tests/gpu/patches/lamport.patch
#   nonblocking       .gpu/collgen                           make gpu-bundle
#   proof-goroutines  .gpu/proof.test .gpu/collgen           make gpu-bundle
#   proof-processes   .gpu/proof.test .gpu/collgen           make gpu-bundle
#   peers-why         .gpu/collgen                           make gpu-bundle
#   host-faults       .gpu/proof.test                        make gpu-bundle
#   ll128-grow        .gpu/collgen .gpu/ll128-grow           + tests/gpu/patch-bundle.sh tests/gpu/patches/ll128-grow.patch
#   abort-zc-proof    .gpu/abort-zc                          tests/gpu/patch-bundle.sh tests/gpu/patches/abort-zc.patch
#   abort-zc          .gpu/collgen .gpu/abort-zc             + tests/gpu/patch-bundle.sh tests/gpu/patches/abort-zc.patch
#
# `tests/gpu/owed-x2.sh list` prints this table. Exit status: the step's
# (non-zero if any part failed, timed out or found a wrong result).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# shellcheck source=steps.sh
. "$(dirname "$0")/steps.sh"
owed_step "$0" "$@"
cd "$(dirname "$0")/../.." || exit 2
owed_begin owed-x2.sh "$STEP"
need() { need_files "$@"; }
BENCH=(bench --backend gpu -n 2 --processes --dtype bf16 --op sum --check)
# patch_ab ONLY GOROUTINE_TIMEOUT RUN_TIMEOUT SIZES ALGORITHMS AWKWARD: a
# kernel patch's step (its bundle .gpu/$STEP): the world-2 proof of the
# kernels ONLY names, then the A/B of its all-reduce against main's
# collgen, interleaved (tests/gpu/ab.sh).
patch_ab() {
  need .gpu/collgen ".gpu/$STEP/collgen" ".gpu/$STEP/proof.test"
  OUT=$R/proof BUNDLE=.gpu/$STEP PROOF_WORLDS=2 PROOF_ONLY=$1 GOROUTINE_TIMEOUT=$2 PROCESS_TIMEOUT=90 \
    MULTIHOST_TIMEOUT=30 tests/proof/run.sh >"$R/proof.log" 2>&1
  part $? proof
  OUT=$R/ab RUN_TIMEOUT=$3 tests/gpu/ab.sh .gpu/collgen ".gpu/$STEP/collgen" -n 2 --processes \
    --dtype bf16 --op sum --check --collective allreduce --sizes "$4" --algorithms "$5" --awkward="$6" >"$R/ab.log" 2>&1
  part $? ab
}

case $STEP in
  peers)
    need .gpu/collgen
    OUT=$R timeout 580 tests/gpu/peers.sh >"$R/peers.log" 2>&1
    part $? peers
    ;;
  max-blocks)
    patch_ab 'allreduce_twoshot_ll128*_w2' 150 60 768KiB,896KiB,960KiB,1MiB,1088KiB,1152KiB,1536KiB,2MiB,4MiB,16MiB \
      auto,twoshot_ll128 both
    ;;
  ll128-grow)
    # The all-reduce's LL128 kernels compiled for 640 threads, their blocks
    # growing by warps above 128 blocks of 512 (docs/performance.md, "The
    # 1 MiB step"); the code changes at every size, so the A/B runs from
    # 256 KiB, both kernels forced beside auto.
    patch_ab 'allreduce_*_ll128_*_w2' 200 80 256KiB,512KiB,768KiB,960KiB,1MiB,1152KiB,1536KiB,2MiB,4MiB,8MiB,16MiB,64MiB \
      auto,oneshot_ll128,twoshot_ll128 offset
    ;;
  abort-zc-proof)
    # Reliability cases 35 and 12 (tests/gpu/patches/abort-zc.patch): a
    # wait that has lasted a millisecond reads Abort's host word, and a
    # barrier's flag carries whether its launch reads inputs in place.
    # Every kernel waits through the common header: the goroutine-rank
    # proof of every world-2 kernel of its bundle.
    need .gpu/abort-zc/proof.test .gpu/abort-zc/collgen
    OUT=$R/proof BUNDLE=.gpu/abort-zc PROOF_WORLDS=2 PROOF_PARTS=goroutines GOROUTINE_TIMEOUT=540 \
      tests/proof/run.sh >"$R/proof.log" 2>&1
    part $? proof
    ;;
  abort-zc)
    # Then its process-rank proof of every world-2 kernel (the multi-host
    # proof has none at world 2, one rank a host), the A/B against main's
    # collgen of the world-2 rules' algorithms and the barrier two-shot
    # beside auto (1 KiB to 64 MiB), and TestAbortQueuesGPU (early and
    # plain launches at 32, 8 and 1 work queues) and the mixed-mode test
    # with a GPU per rank.
    need .gpu/collgen .gpu/abort-zc/collgen .gpu/abort-zc/proof.test
    OUT=$R/proof BUNDLE=.gpu/abort-zc PROOF_WORLDS=2 PROOF_ONLY='*_w2' PROOF_PARTS=processes \
      PROCESS_TIMEOUT=180 tests/proof/run.sh >"$R/proof.log" 2>&1
    part $? proof
    OUT=$R/ab RUN_TIMEOUT=60 tests/gpu/ab.sh .gpu/collgen .gpu/abort-zc/collgen -n 2 --processes --dtype bf16 --op sum \
      --check --collective allreduce --sizes 1KiB,64KiB,1MiB,4MiB,16MiB,64MiB \
      --algorithms auto,oneshot_ll,oneshot_ll128,twoshot_ll128,oneshot,twoshot --awkward=both >"$R/ab.log" 2>&1
    part $? ab
    timeout 90 .gpu/abort-zc/proof.test -test.v -test.count=1 -test.run 'TestAbortQueuesGPU|TestZeroCopyMixGPU' >"$R/tests.log" 2>&1
    part $? "abort queues, zero-copy mix"
    ;;
  lamport)
    need .gpu/lamport/collgen .gpu/lamport/proof.test
    OUT=$R/proof BUNDLE=.gpu/lamport PROOF_WORLDS=2 PROOF_ONLY='*lamport*_w2' PROOF_PARTS=goroutines,processes \
      GOROUTINE_TIMEOUT=200 PROCESS_TIMEOUT=90 tests/proof/run.sh >"$R/proof.log" 2>&1
    part $? proof
    export COLLGEN_CACHE_DIR=$R/cache
    timeout 120 .gpu/lamport/collgen "${BENCH[@]}" --collective allreduce \
      --sizes 1KiB,16KiB,64KiB,256KiB,512KiB,768KiB,1MiB,2MiB,4MiB,8MiB --awkward=both \
      --algorithms auto,oneshot_ll,oneshot_ll128,twoshot_ll128,oneshot_lamport,twoshot_lamport \
      --json "$R/allreduce.json" >"$R/allreduce.txt" 2>&1
    part $? "bench allreduce"
    timeout 90 .gpu/lamport/collgen "${BENCH[@]}" --collective reduce_scatter \
      --sizes 1KiB,16KiB,64KiB,256KiB,1MiB,4MiB,8MiB --awkward=both \
      --algorithms auto,oneshot_ll,oneshot_ll128,oneshot_lamport \
      --json "$R/reduce_scatter.json" >"$R/reduce_scatter.txt" 2>&1
    part $? "bench reduce_scatter"
    ;;
  nonblocking)
    need .gpu/collgen
    export COLLGEN_CACHE_DIR=$R/cache
    B=(.gpu/collgen bench --backend gpu -n 2 --processes --dtype bf16 --op sum
       --collective "allreduce,reduce_scatter,allgather" --sizes 1KiB..256MiB:x4 --algorithms nccl --eager)
    for i in 1 2; do
      timeout 120 "${B[@]}" --json "$R/blocking$i.json" >"$R/blocking$i.txt" 2>&1
      part $? "blocking $i"
      timeout 120 "${B[@]}" --nccl-nonblocking --json "$R/nonblocking$i.json" >"$R/nonblocking$i.txt" 2>&1
      part $? "non-blocking $i"
    done
    ;;
  proof-goroutines)
    need .gpu/proof.test .gpu/collgen
    OUT=$R/proof PROOF_WORLDS=2 PROOF_PARTS=goroutines GOROUTINE_TIMEOUT=540 tests/proof/run.sh >"$R/proof.log" 2>&1
    part $? proof
    ;;
  proof-processes)
    need .gpu/proof.test .gpu/collgen
    OUT=$R/proof PROOF_WORLDS=2 PROOF_PARTS=processes,multihost FATBIN_ARCHS=sm_90 MULTIHOST_TIMEOUT=60 \
      tests/proof/run.sh >"$R/proof.log" 2>&1
    part $? proof
    ;;
  peers-why)
    # Why the NCCL-based peers time slower back to back than collgen bench
    # times NCCL (docs/gpu-workflow.md, "Owed on nvidia-h200-x2"). Suspect:
    # NCCL's graph mixing support (NCCL_GRAPH_MIXING_SUPPORT, on by
    # default) adds an external event wait and an event record on a side
    # stream to every captured collective. Each variant below changes one
    # thing; graph_gaps.py says whether the time is in NCCL's kernels or
    # between them.
    need .gpu/collgen
    export COLLGEN_CACHE_DIR=$R/cache
    A=tests/gpu/anchors S=1024,1048576,4194304
    for mix in default 0; do
      env=(); [ $mix = 0 ] && env=(NCCL_GRAPH_MIXING_SUPPORT=0)
      env "${env[@]}" timeout 90 python3 $A/graph_gaps.py "$R/gaps-mix$mix.json" 2 $S >"$R/gaps-mix$mix.txt" 2>&1
      part $? "graph gaps, mixing $mix"
      env "${env[@]}" ANCHOR_SIZES=$S timeout 90 python3 $A/nccl_window_bench.py "$R/win-mix$mix.json" 2 >"$R/win-mix$mix.txt" 2>&1
      part $? "nccl window, mixing $mix"
      env "${env[@]}" ANCHOR_SIZES=$S timeout 90 python3 $A/torch_anchor_bench.py "$R/torch-mix$mix.json" 2 >"$R/torch-mix$mix.txt" 2>&1
      part $? "torch, mixing $mix"
      env "${env[@]}" timeout 90 .gpu/collgen "${BENCH[@]}" --collective allreduce --sizes 1KiB,1MiB,4MiB \
        --algorithms nccl,nccl_win --json "$R/collgen-mix$mix.json" >"$R/collgen-mix$mix.txt" 2>&1
      part $? "collgen nccl, mixing $mix"
    done
    ANCHOR_TIMING=per-replay ANCHOR_SIZES=$S timeout 90 python3 $A/nccl_window_bench.py "$R/win-per-replay.json" 2 >"$R/win-per-replay.txt" 2>&1
    part $? "nccl window, per replay"
    ANCHOR_OPS=1 ANCHOR_SIZES=$S timeout 90 python3 $A/nccl_window_bench.py "$R/win-ops1.json" 2 >"$R/win-ops1.txt" 2>&1
    part $? "nccl window, one op a graph"
    ANCHOR_STREAM=side ANCHOR_SIZES=$S timeout 90 python3 $A/nccl_window_bench.py "$R/win-side.json" 2 >"$R/win-side.txt" 2>&1
    part $? "nccl window, replays on a side stream"
    # What else differs from collgen's processes: they ask for 32 work
    # queues (runtime/cuda), and NCCL registers the captured buffers.
    CUDA_DEVICE_MAX_CONNECTIONS=32 ANCHOR_SIZES=$S timeout 90 python3 $A/nccl_window_bench.py "$R/win-queues32.json" 2 >"$R/win-queues32.txt" 2>&1
    part $? "nccl window, 32 work queues"
    NCCL_GRAPH_REGISTER=0 ANCHOR_SIZES=$S timeout 90 python3 $A/nccl_window_bench.py "$R/win-noreg.json" 2 >"$R/win-noreg.txt" 2>&1
    part $? "nccl window, NCCL_GRAPH_REGISTER=0"
    grep -h "rank\|ops per graph" "$R"/gaps-*.txt
    for f in "$R"/win-*.txt; do echo "${f##*/}"; grep -h " B " "$f"; done
    grep -h -A6 "per-op latency" "$R"/collgen-*.txt
    ;;
  host-faults)
    # A "host" killed or stopped mid-collective across hosts (reliability
    # case 96): the hier cases of TestPeerFaultGPU, then the rest of the
    # test and the multi-host proof as a check that nothing else moved.
    need .gpu/proof.test
    export COLLGEN_CACHE_DIR=$R/cache
    timeout 300 .gpu/proof.test -test.v -test.count=1 -test.run 'TestPeerFaultGPU' >"$R/peer-fault.log" 2>&1
    part $? "peer faults"
    timeout 150 .gpu/proof.test -test.v -test.count=1 -test.run 'TestMultiHostGPU' >"$R/multihost.log" 2>&1
    part $? "multi-host"
    grep -h "^\(---\|ok\|FAIL\|PASS\)\|survivor" "$R"/*.log
    ;;
esac
exit $status
