#!/usr/bin/env bash
# Checks tests/gpu/owed-x2.sh without a GPU: `list` names every step and
# its carry, an unknown step or a missing carry is refused (exit 2, naming
# it) before anything runs, and each step still names the scripts and
# flags it relies on. Run by .ci/run.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
S=tests/gpu/owed-x2.sh
fail() { echo "owed_test: $*" >&2; exit 1; }
bash -n "$S" || fail "syntax"
out=$("$S" list) || fail "list exited $?"
for step in peers max-blocks lamport nonblocking proof-goroutines proof-processes peers-why host-faults ll128-grow abort-zc-proof abort-zc; do
  grep -q "^$step " <<<"$out" || fail "list lacks $step: $out"
done
"$S" nosuch >/dev/null 2>&1; [ $? -eq 2 ] || fail "an unknown step did not exit 2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# A copy of the tree's scripts with no bundle beside it: every step must
# stop at its missing carry.
mkdir -p "$tmp/tests/gpu" && cp "$S" tests/gpu/steps.sh "$tmp/tests/gpu/"
for step in peers max-blocks lamport nonblocking proof-goroutines proof-processes peers-why host-faults ll128-grow abort-zc-proof abort-zc; do
  msg=$(OUT=$tmp/out "$tmp/tests/gpu/owed-x2.sh" "$step" 2>&1); rc=$?
  if [ $rc -ne 2 ] || ! grep -q "needs .gpu/" <<<"$msg"; then fail "$step without its carry: exit $rc, $msg"; fi
done
# The patches the steps build from exist, and the flags they pass exist.
for p in max-blocks lamport ll128-grow abort-zc; do [ -f "tests/gpu/patches/$p.patch" ] || fail "no tests/gpu/patches/$p.patch"; done
for f in tests/gpu/peers.sh tests/gpu/ab.sh tests/proof/run.sh; do [ -x "$f" ] || fail "$f is not executable"; done
for f in graph_gaps.py nccl_window_bench.py torch_anchor_bench.py anchor_timing.py; do
  [ -f "tests/gpu/anchors/$f" ] || fail "no tests/gpu/anchors/$f"
done
# The peers' scripts parse (where python3 is), and ANCHOR_SIZES reaches the
# ones peers-why restricts.
command -v python3 >/dev/null && for f in tests/gpu/anchors/*.py; do python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" "$f" || fail "$f does not parse"; done
for f in nccl_window_bench.py torch_anchor_bench.py; do
  grep -q "anchor_sizes(" "tests/gpu/anchors/$f" || fail "$f ignores ANCHOR_SIZES"
done
# host-faults runs TestPeerFaultGPU's cases across hosts.
grep -q '"hier-kill"' tests/proof/fault_test.go || fail "TestPeerFaultGPU has no hier-kill case"
# The same for tests/gpu/owed-x4.sh: every step listed, an unknown one
# refused, a missing carry named before anything runs, and without four
# GPUs (here: none) a step refuses to start.
X=tests/gpu/owed-x4.sh
bash -n "$X" || fail "owed-x4.sh: syntax"
out=$("$X" list) || fail "owed-x4.sh list exited $?"
steps="proof-goroutines proof-processes bench groups peers"
for step in $steps; do grep -q "^$step " <<<"$out" || fail "owed-x4.sh list lacks $step: $out"; done
"$X" nosuch >/dev/null 2>&1; [ $? -eq 2 ] || fail "owed-x4.sh: an unknown step did not exit 2"
cp "$X" "$tmp/tests/gpu/"
for step in $steps; do
  msg=$(OUT=$tmp/out "$tmp/tests/gpu/owed-x4.sh" "$step" 2>&1); rc=$?
  if [ $rc -ne 2 ] || ! grep -q "needs .gpu/" <<<"$msg"; then fail "owed-x4.sh $step without its carry: exit $rc, $msg"; fi
done
mkdir -p "$tmp/.gpu" && for f in collgen proof.test symm.test nccl.test ipc.test cuda.test; do : >"$tmp/.gpu/$f"; done
for step in $steps; do
  msg=$(OUT=$tmp/out "$tmp/tests/gpu/owed-x4.sh" "$step" 2>&1); rc=$?
  if [ $rc -ne 2 ] || ! grep -q "needs four GPUs" <<<"$msg"; then fail "owed-x4.sh $step without four GPUs: exit $rc, $msg"; fi
done
for f in tests/gpu/bench.sh tests/gpu/groups.sh; do [ -x "$f" ] || fail "$f is not executable"; done
echo "owed_test: ok"
