//go:build cgo

package comm

import (
	"errors"
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/cuda"
)

// TestCollapseDriverErrors: after a kernel fault every clean-up call fails
// with the context's sticky error; release reports it once, with a count,
// instead of once per module (forty lines under MPS, reliability case 37),
// and keeps other errors whole and errors.Is working.
func TestCollapseDriverErrors(t *testing.T) {
	illegal := func(op string) error {
		return &cuda.Error{Op: op, Device: 0, Code: 700, Name: "CUDA_ERROR_ILLEGAL_ADDRESS"}
	}
	other := errors.New("symm: close: a peer still maps the buffer")
	var errs []error
	errs = append(errs, nil, illegal("cuStreamDestroy"), other)
	for range 40 {
		errs = append(errs, illegal("cuModuleUnload"))
	}
	errs = append(errs, &cuda.Error{Op: "cuMemFree", Device: 0, Code: 1, Name: "CUDA_ERROR_INVALID_VALUE"})
	err := collapseDriverErrors(errs)
	msg := err.Error()
	if n := strings.Count(msg, "CUDA_ERROR_ILLEGAL_ADDRESS"); n != 2 { // the first error, and the count naming it
		t.Errorf("ILLEGAL_ADDRESS appears %d times:\n%s", n, msg)
	}
	for _, want := range []string{"cuStreamDestroy on device 0: CUDA_ERROR_ILLEGAL_ADDRESS (and 40 more clean-up calls failed", "a peer still maps", "cuMemFree on device 0: CUDA_ERROR_INVALID_VALUE"} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	if !errors.Is(err, cuda.Result(700)) || !errors.Is(err, other) {
		t.Errorf("errors.Is lost the causes: %v", err)
	}
	if collapseDriverErrors([]error{nil, nil}) != nil {
		t.Error("no errors joined to non-nil")
	}
}
