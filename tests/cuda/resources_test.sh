#!/usr/bin/env bash
# Tests tests/cuda/resources.sh with a fake nvcc (no CUDA needed): every
# kernel file gets a line with its entry function's registers, stack and
# spills (not those of the device functions ptxas lists after it), the
# spilling ones are listed in spills.txt, and a kernel that fails to
# compile or whose entry function ptxas does not report fails the script,
# naming it. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/cuda/fake_nvcc.sh # (the repository root is the working directory)
fake_work resources_test allreduce_oneshot_f32_w2 allreduce_twoshot_ll128_bf16_w4 allgather_oneshot_ll_u32_w3
# The fake prints what ptxas 11.8 and 13.0 print: the entry function's
# properties, then a device function's (with other numbers).
fake_nvcc <<'FAKE'
[ "$1" = --version ] && { echo "Cuda compilation tools, release 99.1, V99.1.0"; exit 0; }
k=$(basename "${*: -1}" .cu)
case "$k" in *"${NOENTRY:-none}"*) k=other;; esac
spill=0; regs=40; case "$k" in *ll128*) spill=80; regs=128;; esac
cat <<OUT
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '$k' for 'sm_90'
ptxas info    : Function properties for $k
    $spill bytes stack frame, $spill bytes spill stores, $((spill + 4)) bytes spill loads
ptxas info    : Used $regs registers, used 1 barriers, 384 bytes cmem[0]
ptxas info    : Function properties for _Z12cg_push_spinI8cg_ll128E
    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
OUT
FAKE

NVCC="$work/bin/nvcc" RES_OUT="$work/ok" bash tests/cuda/resources.sh "$work/cuda" >"$work/ok.out" 2>&1 || fail "resources.sh failed: $(cat "$work/ok.out")"
want='allgather_oneshot_ll_u32_w3 40 0 0 4
allreduce_oneshot_f32_w2 40 0 0 4
allreduce_twoshot_ll128_bf16_w4 128 80 80 84'
[ "$(cat "$work/ok/usage.txt")" = "$want" ] || fail "usage.txt: got
$(cat "$work/ok/usage.txt")
want
$want"
[ "$(cat "$work/ok/spills.txt")" = "$want" ] || fail "spills.txt (spill loads count too): $(cat "$work/ok/spills.txt")"
grep -q '3 kernels for sm_90 with release 99.1; 3 spill' "$work/ok.out" || fail "summary: $(cat "$work/ok.out")"

fails_naming "a kernel that fails to compile did not fail resources.sh" 'allgather_oneshot_ll_u32_w3 failed to compile' "$work/bad.out" \
  env FAIL=allgather NVCC="$work/bin/nvcc" RES_OUT="$work/bad" bash tests/cuda/resources.sh "$work/cuda"
fails_naming "a kernel whose entry function ptxas does not report did not fail resources.sh" "no entry function 'allreduce_twoshot_ll128_bf16_w4'" "$work/none.out" \
  env NOENTRY=twoshot NVCC="$work/bin/nvcc" RES_OUT="$work/none" bash tests/cuda/resources.sh "$work/cuda"
echo "resources_test: ok"
