package comm

import (
	"errors"
	"maps"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestExplainHostOverlap: the host refuses input and output that overlap
// other than in place (ErrInvalidArgument); Explain, which "resolves a call
// exactly as" the call would, must refuse the same arguments, and still
// plan the in-place layouts.
func TestExplainHostOverlap(t *testing.T) {
	const world = 2
	comms := hostComms(t, rendezvous.NewMemStore(), world, "explainoverlap")
	defer closeAll(t, comms)
	mem := make([][]byte, world)
	for r := range mem {
		mem[r] = make([]byte, 1024)
	}
	cases := []struct {
		name       string
		collective coll.Collective
		in, out    func(r int) Buffer
		count      int
		refused    bool
	}{
		{"all-reduce shifted", coll.AllReduce, func(r int) Buffer { return HostBuffer(mem[r][:256]) }, func(r int) Buffer { return HostBuffer(mem[r][64:320]) }, 64, true},
		{"all-reduce in place", coll.AllReduce, func(r int) Buffer { return HostBuffer(mem[r][:256]) }, func(r int) Buffer { return HostBuffer(mem[r][:256]) }, 64, false},
		{"all-gather at 64", coll.AllGather, func(r int) Buffer { return HostBuffer(mem[r][64:192]) }, func(r int) Buffer { return HostBuffer(mem[r][:256]) }, 32, true},
		{"all-gather in place", coll.AllGather, func(r int) Buffer { return HostBuffer(mem[r][r*128 : r*128+128]) }, func(r int) Buffer { return HostBuffer(mem[r][:256]) }, 32, false},
		{"reduce-scatter at 64", coll.ReduceScatter, func(r int) Buffer { return HostBuffer(mem[r][:256]) }, func(r int) Buffer { return HostBuffer(mem[r][64:192]) }, 32, true},
		{"reduce-scatter in place", coll.ReduceScatter, func(r int) Buffer { return HostBuffer(mem[r][:256]) }, func(r int) Buffer { return HostBuffer(mem[r][r*128 : r*128+128]) }, 32, false},
	}
	for _, tc := range cases {
		var o Options
		errs := onRanks(comms, func(r int, c *Communicator) error {
			switch tc.collective {
			case coll.AllReduce:
				return c.AllReduce(tc.in(r), tc.out(r), tc.count, coll.F32, coll.Sum, o)
			case coll.ReduceScatter:
				return c.ReduceScatter(tc.in(r), tc.out(r), tc.count, coll.F32, coll.Sum, o)
			}
			return c.AllGather(tc.in(r), tc.out(r), tc.count, coll.F32, o)
		})
		for r, c := range comms {
			if tc.refused != errors.Is(errs[r], ErrInvalidArgument) {
				t.Fatalf("%s: rank %d's call: %v (refusal expected: %v)", tc.name, r, errs[r], tc.refused)
			}
			p, err := c.Explain(tc.collective, tc.in(r), tc.out(r), tc.count, coll.F32, coll.Sum, o)
			if tc.refused && !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%s: rank %d: Explain = %+v, %v; the call refuses it (%v)", tc.name, r, p, err, errs[r])
			}
			if !tc.refused && (err != nil || p.Algorithm == "") {
				t.Errorf("%s: rank %d: Explain = %+v, %v; the call runs it", tc.name, r, p, err)
			}
		}
	}
}

// TestExplainHostNoReduceLoop: a library whose host_shm topology lacks a
// dtype's reduce loop makes the host refuse that reduction
// (ErrInvalidArgument); Explain must refuse it too.
func TestExplainHostNoReduceLoop(t *testing.T) {
	reducers := maps.Clone(collectives.Library.HostReducers)
	delete(reducers, kernels.HostKey{DType: coll.F64, Op: coll.Max})
	lib := &kernels.Library{Package: collectives.Library.Package, Kernels: collectives.Library.Kernels,
		Selections: collectives.Library.Selections, Sources: collectives.Library.Sources,
		HostReducers: reducers, MaxBlocks: collectives.Library.MaxBlocks}
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "explainloops", func(c *Config) { c.Library = lib })
	defer closeAll(t, comms)
	in, out := HostBuffer(make([]byte, 256)), HostBuffer(make([]byte, 256))
	for _, alg := range []coll.Algorithm{coll.Auto, coll.TwoShot} {
		o := Options{Algorithm: alg}
		errs := onRanks(comms, func(_ int, c *Communicator) error {
			return c.AllReduce(in, out, 32, coll.F64, coll.Max, o)
		})
		if !errors.Is(errs[0], ErrInvalidArgument) {
			t.Fatalf("%s: the call: %v; want ErrInvalidArgument", alg, errs[0])
		}
		p, err := comms[0].Explain(coll.AllReduce, in, out, 32, coll.F64, coll.Max, o)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: Explain = %+v, %v; the call refuses it (%v)", alg, p, err, errs[0])
		}
		// Another op of the same dtype still plans.
		if _, err := comms[0].Explain(coll.AllReduce, in, out, 32, coll.F64, coll.Sum, o); err != nil {
			t.Errorf("%s: Explain of f64 sum: %v", alg, err)
		}
	}
}

// TestHostOverlapDebugCheck: with the debug check on, ranks that all pass
// overlapping buffers agree on the refusal (its text names no rank), so
// each gets ErrInvalidArgument, not ErrMismatch.
func TestHostOverlapDebugCheck(t *testing.T) {
	t.Setenv(EnvDebugCheck, "1")
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "overlapcheck")
	defer closeAll(t, comms)
	errs := onRanks(comms, func(_ int, c *Communicator) error {
		mem := make([]byte, 512)
		return c.AllReduce(HostBuffer(mem[:256]), HostBuffer(mem[64:320]), 64, coll.F32, coll.Sum, Options{})
	})
	for r, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: %v; want ErrInvalidArgument", r, err)
		}
	}
}
