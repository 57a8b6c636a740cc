package comm

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/kernels"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestSharedBlocks: no cap when every rank has its own GPU; the SMs over
// the most ranks of one GPU otherwise, and at least one block.
func TestSharedBlocks(t *testing.T) {
	for _, c := range []struct {
		ids  []string
		sms  int
		want int
	}{
		{[]string{"a", "b", "c", "d"}, 132, 0},
		{[]string{"a", "a", "b", "b"}, 132, 66},
		{[]string{"a", "a", "a", "b"}, 132, 44},
		{[]string{"a", "a", "a", "a"}, 2, 1}, // fewer SMs than ranks: still one block each
	} {
		if got := sharedBlocks(&Detected{BusIDs: c.ids}, c.sms); got != c.want {
			t.Errorf("sharedBlocks(%q, %d SMs) = %d, want %d", c.ids, c.sms, got, c.want)
		}
	}
	if got := sharedBlocks(nil, 132); got != 0 {
		t.Errorf("sharedBlocks(nil) = %d, want 0", got)
	}
}

// TestSlotNeed: a message that fits the area needs what the kernel says
// (the whole buffer, exactly the area included, or the inbox); a barrier
// message over the area, or a push chunk over it, area+1, without the
// multiplication that overflows for a huge count.
func TestSlotNeed(t *testing.T) {
	const area = 1 << 20
	barrier := &kernels.Kernel{Launch: kernels.Launch{VectorBytes: 16}}
	ll := &kernels.Kernel{Protocol: coll.LL, InboxChunks: 2, Launch: kernels.Launch{VectorBytes: 16}}
	for _, c := range []struct {
		k                 *kernels.Kernel
		bytes, chunkBytes int64
		want              int64
	}{
		{barrier, area, area / 2, area},
		{barrier, area + 1, area / 2, area + 1},
		{ll, area / 4, area / 8, 2 * area / 4},
		{ll, 4 * area, area / 4, 2 * (area / 2)}, // over the area, its inbox fits: computed
		{ll, 4 * area, area + 8, area + 1},
		{ll, 1 << 62, 1 << 61, area + 1}, // 2 x 2^62 inbox bytes would overflow
	} {
		if got := slotNeed(c.k, c.bytes, c.chunkBytes, area); got != c.want {
			t.Errorf("slotNeed(%q, %d, %d, %d) = %d, want %d", c.k.Protocol, c.bytes, c.chunkBytes, area, got, c.want)
		}
	}
}

// TestInPlaceStagedBounds: an all-reduce or all-gather is staged only when
// its output overlaps its input, not when they merely touch (an
// all-gather's input at another rank's block, or anywhere in the output,
// would be overwritten while peers read it in place); a reduce-scatter
// only when its output overlaps its input other than at this rank's chunk.
func TestInPlaceStagedBounds(t *testing.T) {
	ar := func(in, out, n int64) *call {
		c := &call{collective: coll.AllReduce, inBytes: n, outBytes: n}
		c.in.dev, c.out.dev = 0x10000+cuda.DevicePtr(in), 0x10000+cuda.DevicePtr(out)
		return c
	}
	for _, c := range []struct {
		in, out int64
		want    bool
	}{
		{0, 0, true},        // in place
		{0, 256, true},      // output starts inside the input
		{256, 0, true},      // input starts inside the output
		{0, 1024, false},    // output just after the input
		{1024, 0, false},    // input just after the output
		{0, 1 << 20, false}, // apart
	} {
		if got := inPlaceStaged(ar(c.in, c.out, 1024), 1); got != c.want {
			t.Errorf("all-reduce of 1024 bytes, input at +%d, output at +%d: staged %v, want %v", c.in, c.out, got, c.want)
		}
	}
	ag := &call{collective: coll.AllGather, inBytes: 1024, outBytes: 4096}
	ag.out.dev = 0x10000
	for _, c := range []struct {
		in   int64
		want bool
	}{{2048, true}, {1024, true}, {0, true}, {4096, false}, {1 << 20, false}} {
		ag.in.dev = 0x10000 + cuda.DevicePtr(c.in)
		if got := inPlaceStaged(ag, 2); got != c.want {
			t.Errorf("rank 2's all-gather with input at output+%d: staged %v, want %v", c.in, got, c.want)
		}
	}
	rs := ar(0, 0, 1024)
	rs.collective = coll.ReduceScatter
	if inPlaceStaged(rs, 0) {
		t.Error("an in-place reduce-scatter is staged; it reads in place safely")
	}
	if !inPlaceStaged(rs, 1) {
		t.Error("rank 1's reduce-scatter writing chunk 0 of its input is not staged; rank 0 reads that chunk in place")
	}
}

