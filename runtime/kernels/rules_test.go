package kernels

import (
	"slices"
	"testing"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/schedule"
)

// TestLaunchBlockNoUnits: a launch of no work still gets one block (a grid
// of 0 blocks is a CUDA launch error).
func TestLaunchBlockNoUnits(t *testing.T) {
	for _, l := range []Launch{{Threads: 256, MaxBlocks: 128}, {Threads: 512, MaxBlocks: 128, MinThreads: 256}} {
		if b, th := l.Block(0); b != 1 || th <= 0 {
			t.Errorf("%+v.Block(0) = %d blocks x %d threads, want 1 block", l, b, th)
		}
	}
}

// TestVecElems: a vector holds VectorBytes/elemSize elements, down to 2,
// and 1 where an element is as wide as a vector or wider.
func TestVecElems(t *testing.T) {
	for _, c := range []struct {
		vector, elem int
		want         int64
	}{{16, 2, 8}, {16, 4, 4}, {8, 4, 2}, {4, 2, 2}, {8, 8, 1}, {4, 8, 1}, {0, 4, 1}} {
		k := &Kernel{Launch: Launch{VectorBytes: c.vector}}
		if got := k.VecElems(c.elem); got != c.want {
			t.Errorf("VectorBytes %d, element %d bytes: VecElems = %d, want %d", c.vector, c.elem, got, c.want)
		}
	}
}

// TestThreadUnitsPartialVector: a barrier kernel's chunk that ends in a
// partial vector needs a thread for that vector too.
func TestThreadUnitsPartialVector(t *testing.T) {
	k := &Kernel{Launch: Launch{VectorBytes: 16}}
	// 32 vectors of 8 bf16 and one element more: 33 vectors, two warps.
	if got := k.ThreadUnits(32*8+1, 2); got != 64 {
		t.Errorf("ThreadUnits(257 bf16) = %d, want 33 vectors rounded up to 64", got)
	}
	if got := k.ThreadUnits(32*8, 2); got != 32 {
		t.Errorf("ThreadUnits(256 bf16) = %d, want 32", got)
	}
	p := &Kernel{Protocol: coll.LL}
	// 100 f32: 400 bytes, 50 LL lines of 16 bytes, rounded up to 64.
	if got := p.ThreadUnits(100, 4); got != 64 {
		t.Errorf("LL ThreadUnits(100 f32) = %d, want 50 lines rounded up to 64", got)
	}
}

// TestRounds: barrier kernels always run in rounds; push kernels only
// with PushRounds, and of those only the reduce-scatter's and
// all-gather's change their split in rounds (AlignedRounds).
func TestRounds(t *testing.T) {
	for _, c := range []struct {
		k             Kernel
		rounds, align bool
	}{
		{Kernel{Collective: coll.AllReduce}, true, false},
		{Kernel{Collective: coll.ReduceScatter, PushRounds: true}, true, false}, // barrier: PushRounds does not matter
		{Kernel{Collective: coll.AllReduce, Protocol: coll.LL}, false, false},
		{Kernel{Collective: coll.ReduceScatter, Protocol: coll.LL128}, false, false},
		{Kernel{Collective: coll.AllReduce, Protocol: coll.LL128, PushRounds: true}, true, false},
		{Kernel{Collective: coll.ReduceScatter, Protocol: coll.LL128, PushRounds: true}, true, true},
		{Kernel{Collective: coll.AllGather, Protocol: coll.LL, PushRounds: true}, true, true},
	} {
		if r, a := c.k.Rounds(), c.k.AlignedRounds(); r != c.rounds || a != c.align {
			t.Errorf("%s %q PushRounds %v: Rounds %v, AlignedRounds %v; want %v, %v",
				c.k.Collective, c.k.Protocol, c.k.PushRounds, r, a, c.rounds, c.align)
		}
	}
}

