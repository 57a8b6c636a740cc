#!/usr/bin/env bash
# The per-combination GPU proof, run on a GPU machine from the repository
# root with the prebuilt bundle (make gpu-bundle: .gpu/proof.test,
# .gpu/collgen). Writes $OUT/proof-summary.md (one line per kernel and mode)
# and the logs. Worlds: PROOF_WORLDS (default 2,3,4 as the GPUs allow);
# kernels: PROOF_ONLY, a glob over kernel names (default all). On one GPU
# every rank shares it (COLLGEN_TEST_SHARE_GPU=1: worlds 2,3,4,8 by
# default, goroutine and process ranks; the multi-host tests, whose NCCL
# groups need a GPU per rank, are left out, and the special values compare
# with the barrier one-shot instead of NCCL). BUNDLE names
# the directory of proof.test and collgen (default .gpu; a kernel branch's
# bundle, e.g. .gpu/max-blocks from tests/gpu/patch-bundle.sh). PROOF_PARTS
# picks the halves (default goroutines,processes,multihost), e.g.
# PROOF_PARTS=processes for the process-rank half alone. The process ranks
# load a fatbin of the programs FATBIN_ONLY names (a glob over program
# names, the .cu stems; default PROOF_ONLY): programs hold every op of an
# element type (allreduce_oneshot_bf16_w2 holds allreduce_oneshot_bf16_sum_w2),
# so a PROOF_ONLY naming an op matches none and they use NVRTC, as they
# say; FATBIN_ONLY='allreduce_oneshot_bf16_w*' then keeps the fatbin.
# Time limits (s): GOROUTINE_TIMEOUT (420), FATBIN_TIMEOUT (200: nvcc's
# build of every program for FATBIN_ARCHS, default sm_90 and sm_80, took
# 123 s on an H200 host; FATBIN_ARCHS=sm_90 halves it; past the limit the
# process ranks use NVRTC), PROCESS_TIMEOUT (240 a world), MULTIHOST_TIMEOUT
# (150 each of two steps). Their defaults add up past one 600 s device
# call: split a long proof with PROOF_PARTS.
#
#   make gpu-bundle && (on the GPU machine) tests/proof/run.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.."
PROOF_PARTS=${PROOF_PARTS:-goroutines,processes,multihost}
part() { case ",$PROOF_PARTS," in *",$1,"*) return 0 ;; esac; return 1; }
for p in ${PROOF_PARTS//,/ }; do
  case $p in goroutines|processes|multihost) ;; *) echo "run.sh: PROOF_PARTS has $p; the parts are goroutines, processes, multihost" >&2; exit 2 ;; esac
done
OUT=${OUT:-.gpu/out}
BUNDLE=${BUNDLE:-.gpu}
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export COLLGEN_CACHE_DIR="$TMP/cache"
export PROOF_SUMMARY="$OUT/proof-summary.md" SPECIAL_TABLE=${SPECIAL_TABLE:-$OUT/special-values.md}
: >"$PROOF_SUMMARY"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
# One GPU: every rank on it (COLLGEN_TEST_SHARE_GPU, proof_test.go's
# place), the tests that can share it, worlds 2, 3, 4 and 8.
[ "$ngpu" -eq 1 ] && export COLLGEN_TEST_SHARE_GPU=1
shared=
if [ "${COLLGEN_TEST_SHARE_GPU:-}" = 1 ]; then shared=1; ngpu=8; fi
PROOF_WORLDS=${PROOF_WORLDS:-$(for w in 2 3 4 ${shared:+8}; do [ "$w" -le "$ngpu" ] && printf '%s,' $w; done | sed 's/,$//')}
export PROOF_WORLDS
status=0

