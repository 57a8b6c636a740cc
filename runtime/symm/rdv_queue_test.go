//go:build linux && (amd64 || arm64)

package symm

import (
	"context"
	"errors"
	"testing"
	"time"
)

// queuedRendezvous starts, on rank 0 of a world-2 group whose rank 1 never
// comes, a Rendezvous that waits for rank 1 (10 s) and then a second one,
// of another buffer, queued behind it (run calls Rendezvous with ctx).
func queuedRendezvous(t *testing.T, ctx context.Context) (*Pool, *Buffer, chan error) {
	t.Helper()
	pools := newPools(t, 2, func(r int, c *Config) { c.Timeout = 10 * time.Second })
	p := pools[0]
	a, err := p.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	go p.Rendezvous(context.Background(), a) // waits for rank 1; Close ends it
	time.Sleep(100 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, err := p.Rendezvous(ctx, b)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // queued behind a's
	return p, b, done
}

// TestQueuedRendezvousEnds: a Rendezvous waiting for another of the same
// pool to finish ends at once when its buffer is freed (ErrFreed), as the
// Free documentation says, and at its ctx's deadline (ErrTimeout). Before,
// both waited for the other Rendezvous's whole timeout.
func TestQueuedRendezvousEnds(t *testing.T) {
	t.Run("Free", func(t *testing.T) {
		_, b, done := queuedRendezvous(t, context.Background())
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, ErrFreed) {
				t.Errorf("Rendezvous: %v; want ErrFreed", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("the queued Rendezvous did not end within 3 s of its buffer's Free")
		}
	})
	t.Run("Deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, _, done := queuedRendezvous(t, ctx)
		select {
		case err := <-done:
			if !errors.Is(err, ErrTimeout) {
				t.Errorf("Rendezvous: %v; want ErrTimeout", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("the queued Rendezvous went on 3 s past its ctx's 300 ms deadline")
		}
	})
}