// TestChoose: the first rule whose inclusive bound covers the size wins,
// symmetric rules only for symmetric inputs, and NCCL past the last bound.
func TestChoose(t *testing.T) {
	s := &Selection{Rules: []Rule{
		{UpTo: 1 << 10, Use: coll.OneShotLL},
		{UpTo: 1 << 20, Use: coll.OneShot, Symmetric: true},
		{UpTo: 4 << 20, Use: coll.TwoShot},
	}}
	for _, c := range []struct {
		bytes     int64
		symmetric bool
		want      coll.Algorithm
	}{
		{1, false, coll.OneShotLL},
		{1 << 10, false, coll.OneShotLL},
		{1 << 10, true, coll.OneShotLL},
		{1<<10 + 1, false, coll.TwoShot},
		{1<<10 + 1, true, coll.OneShot},
		{1 << 20, true, coll.OneShot},
		{1<<20 + 1, true, coll.TwoShot},
		{4 << 20, false, coll.TwoShot},
		{4<<20 + 1, false, coll.NCCL},
		{4<<20 + 1, true, coll.NCCL},
	} {
		if got := s.Choose(c.bytes, c.symmetric); got != c.want {
			t.Errorf("Choose(%d, symmetric %v) = %q, want %q", c.bytes, c.symmetric, got, c.want)
		}
	}
	s.Rules = append(s.Rules, Rule{Use: coll.TwoShotLL128}) // unbounded
	if got := s.Choose(1<<40, false); got != coll.TwoShotLL128 {
		t.Errorf("Choose(1 TiB) past an unbounded rule = %q, want %q", got, coll.TwoShotLL128)
	}
}

// testLibrary: an all-reduce one-shot (barrier) at worlds 2 and 8, an LL
// one-shot without rounds and an LL128 two-shot with rounds at world 2,
// and a reduce-scatter LL128 one-shot with (aligned) rounds at world 2.
func testLibrary() *Library {
	barrier := Launch{Threads: 512, MaxBlocks: 64, VectorBytes: 16}
	return &Library{
		Kernels: []Kernel{ // not in protocol order (Protocols sorts)
			{Name: "rs_osll128_w2", Collective: coll.ReduceScatter, Algorithm: coll.OneShotLL128, DType: coll.BF16, Op: coll.Sum, World: 2,
				Launch: barrier, Protocol: coll.LL128, InboxChunks: 2, PushRounds: true},
			{Name: "ar_os_w8_ll", Collective: coll.AllReduce, Algorithm: coll.OneShot, DType: coll.BF16, Op: coll.Sum, World: 8,
				Launch: barrier, Protocol: coll.LL, InboxChunks: 100},
			{Name: "ar_os_w2", Collective: coll.AllReduce, Algorithm: coll.OneShot, DType: coll.BF16, Op: coll.Sum, World: 2, Launch: barrier},
			{Name: "ar_os_w2_f32", Collective: coll.AllReduce, Algorithm: coll.OneShot, DType: coll.F32, Op: coll.Sum, World: 2, Launch: barrier},
			{Name: "ar_osll_w2", Collective: coll.AllReduce, Algorithm: coll.OneShotLL, DType: coll.BF16, Op: coll.Sum, World: 2,
				Launch: barrier, Protocol: coll.LL, InboxChunks: 2},
			{Name: "ar_tsll128_w2", Collective: coll.AllReduce, Algorithm: coll.TwoShotLL128, DType: coll.BF16, Op: coll.Sum, World: 2,
				Launch: barrier, Protocol: coll.LL128, InboxChunks: 2, PushRounds: true},
		},
		Selections: []Selection{
			{Topology: "pcie", Kind: coll.PCIeP2P, Collective: coll.AllReduce, Worlds: []int{2}, Rules: []Rule{{Use: coll.NCCL}}},
			{Topology: "a", Kind: coll.NVLinkFull, Collective: coll.AllReduce, Worlds: []int{4, 8}, Rules: []Rule{{Use: coll.TwoShot}}},
			{Topology: "b", Kind: coll.NVLinkFull, Collective: coll.AllReduce, Worlds: []int{2, 4}, Rules: []Rule{{Use: coll.OneShot}}},
			{Topology: "c", Kind: coll.NVLinkFull, Collective: coll.AllGather, Worlds: []int{2}, Rules: []Rule{{Use: coll.OneShot}}},
		},
	}
}

