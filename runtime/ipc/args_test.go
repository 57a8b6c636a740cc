package ipc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/collgen/collgen/runtime/ipc"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestExchangeBadArguments: Exchange refuses bad arguments with
// ErrInvalidArgument before it touches the device or the store (no GPU
// needed). A nil device panicked, and a negative size wrapped the
// overrun check and was published to the peers.
func TestExchangeBadArguments(t *testing.T) {
	store := rendezvous.NewMemStore()
	defer store.Close()
	for _, c := range []struct {
		name               string
		rank, world, bytes int
	}{
		{"rank past world", 2, 2, 64},
		{"negative rank", -1, 2, 64},
		{"zero world", 0, 0, 64},
		{"nil device", 0, 2, 64},
		{"negative size", 0, 2, -1},
		{"zero size", 0, 1, 0},
	} {
		_, err := ipc.Exchange(context.Background(), store, "args", c.rank, c.world, nil, 0, c.bytes)
		if !errors.Is(err, ipc.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ipc.ErrInvalidArgument", c.name, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if v, err := store.Get(ctx, "args/ipc/rank0"); err == nil {
		t.Errorf("a refused exchange published its record %q", v)
	}
}
