#!/usr/bin/env bash
# Tests tests/cuda/check.sh with a fake nvcc (no CUDA needed): the
# architectures compile side by side (each fake job waits for the other to
# have started, so a sequential check would time out), a failure of either
# job fails the check, and each job's log is kept. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/cuda" "$work/bin"
echo '// kernel' > "$work/cuda/k.cu"
cat > "$work/bin/nvcc" <<'FAKE'
#!/usr/bin/env bash
for a in "$@"; do case $a in -arch=*) arch=${a#-arch=};; esac; done
touch "$MARKS/$arch"
other=sm_90; [ "$arch" = sm_90 ] && other=sm_80
for _ in $(seq 200); do [ -e "$MARKS/$other" ] && break; sleep 0.1; done
[ -e "$MARKS/$other" ] || { echo "$arch: $other never started: not run side by side" >&2; exit 9; }
echo "compiled $arch"
[ "$arch" != "${FAIL_ARCH:-}" ] || { echo "error: broken kernel for $arch" >&2; exit 3; }
FAKE
chmod +x "$work/bin/nvcc"

run() { # run NAME [env...]: run check.sh, recording its output and exit code
  local name=$1; shift
  rm -rf "$work/marks"; mkdir -p "$work/marks"
  set +e
  env MARKS="$work/marks" NVCC="$work/bin/nvcc" CUDA_CHECK_LOGS="$work/logs-$name" "$@" \
    bash tests/cuda/check.sh "$work/cuda" sm_80 sm_90 >"$work/$name.out" 2>&1
  echo $? >"$work/$name.rc"
  set -e
}
fail() { echo "check_test: $*" >&2; cat "$work"/*.out >&2; exit 1; }

run ok
[ "$(cat "$work/ok.rc")" = 0 ] || fail "ok run exited $(cat "$work/ok.rc")"
grep -q 'compiled sm_80' "$work/logs-ok/sm_80.log" || fail "sm_80 log not kept"
grep -q 'compiled sm_90' "$work/logs-ok/sm_90.log" || fail "sm_90 log not kept"

for arch in sm_80 sm_90; do
  run "fail-$arch" FAIL_ARCH=$arch
  [ "$(cat "$work/fail-$arch.rc")" = 1 ] || fail "a failing $arch did not fail the check"
  grep -q "failed for $arch" "$work/fail-$arch.out" || fail "the failing $arch is not named"
  grep -q "broken kernel for $arch" "$work/fail-$arch.out" || fail "the failing job's log is not shown"
done
echo "check_test: ok"