tests='TestProofGoroutines|TestProofWindows|TestProofZeroCopy|TestClosedGroupKeysGPU|TestTimeoutReported|TestMismatchReportedGPU|TestForcedAlgorithmRefused|TestDebugCheckGPU|TestSpecialValues|TestProofHCMTopology'
[ -n "$shared" ] && tests='TestProofGoroutines|TestSpecialValues|TestProofZeroCopy|TestClosedGroupKeysGPU|TestTimeoutReported|TestMismatchReportedGPU|TestForcedAlgorithmRefused|TestDebugCheckGPU|TestProofHCMTopology'
if part goroutines; then
echo "== goroutine ranks (peer access, NVRTC), worlds $PROOF_WORLDS${shared:+, all on one GPU}"
echo "## goroutine ranks (peer access, kernels compiled with NVRTC)${shared:+, all on one GPU}" >>"$PROOF_SUMMARY"
start=$(date +%s)
timeout ${GOROUTINE_TIMEOUT:-420} $BUNDLE/proof.test -test.v -test.timeout 0 \
  -test.run "$tests" >"$OUT/proof-goroutines.log" 2>&1
rc=$? # 124: GOROUTINE_TIMEOUT ran out
[ $rc -eq 0 ] || status=1
echo "goroutine proof: exit $rc after $(( $(date +%s) - start ))s"
grep -E '^(--- |ok|FAIL|PASS)' "$OUT/proof-goroutines.log" | tail -8
fi

if part processes; then
echo "== process ranks (CUDA IPC, fatbin from nvcc)"
# The fatbin is built from this tree's generated/cuda: only for its own bundle.
if [ "$BUNDLE" != .gpu ]; then
  echo "bundle $BUNDLE: process ranks use NVRTC (its own kernels; generated/cuda is this tree's)"
elif /usr/local/cuda/bin/nvcc --version >/dev/null 2>&1 && COLLGEN=$BUNDLE/collgen ONLY="${FATBIN_ONLY:-${PROOF_ONLY:-*}}" NVCC=/usr/local/cuda/bin/nvcc timeout "${FATBIN_TIMEOUT:-200}" tests/cuda/fatbin.sh generated/cuda "$TMP/collgen.fatbin" >"$OUT/fatbin.log" 2>&1; then
  export COLLGEN_FATBIN="$TMP/collgen.fatbin"
else
  echo "fatbin build failed (see fatbin.log); process ranks use NVRTC"
fi
for w in ${PROOF_WORLDS//,/ }; do
  echo "## process ranks, world $w (CUDA IPC, $([ -n "${COLLGEN_FATBIN:-}" ] && echo fatbin || echo NVRTC))" >>"$PROOF_SUMMARY"
  timeout ${PROCESS_TIMEOUT:-240} $BUNDLE/collgen run -n "$w" -- $BUNDLE/proof.test -test.v -test.run TestProofProcess \
    >>"$OUT/proof-processes.log" 2>&1 || { status=1; echo "world $w: process proof failed"; }
done
fi
if [ -z "$shared" ] && part multihost; then # the multi-host path needs a GPU per rank
  echo "== multi-host path on one machine (Config.HostID per rank): goroutine and process ranks"
  timeout ${MULTIHOST_TIMEOUT:-150} $BUNDLE/proof.test -test.v -test.run TestMultiHostGPU >"$OUT/multihost.log" 2>&1 || { status=1; echo "multi-host goroutine proof failed"; }
  timeout ${MULTIHOST_TIMEOUT:-150} $BUNDLE/collgen run -n 2 -- $BUNDLE/proof.test -test.v -test.run TestMultiHostProcess >>"$OUT/multihost.log" 2>&1 || { status=1; echo "multi-host process proof failed"; }
  grep -E '^(\[rank [0-9]\] )?(--- |ok|FAIL)' "$OUT/multihost.log" | head -10
fi
grep -cE '\| pass \|' "$PROOF_SUMMARY" | sed 's/^/passing lines: /'
grep -E 'FAIL' "$PROOF_SUMMARY" | head -20
exit $status