// TestFakeAutoScratchOverflowNotInPlace: an automatic choice of two-shot
// for a symmetric input larger than its scratch does not count the input
// read in place as making it fit (two-shot reduces into the scratch): it
// goes elsewhere, where the explicit choice is refused.
func TestFakeAutoScratchOverflowNotInPlace(t *testing.T) {
	comms, _ := fakeComms(t, 2, Config{StagingBytes: 1 << 20})
	defer closeAll(t, comms)
	const n = 1 << 20 // f32: 4 MiB, over the 1 MiB scratch
	syms := allocOnRanks(t, comms, 4*n)
	g := comms[0].gpu
	g.sels[coll.AllReduce] = &kernels.Selection{Collective: coll.AllReduce, Rules: []kernels.Rule{{Use: coll.TwoShot}}}
	p, err := comms[0].Explain(coll.AllReduce, DeviceBuffer(syms[0]), DeviceBuffer(0x9000), n, coll.F32, coll.Sum, Options{})
	if err == nil && p.Algorithm == coll.TwoShot {
		t.Errorf("auto two-shot of 4 MiB, symmetric input, 1 MiB scratch: plan %+v; want it sent elsewhere", p)
	}
	if _, err := comms[0].Explain(coll.AllReduce, DeviceBuffer(syms[0]), DeviceBuffer(0x9000), n/8, coll.F32, coll.Sum, Options{}); err != nil {
		t.Errorf("auto two-shot of 512 KiB: %v", err)
	}
}

// TestHostBufferOneByteShort: a host buffer one byte shorter than the
// call's elements is refused.
func TestHostBufferOneByteShort(t *testing.T) {
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "short")
	defer closeAll(t, comms)
	buf := HostBuffer(make([]byte, 64))
	if err := comms[0].AllReduce(HostBuffer(make([]byte, 63)), buf, 16, coll.F32, coll.Sum, Options{}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "the input has 63 bytes; 16 f32 elements need 64") {
		t.Errorf("63-byte input for 16 f32: %v, want ErrInvalidArgument", err)
	}
}

// TestZeroCountPlansNothing: a call of no elements is valid and chooses
// no algorithm, even one the backend would refuse for a real call.
func TestZeroCountPlansNothing(t *testing.T) {
	comms := hostComms(t, rendezvous.NewMemStore(), 2, "zero")
	defer closeAll(t, comms)
	buf := HostBuffer(make([]byte, 64))
	for _, alg := range []coll.Algorithm{coll.Auto, coll.NCCL, coll.OneShotLL} {
		if err := comms[0].AllReduce(buf, buf, 0, coll.F32, coll.Sum, Options{Algorithm: alg}); err != nil {
			t.Errorf("count 0, algorithm %q: %v", alg, err)
		}
		if p, err := comms[0].Explain(coll.AllReduce, buf, buf, 0, coll.F32, coll.Sum, Options{Algorithm: alg}); err != nil || p != (Plan{}) {
			t.Errorf("Explain of count 0, algorithm %q: %+v, %v; want the zero Plan", alg, p, err)
		}
	}
}

// TestFitAreasExactBudget: areas that fill the budget exactly are not
// cut; push areas are cut first when barrier areas alone fit exactly.
func TestFitAreasExactBudget(t *testing.T) {
	protos := []coll.Protocol{coll.Barrier, coll.LL128}
	needs := map[coll.Protocol]kernels.AreaNeed{coll.Barrier: {Need: 2 << 20}, coll.LL128: {Need: 3<<20 + 100}}
	full := int64(3*(2<<20) + 2*(3<<20+256)) // two slots of each area and a scratch as large as the barrier area
	areas, scr := fitAreas(protos, needs, true, full)
	if areas[coll.Barrier] != 2<<20 || areas[coll.LL128] != 3<<20+256 || scr != 2<<20 {
		t.Errorf("budget %d, exactly the needs: areas %v, scratch %d; want them uncut", full, areas, scr)
	}
	// The barrier area and scratch with LL128 at minArea fill the budget
	// exactly: only LL128 is cut.
	tight := int64(3*(2<<20) + 2*minArea)
	areas, scr = fitAreas(protos, needs, true, tight)
	if areas[coll.Barrier] != 2<<20 || areas[coll.LL128] != minArea || scr != 2<<20 {
		t.Errorf("budget %d: areas %v, scratch %d; want barrier uncut, LL128 at minArea", tight, areas, scr)
	}
	// The same with a barrier need above the push one (the barrier area
	// then sets the search's bound): still only LL128 is cut.
	needs[coll.Barrier] = kernels.AreaNeed{Need: 4 << 20}
	tight = 3*(4<<20) + 2*minArea
	areas, scr = fitAreas(protos, needs, true, tight)
	if areas[coll.Barrier] != 4<<20 || areas[coll.LL128] != minArea || scr != 4<<20 {
		t.Errorf("budget %d: areas %v, scratch %d; want barrier uncut at 4 MiB, LL128 at minArea", tight, areas, scr)
	}
	if areas, _ := fitAreas(protos, needs, true, math.MaxInt64); areas[coll.LL128] != 3<<20+256 {
		t.Errorf("unbounded budget: areas %v", areas)
	}
}
