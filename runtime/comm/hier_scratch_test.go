package comm

import (
	"errors"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestHierScratchOverflow: a hierarchical reduce-scatter or all-gather
// needs scratch of (WorldSize+hosts)*count elements, more than the call's
// buffers, so its byte size can overflow an int64 where the call's own
// sizes (which the front end checks) do not: at two hosts of one rank, a
// count of 2^60-1 f32 is 2^63-8 bytes of buffer and 2^64-16 of scratch,
// which wrapped to -16 and reached the device (cudaHier.scratch then
// handed back its old buffer, or 0, for the steps to write into). The
// explicit choice is refused with ErrInvalidArgument before any device
// work; the automatic one goes to NCCL over all ranks.
func TestHierScratchOverflow(t *testing.T) {
	comms, hier, errs := hierComms(t, rendezvous.NewMemStore(), []string{"a", "b"}, Config{})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	const count = 1<<60 - 1
	in, out := DeviceBuffer(0x1000), DeviceBuffer(0x5000)
	for _, c := range []coll.Collective{coll.ReduceScatter, coll.AllGather} {
		hier[0].mu.Lock()
		before := len(hier[0].log)
		hier[0].mu.Unlock()
		o := Options{Algorithm: coll.Hierarchical}
		var err error
		if c == coll.ReduceScatter {
			err = comms[0].ReduceScatter(in, out, count, coll.F32, coll.Sum, o)
		} else {
			err = comms[0].AllGather(in, out, count, coll.F32, o)
		}
		hier[0].mu.Lock()
		work := hier[0].log[before:]
		hier[0].mu.Unlock()
		if !errors.Is(err, ErrInvalidArgument) || len(work) > 0 {
			t.Errorf("%s of %d f32, hierarchical: %v, device work %q; want ErrInvalidArgument and none", c, count, err, work)
		}
		if p, err := comms[0].Explain(c, in, out, count, coll.F32, coll.Sum, Options{}); err != nil || p.Algorithm != coll.NCCL {
			t.Errorf("%s of %d f32, automatic: Explain = %+v, %v; want nccl", c, count, p, err)
		}
	}
}