// TestSlotBound: a barrier kernel needs the whole buffer, at most
// WindowBytes (it runs in rounds); a push kernel without rounds its inbox,
// however large; only kernels of the asked world count.
func TestSlotBound(t *testing.T) {
	l := testLibrary()
	if got := l.SlotBound(coll.AllReduce, coll.OneShot, 2, 1<<20); got != 1<<20 {
		t.Errorf("barrier SlotBound(1 MiB) at world 2 = %d, want 1 MiB (world 8's LL kernel does not count)", got)
	}
	if got := l.SlotBound(coll.AllReduce, coll.OneShot, 2, 4*WindowBytes); got != WindowBytes {
		t.Errorf("barrier SlotBound(4 windows) = %d, want WindowBytes %d", got, WindowBytes)
	}
	big := int64(64 << 20)
	chunk := int64(schedule.ChunkElems(coll.AllReduce, int(big), 2, 16))
	if want, got := 2*InboxChunkBytes(coll.LL, chunk), l.SlotBound(coll.AllReduce, coll.OneShotLL, 2, big); got != want || want <= WindowBytes {
		t.Errorf("LL without rounds SlotBound(64 MiB) = %d, want its inbox %d (beyond WindowBytes)", got, want)
	}
	if got := l.SlotBound(coll.AllReduce, coll.TwoShotLL128, 2, big); got != WindowBytes {
		t.Errorf("LL128 with rounds SlotBound(64 MiB) = %d, want WindowBytes", got)
	}
	// A rule's upto near 2^63 (the spec takes it) needs at least what 1 TiB
	// does: the inbox arithmetic overflowed to 0 from 2^62.
	tib := l.SlotBound(coll.AllReduce, coll.OneShotLL, 2, 1<<40)
	for _, huge := range []int64{1 << 62, 1<<63 - 1} {
		if got := l.SlotBound(coll.AllReduce, coll.OneShotLL, 2, huge); got < tib || tib < 1<<40 {
			t.Errorf("LL without rounds SlotBound(%d) = %d, want at least SlotBound(1 TiB) = %d", huge, got, tib)
		}
	}
	if got := l.SlotBound(coll.AllReduce, coll.TwoShot, 2, big); got != 0 {
		t.Errorf("SlotBound of an algorithm without kernels = %d, want 0", got)
	}
	if !l.Windowed(coll.AllReduce, coll.OneShot, 2) || l.Windowed(coll.AllReduce, coll.OneShotLL, 2) ||
		!l.Windowed(coll.AllReduce, coll.TwoShotLL128, 2) || l.Windowed(coll.AllReduce, coll.TwoShot, 2) {
		t.Error("Windowed: want barrier and push-with-rounds kernels only")
	}
}

// TestRulesSlotBounds: unbounded rules count WindowBytes for kernels with
// rounds and nothing for push kernels without (UnboundedPush reports
// those); the floor is what rounds cannot shrink.
func TestRulesSlotBounds(t *testing.T) {
	l := testLibrary()
	s := &Selection{Collective: coll.AllReduce, Rules: []Rule{
		{UpTo: 64 << 10, Use: coll.OneShotLL},
		{UpTo: 1 << 20, Use: coll.OneShot, Symmetric: true}, // read in place: no staging
		{UpTo: 2 << 20, Use: coll.TwoShotLL128},
		{UpTo: 4 << 20, Use: coll.NCCL},
		{Use: coll.OneShot},
	}}
	ll := l.SlotBound(coll.AllReduce, coll.OneShotLL, 2, 64<<10)
	ll128 := l.SlotBound(coll.AllReduce, coll.TwoShotLL128, 2, 2<<20)
	want := map[coll.Protocol]AreaNeed{
		coll.Barrier: {Need: WindowBytes},     // unbounded, in rounds: no floor
		coll.LL:      {Need: ll, Floor: ll},   // no rounds: all of it is floor
		coll.LL128:   {Need: ll128, Floor: 0}, // all-reduce's rounds keep its split
	}
	if got := l.RulesSlotBounds(s, 2); !mapsEqual(got, want) {
		t.Errorf("RulesSlotBounds = %v, want %v", got, want)
	}
	if a, ok := l.UnboundedPush(s, 2); ok {
		t.Errorf("UnboundedPush = %q: the unbounded rule's kernel runs in rounds", a)
	}

	// An unbounded rule to the LL one-shot (no rounds) counts nothing here
	// and is UnboundedPush's.
	s.Rules[len(s.Rules)-1].Use = coll.OneShotLL
	if got := l.RulesSlotBounds(s, 2); got[coll.Barrier] != (AreaNeed{}) || got[coll.LL] != want[coll.LL] {
		t.Errorf("with an unbounded LL rule: RulesSlotBounds = %v, want barrier nothing and LL %v", got, want[coll.LL])
	}
	if a, ok := l.UnboundedPush(s, 2); !ok || a != coll.OneShotLL {
		t.Errorf("UnboundedPush = %q, %v; want oneshot_ll", a, ok)
	}

	// A bounded rule to an aligned-rounds kernel (reduce-scatter's LL128
	// one-shot) keeps its one-round need as floor; an unbounded one does not.
	rs := &Selection{Collective: coll.ReduceScatter, Rules: []Rule{{UpTo: 1 << 20, Use: coll.OneShotLL128}}}
	need := l.SlotBound(coll.ReduceScatter, coll.OneShotLL128, 2, 1<<20)
	if got := l.RulesSlotBounds(rs, 2); got[coll.LL128] != (AreaNeed{need, need}) || need == 0 {
		t.Errorf("bounded aligned-rounds rule: %v, want LL128 need and floor %d", got, need)
	}
	rs.Rules[0].UpTo = 0
	if got := l.RulesSlotBounds(rs, 2); got[coll.LL128] != (AreaNeed{Need: WindowBytes}) {
		t.Errorf("unbounded aligned-rounds rule: %v, want LL128 need WindowBytes, no floor", got)
	}
}

