#!/usr/bin/env bash
# Tests tests/cuda/cost.sh with a fake nvcc and ptxas (no CUDA needed):
# every kernel file gets a line, the sums group files by family (the name
# before the dtype) and by world size, and a kernel that fails to compile
# fails the script, naming it. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/cuda/fake_nvcc.sh # (the repository root is the working directory)
fake_work cost_test allreduce_oneshot_f32_sum_w2 allreduce_oneshot_bf16_max_w4 allgather_oneshot_ll_e4m3_w2
echo '// header' >"$work/cuda/collgen_common.cuh"
fake_nvcc <<'FAKE'
out=; prev=
for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
echo '// ptx' >"$out"
FAKE
printf '#!/usr/bin/env bash\nexit 0\n' >"$work/bin/ptxas"
chmod +x "$work/bin/ptxas"

NVCC="$work/bin/nvcc" COST_OUT="$work/ok" bash tests/cuda/cost.sh "$work/cuda" >"$work/ok.out" 2>&1 || fail "cost.sh failed: $(cat "$work/ok.out")"
[ "$(wc -l <"$work/ok/files.txt")" -eq 3 ] || fail "want 3 lines in files.txt: $(cat "$work/ok/files.txt")"
awk 'NF != 3 || $2 !~ /^[0-9]+$/ || $3 !~ /^[0-9]+$/ { exit 1 }' "$work/ok/files.txt" || fail "files.txt lines are not 'name front_ms ptxas_ms': $(cat "$work/ok/files.txt")"
for want in 'allreduce_oneshot +2 ' 'allgather_oneshot_ll +1 ' 'w2 +2 ' 'w4 +1 ' 'all +3 ' 'fixed cost per file'; do
  grep -Eq "^$want" "$work/ok/summary.txt" || fail "summary has no line '$want': $(cat "$work/ok/summary.txt")"
done

fails_naming "a kernel that fails to compile did not fail cost.sh" 'allgather_oneshot_ll_e4m3_w2 failed' "$work/bad.out" \
  env FAIL=allgather NVCC="$work/bin/nvcc" COST_OUT="$work/bad" bash tests/cuda/cost.sh "$work/cuda"
echo "cost_test: ok"
