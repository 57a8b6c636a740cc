//go:build !cgo

package comm

import "github.com/collgen/collgen/runtime/cuda"

// openHierDevice fails without cgo, as openDevice does.
func openHierDevice(cfg Config) (hierDevice, error) {
	return nil, errorf(ErrUnsupported, "comm: rank %d: the GPU backend needs cgo: %w; for CPU ranks set Config.Device = comm.Host", cfg.Rank, cuda.ErrNoCgo)
}
