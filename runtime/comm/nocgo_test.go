//go:build !cgo

package comm

import (
	"context"
	"errors"
	"testing"

	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestGPUNeedsCgo checks the CGO_ENABLED=0 build's GPU refusal: typed
// (ErrUnsupported, cuda.ErrNoCgo) and naming what to do.
func TestGPUNeedsCgo(t *testing.T) {
	_, err := New(context.Background(), Config{WorldSize: 1, Store: rendezvous.NewMemStore(), Library: collectives.Library})
	if !errors.Is(err, ErrUnsupported) || !errors.Is(err, cuda.ErrNoCgo) {
		t.Fatalf("GPU communicator without cgo: %v", err)
	}
}
