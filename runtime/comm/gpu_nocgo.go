//go:build !cgo || !(linux && (amd64 || arm64))

package comm

import "github.com/collgen/collgen/runtime/cuda"

// openDevice fails without cgo: the GPU backend reaches CUDA, NVRTC and
// NCCL through cgo shims. Host communicators need none of them.
func openDevice(cfg Config) (device, error) {
	return nil, errorf(ErrUnsupported, "comm: rank %d: the GPU backend needs cgo: %w; for CPU ranks set Config.Device = comm.Host", cfg.Rank, cuda.ErrNoCgo)
}
