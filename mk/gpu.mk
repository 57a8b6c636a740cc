# GPU test bundle (included by the main Makefile). See docs/gpu-workflow.md.
#
#   make gpu-bundle   build every GPU test binary and collgen into .gpu/
#                     (cgo on; runs here, no CUDA toolkit or GPU needed)
#   make gpu-test     run tests/gpu/run.sh on this machine (needs a GPU)
#
# The bundle then travels to a GPU machine with the repository, where
# tests/gpu/run.sh runs every .gpu/*.test binary.

GPU_DIR        ?= .gpu
GPU_TEST_PKGS  ?= ./runtime/alloc ./runtime/cuda ./runtime/ipc ./runtime/nccl ./runtime/symm ./runtime/topo ./tests/proof

# Binaries are built without symbol tables and DWARF (-s -w): the device
# tool carries at most 64 MiB with the working tree, and unstripped the
# bundle is over 60 MiB.
GPU_LDFLAGS    ?= -s -w
# The bundle's collgen leaves out the etcd client (-tags noetcd, 8 MB): the
# GPU machine rendezvouses through TCP and file stores only.

.PHONY: gpu-bundle gpu-test gpu-clean
gpu-bundle:
	mkdir -p $(GPU_DIR)
	@set -e; for p in $(GPU_TEST_PKGS); do \
	  n=$$(basename $$p); \
	  echo "CGO_ENABLED=1 $(GO) test -c -ldflags='$(GPU_LDFLAGS)' -o $(GPU_DIR)/$$n.test $$p"; \
	  CGO_ENABLED=1 $(GO) test -c -ldflags='$(GPU_LDFLAGS)' -o $(GPU_DIR)/$$n.test $$p; \
	done
	CGO_ENABLED=1 $(GO) build -tags noetcd -ldflags='$(GPU_LDFLAGS)' -o $(GPU_DIR)/collgen ./cmd/collgen
	@ls -l $(GPU_DIR)

gpu-test:
	tests/gpu/run.sh

gpu-clean:
	rm -rf $(GPU_DIR)/*.test $(GPU_DIR)/collgen $(GPU_DIR)/out
