//go:build linux && (amd64 || arm64)

package symm

import (
	"errors"
	"testing"
	"time"
)

// waitingSignal rendezvouses a world-2 group, then starts on rank 0 a
// Barrier (with a 10 s timeout) that rank 1 never joins.
func waitingSignal(t *testing.T) ([]*Pool, *Buffer, chan error) {
	t.Helper()
	pools := newPools(t, 2, func(r int, c *Config) { c.Timeout = 10 * time.Second })
	bufs, hs := allocAll(t, pools, 4096)
	done := make(chan error, 1)
	go func() { done <- hs[0].Barrier(Now, 0, 10*time.Second) }()
	time.Sleep(200 * time.Millisecond) // into the wait for rank 1
	return pools, bufs[0], done
}

// TestFreeEndsWaitingSignal: Free "is local and returns at once" and Close
// "does not wait for peers", but both waited, for the signal's whole
// timeout, for a Barrier of the buffer that waited for a peer that never
// came (the barrier held the buffer's read lock). Now Free and Close end
// the signal operation at once; it reports ErrFreed (and ErrClosed for
// Close), not a timeout.
func TestFreeEndsWaitingSignal(t *testing.T) {
	for _, byClose := range []bool{false, true} {
		name := map[bool]string{false: "Free", true: "Close"}[byClose]
		t.Run(name, func(t *testing.T) {
			pools, b, done := waitingSignal(t)
			start := time.Now()
			ended := make(chan error, 1)
			go func() {
				if byClose {
					ended <- pools[0].Close()
				} else {
					ended <- b.Free()
				}
			}()
			select {
			case err := <-ended:
				if err != nil {
					t.Errorf("%s: %v", name, err)
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("%s still waiting after 3 s for a Barrier whose peer never comes", name)
			}
			err := <-done
			if !errors.Is(err, ErrFreed) || errors.Is(err, ErrTimeout) || byClose != errors.Is(err, ErrClosed) {
				t.Errorf("Barrier: %v; want ErrFreed (and ErrClosed after Close), not a timeout", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("the Barrier ended %v after %s", d, name)
			}
			// The peer can still leave.
			if err := pools[1].Close(); err != nil {
				t.Error(err)
			}
		})
	}
}
