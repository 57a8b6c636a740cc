//go:build cgo && linux && (amd64 || arm64)

package cli

import "github.com/collgen/collgen/runtime/nccl"

// ncclProbe loads libnccl as the communicator would.
func ncclProbe() (ncclFound, error) {
	lib, err := nccl.Load()
	if err != nil {
		return ncclFound{}, err
	}
	return ncclFound{version: lib.Version().String(), path: lib.Path, registers: lib.Registers(), windows: lib.HasWindows()}, nil
}
