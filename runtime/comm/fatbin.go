package comm

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/collgen/collgen/runtime/cuda"
)

// fatbinError gives a fatbin that could not be loaded its kind: a missing
// file is ErrInvalidArgument, a fatbin without code for the device
// (*cuda.FatbinError listing what it holds) ErrUnsupported, anything else
// ErrDevice. nil stays nil.
func fatbinError(rank int, path string, err error) error {
	if err == nil {
		return nil
	}
	var fe *cuda.FatbinError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errorf(ErrInvalidArgument, "comm: rank %d: fatbin %s (Config.FatbinPath or $%s) does not exist: build it with `collgen fatbin`, or leave both unset to compile the kernels with NVRTC: %w", rank, path, EnvFatbin, err)
	case errors.As(err, &fe) && fe.Codes != nil:
		return errorf(ErrUnsupported, "comm: rank %d: %w", rank, err)
	}
	return classify(fmt.Errorf("comm: rank %d: load fatbin %s: %w", rank, path, err))
}
