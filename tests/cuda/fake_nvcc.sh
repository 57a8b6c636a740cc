# shellcheck shell=bash
# Sourced by cost_test.sh and resources_test.sh, which test cost.sh and
# resources.sh with a fake nvcc (no CUDA needed).

# fake_work TEST KERNEL...: makes $work (removed at exit) with a one-line
# $work/cuda/KERNEL.cu for each KERNEL and an empty $work/bin for the
# fakes, and defines fail, which prints "TEST: message" and exits 1.
fake_work() {
  fake_test=$1; shift
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/cuda" "$work/bin"
  local k
  for k in "$@"; do
    echo '// kernel' >"$work/cuda/$k.cu"
  done
}
fail() { echo "$fake_test: $*" >&2; exit 1; }

# fake_nvcc: writes $work/bin/nvcc from the script body on stdin, after
# a line making it fail ("error: broken kernel", exit 2) when the name
# of its last argument, the kernel file, contains $FAIL.
fake_nvcc() {
  {
    echo '#!/usr/bin/env bash'
    # shellcheck disable=SC2016 # the fake expands it
    echo 'case "$(basename -- "${*: -1}")" in *"${FAIL:-none}"*) echo "error: broken kernel" >&2; exit 2;; esac'
    cat
  } >"$work/bin/nvcc"
  chmod +x "$work/bin/nvcc"
}

# fails_naming MESSAGE WANT OUT CMD...: runs CMD with its output in OUT;
# it must fail (else fail MESSAGE) and OUT must contain WANT.
fails_naming() {
  local message=$1 want=$2 out=$3; shift 3
  if "$@" >"$out" 2>&1; then
    fail "$message"
  fi
  grep -q -- "$want" "$out" || fail "the failure does not name the kernel: $(cat "$out")"
}
