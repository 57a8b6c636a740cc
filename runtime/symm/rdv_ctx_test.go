//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestRepeatRendezvousHonoursCtx: a second Rendezvous of a buffer whose
// first is still waiting for peers ends at its own ctx's deadline
// (ErrTimeout), and does not break the pool: the first goes on. Before,
// it waited on the buffer's lock for the first call's whole timeout.
func TestRepeatRendezvousHonoursCtx(t *testing.T) {
	pools := newPools(t, 2, func(r int, c *Config) { c.Timeout = 10 * time.Second })
	bufs := make([]*Buffer, 2)
	for r := range 2 {
		b, err := pools[r].Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		bufs[r] = b
	}
	first := make(chan error, 1)
	go func() {
		_, err := pools[0].Rendezvous(context.Background(), bufs[0])
		first <- err
	}()
	time.Sleep(100 * time.Millisecond) // waiting for rank 1
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() {
		_, err := pools[0].Rendezvous(ctx, bufs[0])
		second <- err
	}()
	select {
	case err := <-second:
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the second Rendezvous: %v; want ErrTimeout and context.DeadlineExceeded", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the second Rendezvous of the buffer went on 3 s past its ctx's 300 ms deadline")
	}
	// Rank 1 comes: the first call completes, the pool is not broken.
	if _, err := pools[1].Rendezvous(context.Background(), bufs[1]); err != nil {
		t.Fatalf("rank 1: %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("rank 0's first Rendezvous: %v", err)
	}
	if h, err := pools[0].Rendezvous(context.Background(), bufs[0]); err != nil || h == nil {
		t.Errorf("a third Rendezvous of the buffer: %v; want its handle", err)
	}
}
