package comm

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestParkedGate (reliability case 38): a parked region is freed only
// once no communicator is open on its GPU (other GPUs do not count), and
// a communicator opening on that GPU waits for a free in progress.
func TestParkedGate(t *testing.T) {
	g := newParkedGate()
	g.open(0)
	g.open(1)
	var freed atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- g.free(0, func() error { freed.Store(true); return nil })
	}()
	time.Sleep(20 * time.Millisecond)
	if freed.Load() {
		t.Fatal("freed while a communicator is open on the GPU")
	}
	g.close(0) // GPU 1's communicator does not hold GPU 0's region back
	if err := <-done; err != nil || !freed.Load() {
		t.Fatalf("after the last close on GPU 0: freed %v, %v", freed.Load(), err)
	}
	// A free in progress holds back a communicator opening on its GPU.
	release := make(chan struct{})
	go g.free(2, func() error { <-release; return nil })
	time.Sleep(10 * time.Millisecond)
	opened := make(chan struct{})
	go func() { g.open(2); close(opened) }()
	select {
	case <-opened:
		t.Fatal("a communicator opened on the GPU while its parked region was being freed")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-opened
	if g.live[2] != 1 || g.live[1] != 1 {
		t.Errorf("live counts %v", g.live)
	}
}
