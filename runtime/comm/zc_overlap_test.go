package comm

import (
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
)

// TestFakeOverlapSymmetricStaged: a symmetric input whose output overlaps
// it other than in place must be staged, as an overlapping all-reduce's
// is. Zero-copy peers read the input in place after the first barrier
// while this rank writes its output (reduce_scatter_oneshot's phase 1
// writes output@rank with no barrier between it and the peers' reads of
// input@rank), so an output over a chunk a peer reads, or over any part
// of an all-gather's input, hands peers overwritten data; staged, the
// input is copied before the barrier. The in-place reduce-scatter (a rank
// writes only its own chunk, which no peer reads) stays zero-copy. The
// calls name the one-shot, which the shipped symmetric rules choose for
// such inputs from 8 MiB up at world 2.
func TestFakeOverlapSymmetricStaged(t *testing.T) {
	comms, _ := fakeComms(t, 2, Config{})
	defer closeAll(t, comms)
	const count = 1 << 20 // f32 elements of each rank's block
	const block = 4 * count
	syms := allocOnRanks(t, comms, 4*block)
	at := func(r int, off int) Buffer { return DeviceBuffer(syms[r] + cuda.DevicePtr(off)) }
	for _, c := range []struct {
		name     string
		collect  coll.Collective
		in, out  func(r int) Buffer
		zeroCopy func(r int) bool
	}{
		// out == in on every rank: in place on rank 0 only; rank 1 writes
		// chunk 0 of its input, which rank 0 reads.
		{"reduce-scatter, out = in", coll.ReduceScatter, func(r int) Buffer { return at(r, 0) }, func(r int) Buffer { return at(r, 0) }, func(r int) bool { return r == 0 }},
		{"reduce-scatter, out = in + 4", coll.ReduceScatter, func(r int) Buffer { return at(r, 0) }, func(r int) Buffer { return at(r, 4) }, func(int) bool { return false }},
		{"reduce-scatter in place", coll.ReduceScatter, func(r int) Buffer { return at(r, 0) }, func(r int) Buffer { return at(r, r*block) }, func(int) bool { return true }},
		// in == out on every rank: in place on rank 0 (staged already);
		// rank 1 writes rank 0's block over its own input.
		{"all-gather, in = out", coll.AllGather, func(r int) Buffer { return at(r, 0) }, func(r int) Buffer { return at(r, 0) }, func(int) bool { return false }},
		{"all-gather, out = in + 4", coll.AllGather, func(r int) Buffer { return at(r, 0) }, func(r int) Buffer { return at(r, 4) }, func(int) bool { return false }},
		{"all-gather, out ends inside in", coll.AllGather, func(r int) Buffer { return at(r, 2*block) }, func(r int) Buffer { return at(r, 4) }, func(int) bool { return false }},
		{"all-gather, separate", coll.AllGather, func(r int) Buffer { return at(r, 2*block) }, func(r int) Buffer { return at(r, 0) }, func(int) bool { return true }},
	} {
		for r, cm := range comms {
			p, err := cm.Explain(c.collect, c.in(r), c.out(r), count, coll.F32, coll.Sum, Options{Algorithm: coll.OneShot})
			if err != nil || p.ZeroCopy != c.zeroCopy(r) {
				t.Errorf("%s, rank %d: plan %+v, %v; want zero-copy %v", c.name, r, p, err, c.zeroCopy(r))
			}
		}
	}
}
