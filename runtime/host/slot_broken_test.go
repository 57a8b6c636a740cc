package host

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/numeric"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestQueuedCallAfterFailureNeverRunsOnBrokenGroup: rank 0 issues A (tag
// 1) and, from a second goroutine, B (tag 2) on the same slot (Slots 1),
// in the same order as rank 1, as the Tags contract allows. A is ended by
// its context while it waits for rank 1 at its first barrier, which breaks
// rank 0's group. B, queued on the slot lock, must not then run on the
// broken group: when it did, its arrival advanced rank 0's counter past
// A's barrier with A's signature still in A's word, and its input
// replaced A's in rank 0's Stage, so rank 1's A passed the barrier and
// returned B's data summed in, with no error.
func TestQueuedCallAfterFailureNeverRunsOnBrokenGroup(t *testing.T) {
	st := rendezvous.NewMemStore()
	defer st.Close()
	gs := make([]*Group, 2)
	for r := range gs {
		g, err := New(context.Background(), Config{Rank: r, WorldSize: 2, Store: st, Group: t.Name(),
			Slots: 1, Lanes: 1, SlotBytes: 8192, Timeout: 10 * time.Second, Library: testLibrary})
		if err != nil {
			t.Fatal(err)
		}
		gs[r] = g
		defer g.Close()
	}
	setup := make(chan error, 2)
	for _, g := range gs {
		go func() { setup <- g.Setup(context.Background()) }()
	}
	for range gs {
		if err := <-setup; err != nil {
			t.Fatal(err)
		}
	}

	const n = 2000 // more than half a lane: pieces use the whole area, not its halves in turn
	fill := func(v float64) []byte {
		b := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			numeric.Put(coll.F32, b, i, v)
		}
		return b
	}
	opA, opB := Options{Algorithm: coll.OneShot, Tag: 1}, Options{Algorithm: coll.OneShot, Tag: 2}
	g0, g1 := gs[0], gs[1]
	counter0 := func() uint64 {
		return atomic.LoadUint64(word(g0.mems[0], g0.lay.lineOff(0, 0)+lineCounter))
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}

	// Rank 0's A arrives at its first barrier and waits for rank 1.
	ctxA, cancelA := context.WithCancel(context.Background())
	errA0 := make(chan error, 1)
	go func() { errA0 <- g0.AllReduce(ctxA, fill(1), make([]byte, 4*n), n, coll.F32, coll.Sum, opA) }()
	waitFor("rank 0's A at its first barrier", func() bool { return counter0() == 1 })
	// Rank 0's B queues behind A on the slot.
	errB0 := make(chan error, 1)
	go func() {
		errB0 <- g0.AllReduce(context.Background(), fill(100), make([]byte, 4*n), n, coll.F32, coll.Sum, opB)
	}()
	waitFor("rank 0's B queued on the slot", func() bool {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "acquireSlot")
	})
	// A ends by its context: rank 0's group is broken.
	cancelA()
	if err := <-errA0; err == nil {
		t.Fatal("rank 0's A succeeded after its context was cancelled")
	}
	// Give B the slot's time to run (it arrives at once if it runs).
	time.Sleep(200 * time.Millisecond)

	// Rank 1 issues A, then B, as rank 0 did.
	out := make([]byte, 4*n)
	errA1 := g1.AllReduce(context.Background(), fill(2), out, n, coll.F32, coll.Sum, opA)
	if errA1 == nil {
		for i := 0; i < n; i++ {
			if v := numeric.Get(coll.F32, out, i); v != 3 {
				t.Fatalf("rank 1's A returned no error and element %d = %v, want 3 (1 + 2): rank 0's B (100) ran on the broken group and its data was read as A's", i, v)
			}
		}
	}
	select {
	case err := <-errB0:
		if !errors.Is(err, ErrBroken) {
			t.Errorf("rank 0's B: %v, want ErrBroken (it was queued when A broke the group)", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("rank 0's B never returned")
	}
}
