#!/usr/bin/env bash
# Builds one fatbin of the generated kernels with `collgen fatbin` (see
# `collgen fatbin --help`), run as .gpu/collgen where the GPU bundle is
# (GPU machines have no Go), else with go run.
# Usage: tests/cuda/fatbin.sh [cuda-dir] [out.fatbin]
# FATBIN_ARCHS: the architectures (default "sm_90 sm_80"); ONLY: a glob over
# kernel names (e.g. '*_ll128_*' or '*_w2') to build a subset; NVCC: the nvcc.
set -euo pipefail
dir=${1:-generated/cuda}; out=${2:-.gpu/collgen.fatbin}
collgen=("${COLLGEN:-.gpu/collgen}")
[ -x "${collgen[0]}" ] || collgen=(go run ./cmd/collgen)
exec "${collgen[@]}" fatbin --dir "$dir" --out "$out" --arch "${FATBIN_ARCHS:-sm_90 sm_80}" --only "${ONLY:-*}" ${NVCC:+--nvcc "$NVCC"}
