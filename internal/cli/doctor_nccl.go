//go:build cgo && linux && (amd64 || arm64)

package cli

import "github.com/collgen/collgen/runtime/nccl"

// ncclProbe loads libnccl as the communicator would.
func ncclProbe() (major, minor, patch int, path string, err error) {
	lib, err := nccl.Load()
	if err != nil {
		return 0, 0, 0, "", err
	}
	v := lib.Version()
	return v.Major, v.Minor, v.Patch, lib.Path, nil
}
