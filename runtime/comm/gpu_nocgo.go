//go:build !cgo

package comm

// openDevice fails without cgo: the GPU backend reaches CUDA, NVRTC and
// NCCL through cgo shims. Host communicators need none of them.
func openDevice(cfg Config) (device, error) {
	return nil, errorf(ErrUnsupported, "comm: rank %d: the GPU backend needs cgo, and this program was built with CGO_ENABLED=0; build with cgo (and gcc) for GPUs, or set Config.Device = comm.Host for CPU ranks", cfg.Rank)
}