func mapsEqual(a, b map[coll.Protocol]AreaNeed) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestLibraryLookups: Selection matches kind, collective and world, the
// first in spec order; Kernel matches every attribute; Protocols lists a
// world's protocols sorted.
func TestLibraryLookups(t *testing.T) {
	l := testLibrary()
	for _, c := range []struct {
		kind  coll.TopologyKind
		c     coll.Collective
		world int
		want  string // topology, "" for none
	}{
		{coll.NVLinkFull, coll.AllReduce, 2, "b"},
		{coll.NVLinkFull, coll.AllReduce, 4, "a"},
		{coll.NVLinkFull, coll.AllReduce, 8, "a"},
		{coll.NVLinkFull, coll.AllReduce, 3, ""},
		{coll.PCIeP2P, coll.AllReduce, 2, "pcie"},
		{coll.PCIeP2P, coll.AllReduce, 4, ""},
		{coll.NVLinkFull, coll.AllGather, 2, "c"},
		{coll.NVLinkFull, coll.ReduceScatter, 2, ""},
	} {
		s, ok := l.Selection(c.kind, c.c, c.world)
		if got := ""; ok {
			got = s.Topology
			if got != c.want {
				t.Errorf("Selection(%s, %s, %d) = %q, want %q", c.kind, c.c, c.world, got, c.want)
			}
		} else if c.want != "" {
			t.Errorf("Selection(%s, %s, %d) found none, want %q", c.kind, c.c, c.world, c.want)
		}
	}
	if k, ok := l.Kernel(coll.AllReduce, coll.OneShot, coll.F32, coll.Sum, 2); !ok || k.Name != "ar_os_w2_f32" {
		t.Errorf("Kernel(f32 one-shot, world 2) = %v, %v", k, ok)
	}
	if k, ok := l.Kernel(coll.AllReduce, coll.OneShot, coll.BF16, coll.Sum, 8); !ok || k.Name != "ar_os_w8_ll" {
		t.Errorf("Kernel(bf16 one-shot, world 8) = %v, %v", k, ok)
	}
	if k, ok := l.Kernel(coll.AllReduce, coll.OneShot, coll.BF16, coll.Max, 2); ok {
		t.Errorf("Kernel(max) found %s; the library has sum only", k.Name)
	}
	if got, want := l.Protocols(2), []coll.Protocol{coll.Barrier, coll.LL, coll.LL128}; !slices.Equal(got, want) {
		t.Errorf("Protocols(2) = %q, want %q", got, want)
	}
	if got, want := l.Protocols(8), []coll.Protocol{coll.LL}; !slices.Equal(got, want) {
		t.Errorf("Protocols(8) = %q, want %q", got, want)
	}
	if k, ok := l.AlgorithmKernel(coll.AllReduce, coll.OneShot, 2); !ok || k.World != 2 {
		t.Errorf("AlgorithmKernel(one-shot, world 2) = %v, %v", k, ok)
	}
}

// TestScratchElemBytes: f32 accumulators only for 2-byte floats of a
// kernel whose scratch holds accumulators.
func TestScratchElemBytes(t *testing.T) {
	acc, own := &Kernel{ScratchAcc: true}, &Kernel{}
	for _, c := range []struct {
		k    *Kernel
		dt   coll.DType
		want int
	}{{acc, coll.BF16, 4}, {acc, coll.F16, 4}, {acc, coll.F64, 8}, {acc, coll.F32, 4}, {own, coll.BF16, 2}, {own, coll.F64, 8}} {
		if got := c.k.ScratchElemBytes(c.dt); got != c.want {
			t.Errorf("ScratchAcc %v, %s: %d bytes, want %d", c.k.ScratchAcc, c.dt, got, c.want)
		}
	}
}
