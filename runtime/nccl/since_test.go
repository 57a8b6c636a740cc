package nccl_test

import (
	"strings"
	"testing"

	"github.com/collgen/collgen/runtime/nccl"
)

// TestMissingAbortNamesVersion: ncclCommAbort and
// ncclCommGetAsyncError came with NCCL 2.4.2 and are not among the symbols
// Load requires, so an NCCL 2.3 (which has ncclGetVersion and every
// required symbol) loads, and Comm.Abort, Comm.AsyncError and the waits
// of a non-blocking communicator fail with ErrMissingSymbol; the message
// must name the release that has the function, as for every other
// optional symbol.
func TestMissingAbortNamesVersion(t *testing.T) {
	for _, sym := range []string{"ncclCommAbort", "ncclCommGetAsyncError"} {
		if msg := nccl.MissingMsg(sym); !strings.Contains(msg, "needs NCCL 2.4 or newer") {
			t.Errorf("%s: %q, want it to name NCCL 2.4", sym, msg)
		}
	}
}
