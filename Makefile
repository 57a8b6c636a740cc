# collgen: common tasks. `make help` lists them.
GO ?= go
NVCC ?= nvcc

.PHONY: help build generate check test test-short cuda-check cuda-cost cuda-resources fatbin bench vet fmt ci
help:
	@echo "build       build bin/collgen"
	@echo "generate    regenerate generated/ from spec/"
	@echo "check       fail if generated/ is stale (collgen check)"
	@echo "test        the full CPU test suite (what CI runs)"
	@echo "test-short  go test -short ./... (skips the long sweeps)"
	@echo "fmt         gofmt -w every Go file"
	@echo "vet         fail on unformatted files, then go vet"
	@echo "ci          everything CI runs (.ci/run; installs nvcc when missing)"
	@echo "cuda-check  compile every generated kernel with nvcc for sm_80 and sm_90, side by side (and the Lamport golden tree's)"
	@echo "cuda-cost   what each generated kernel costs nvcc (CPU time per family and world size)"
	@echo "cuda-resources registers and spills of each generated kernel (tests/cuda/resources.sh)"
	@echo "fatbin      build .gpu/collgen.fatbin for FATBIN_ARCHS (default sm_90 sm_80): kernels load without NVRTC"
	@echo "gpu-bundle  build GPU test binaries and collgen into .gpu/ (see docs/gpu-workflow.md)"
	@echo "bench       generator benchmark"

build:
	$(GO) build -o bin/collgen ./cmd/collgen

generate:
	$(GO) run ./cmd/collgen generate

check:
	$(GO) run ./cmd/collgen check

vet:
	gofmt -l . | (! grep .) && $(GO) vet ./...

test:
	$(GO) test ./...

test-short:
	$(GO) test -short ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

ci:
	.ci/run

cuda-check:
	NVCC=$(NVCC) tests/cuda/check.sh generated/cuda sm_80 sm_90
	NVCC=$(NVCC) tests/cuda/check.sh gen/testdata/lamport/want/cuda sm_80 sm_90

cuda-cost:
	NVCC=$(NVCC) tests/cuda/cost.sh generated/cuda

cuda-resources:
	NVCC=$(NVCC) tests/cuda/resources.sh generated/cuda

# FATBIN_ARCHS="sm_90 sm_100" make fatbin: the architectures to build for;
# FATBIN=path: where to write it. (collgen fatbin --help)
FATBIN ?= .gpu/collgen.fatbin
FATBIN_ARCHS ?= sm_90 sm_80
fatbin:
	$(GO) run ./cmd/collgen fatbin --dir generated/cuda --out $(FATBIN) --arch "$(FATBIN_ARCHS)" --nvcc $(NVCC)

bench:
	$(GO) test -run '^$$' -bench . -benchtime 20x ./gen

-include mk/*.mk
