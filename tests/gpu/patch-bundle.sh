#!/usr/bin/env bash
# Builds the GPU bundle of a kernel patch where Go is (no GPU needed): a
# worktree of HEAD at /tmp/NAME with PATCH applied (a spec or template
# change kept on main as tests/gpu/patches/NAME.patch until its proof on
# GPUs of its own: docs/gpu-workflow.md, "Kernel patches"), regenerated,
# its CPU tests and `collgen check` run, then proof.test and collgen into
# .gpu/NAME of this checkout. On the GPU machine (carry .gpu/collgen and
# .gpu/NAME):
#
#   BUNDLE=.gpu/NAME PROOF_WORLDS=2 PROOF_ONLY='...' OUT=... tests/proof/run.sh
#   tests/gpu/ab.sh .gpu/collgen .gpu/NAME/collgen -n 2 --processes ...
#
#   tests/gpu/patch-bundle.sh tests/gpu/patches/max-blocks.patch
#
# NAME is the patch's file name without .patch; the worktree and its
# branch (NAME-bundle) are removed when the script ends.
set -euo pipefail
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
PATCH=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
NAME=$(basename "$PATCH" .patch)
cd "$(dirname "$0")/../.."
ROOT=$PWD
WT=/tmp/$NAME
GPU_DIR=$ROOT/.gpu/$NAME
git worktree remove --force "$WT" 2>/dev/null || rm -rf "$WT"
git worktree prune
git branch -D "$NAME-bundle" 2>/dev/null || true
git worktree add -q -b "$NAME-bundle" "$WT" HEAD
trap 'cd "$ROOT" && git worktree remove --force "$WT" && git branch -q -D "$NAME-bundle"' EXIT
cd "$WT"
git apply "$PATCH"
go run ./cmd/collgen generate
go test ./gen -update >/dev/null
go test -count=1 ./spec ./tune ./templates/... ./gen ./runtime/kernels ./runtime/comm
go run ./cmd/collgen check
make gpu-bundle GPU_TEST_PKGS=./tests/proof GPU_DIR="$GPU_DIR"
echo "bundle in $GPU_DIR"
