#!/usr/bin/env bash
# Builds the ll-fast kernels' GPU bundle where Go is (no GPU needed): a
# worktree of HEAD at $WT (default /tmp/llf) with tests/gpu/patches/ll-fast.patch
# applied (LL128 polls in flight together, push loops started on warp
# boundaries: docs/gpu-workflow.md, "Owed on nvidia-h200-x2", item 4),
# regenerated, its CPU tests run, then proof.test and collgen into
# $GPU_DIR (default .gpu/llf of this checkout). On the GPU machine:
#
#   BUNDLE=.gpu/llf PROOF_WORLDS=2 PROOF_ONLY='*_ll*_w2' OUT=... tests/proof/run.sh
#   tests/gpu/ab.sh .gpu/collgen .gpu/llf/collgen -n 2 --processes ...
#
# The worktree and its branch are removed first if they exist.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WT=${WT:-/tmp/llf}
GPU_DIR=${GPU_DIR:-$ROOT/.gpu/llf}
git worktree remove --force "$WT" 2>/dev/null || rm -rf "$WT"
git worktree prune
git branch -D ll-fast-bundle 2>/dev/null || true
git worktree add -q -b ll-fast-bundle "$WT" HEAD
cd "$WT"
git apply "$ROOT/tests/gpu/patches/ll-fast.patch"
go run ./cmd/collgen generate
go test ./gen -update >/dev/null
go test -count=1 ./templates/... ./gen ./runtime/kernels
go run ./cmd/collgen check
make gpu-bundle GPU_TEST_PKGS=./tests/proof GPU_DIR="$GPU_DIR"
