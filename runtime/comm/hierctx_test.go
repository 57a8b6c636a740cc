package comm

import (
	"context"
	"errors"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// cancelOnCross is a fake hierarchical device that runs cancel when the
// plan enqueues its step across hosts: the caller's Options.Context ends
// while the call is under way (a deadline passing, a cancel from another
// goroutine).
type cancelOnCross struct {
	*fakeHier
	cancel context.CancelFunc
}

func (d *cancelOnCross) nccl(cross bool, c coll.Collective, in, out cuda.DevicePtr, count int64, dt coll.DType, op coll.Op, s *cuda.Stream) error {
	if cross {
		d.cancel()
	}
	return d.fakeHier.nccl(cross, c, in, out, count, dt, op, s)
}

// A hierarchical all-reduce whose Options.Context ends after its first
// steps were enqueued must still run every step on this rank: its host
// peers run the host all-gather that follows (their own contexts are
// live), and a rank that skips it leaves them waiting in that kernel until
// Config.Timeout, while it reports the call "not started".
func TestHierContextEndsMidPlan(t *testing.T) {
	comms, hier, errs := hierComms(t, rendezvous.NewMemStore(), []string{"a", "b", "a", "b"}, Config{})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	comms[0].hier.dev = &cancelOnCross{hier[0], cancel}
	errs = onRanks(comms, func(r int, c *Communicator) error {
		o := Options{}
		if r == 0 {
			o.Context = ctx
		}
		return c.AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x5000), 64, coll.F32, coll.Sum, o)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// Rank 0 and rank 2 are host a's ranks: their nested communicator
	// must have issued the same calls.
	a0, a2 := comms[0].hier.intra.gpu.calls.log.account(), comms[2].hier.intra.gpu.calls.log.account()
	if a0.last() != a2.last() {
		t.Fatalf("host a's ranks issued different calls on their host communicator: rank 0 %d (%v), rank 2 %d (%v)",
			a0.last(), a0.Calls, a2.last(), a2.Calls)
	}
}
