//go:build !cgo || !(linux && (amd64 || arm64))

package cli

import "errors"

// ncclProbe: this build loads no NCCL (runtime/nccl needs cgo, on Linux).
func ncclProbe() (ncclFound, error) {
	return ncclFound{}, errors.New("nccl: this build of collgen loads no NCCL (it needs cgo, on Linux)")
}
