package schedule

import (
	"strings"
	"testing"
)

// testWorlds are the world sizes the simulator covers: every size up to 16
// and the edges of the host backend's range.
var testWorlds = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 31, 32, 63, 64}

// TestSimulateEveryCombination runs every schedule for every world size it
// exists at, over element counts that are tiny, odd, not divisible by the
// world size, and large enough for many vectors per chunk.
func TestSimulateEveryCombination(t *testing.T) {
	for _, coll := range Collectives() {
		for _, alg := range Algorithms(coll) {
			for _, w := range testWorlds {
				s, err := Build(coll, alg, w)
				if err != nil {
					if alg == HCM && w != 8 {
						continue
					}
					t.Fatalf("Build(%s, %s, %d): %v", coll, alg, w, err)
				}
				var counts []int
				if coll == AllReduce {
					counts = []int{0, 1, 2, 3, w - 1, w, w + 1, 7*w + 3, 1000, 8*w*8 + 5}
				} else {
					counts = []int{0, w, 3 * w, 13 * w, 64 * w}
				}
				for _, n := range counts {
					if n < 0 {
						continue
					}
					for _, vec := range []int{1, 8} {
						if err := Simulate(s, n, vec); err != nil {
							t.Errorf("n=%d vec=%d: %v", n, vec, err)
						}
					}
				}
			}
		}
	}
}

func TestLinksHybridCubeMesh(t *testing.T) {
	hcm, err := NewTopology(KindHybridCubeMesh, 8)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Build(AllReduce, HCM, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckLinks(s, hcm); err != nil {
		t.Errorf("hcm schedule on the hybrid cube mesh: %v", err)
	}
	for _, alg := range []string{OneShot, TwoShot} {
		s, _ := Build(AllReduce, alg, 8)
		err := CheckLinks(s, hcm)
		if err == nil || !strings.Contains(err.Error(), "has no link") {
			t.Errorf("%s on the hybrid cube mesh: got %v, want a missing-link error", alg, err)
		}
	}
	want := "allreduce_oneshot_w8 phase 1 step 0: rank 5 reads stage of rank 0, but hybrid_cube_mesh has no link 5-0"
	s1, _ := Build(AllReduce, OneShot, 8)
	if err := CheckLinks(s1, hcm); err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

func TestCanRun(t *testing.T) {
	cases := []struct {
		kind, coll, alg string
		w               int
		want            string
	}{
		{KindNVLinkFull, AllReduce, OneShot, 4, ""},
		{KindNVLinkFull, AllReduce, HCM, 4, "hcm needs world size 8"},
		{KindHybridCubeMesh, AllReduce, HCM, 8, ""},
		{KindHybridCubeMesh, AllReduce, TwoShot, 8, "has no link"},
		{KindHybridCubeMesh, AllReduce, HCM, 4, "has exactly [8] ranks"},
		{KindHostShm, AllGather, OneShot, 64, ""},
		{KindHostShm, AllGather, OneShot, 65, "1 to 64"},
		{KindPCIe, ReduceScatter, "ring", 2, "unknown reduce_scatter algorithm"},
		{"torus", AllReduce, OneShot, 2, "unknown topology kind"},
	}
	for _, c := range cases {
		err := CanRun(c.kind, c.coll, c.alg, c.w)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CanRun(%s, %s, %s, %d) = %v, want %q", c.kind, c.coll, c.alg, c.w, err, c.want)
		}
	}
}

// TestCheckersCatchBrokenSchedules makes sure the checkers can fail: a
// schedule with its barrier removed races, and one that reduces a chunk
// twice is caught by the simulator.
func TestCheckersCatchBrokenSchedules(t *testing.T) {
	s, _ := Build(AllReduce, TwoShot, 4)
	s.Phases[0].Sync = false
	merged := &Schedule{Collective: s.Collective, Algorithm: "broken", World: 4, InChunks: 4, OutChunks: 4,
		Phases: []Phase{{Steps: append(append([]Step{}, s.Phases[0].Steps...), s.Phases[1].Steps...), Sync: true}, s.Phases[2]}}
	if err := CheckRaces(merged); err == nil || !strings.Contains(err.Error(), "same phase") {
		t.Errorf("merged phases: got %v, want a race", err)
	}
	d, _ := Build(AllReduce, OneShot, 3)
	d.Phases[1].Steps[0].Srcs = append(d.Phases[1].Steps[0].Srcs, d.Phases[1].Steps[0].Srcs[0])
	if err := Simulate(d, 30, 1); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("double contribution: got %v", err)
	}
	o, _ := Build(AllReduce, OneShot, 3)
	o.Phases[1].Steps[1].Srcs[0], o.Phases[1].Steps[1].Srcs[1] = o.Phases[1].Steps[1].Srcs[1], o.Phases[1].Steps[1].Srcs[0]
	if err := Simulate(o, 30, 1); err == nil || !strings.Contains(err.Error(), "different order") {
		t.Errorf("rank-dependent order: got %v", err)
	}
	e, _ := Build(AllGather, OneShot, 2)
	e.Phases[len(e.Phases)-1].Sync = false
	if err := Validate(e); err == nil || !strings.Contains(err.Error(), "last phase has no barrier") {
		t.Errorf("missing final barrier: got %v", err)
	}
}

func TestFinalBarrierRemovable(t *testing.T) {
	for _, coll := range Collectives() {
		for _, alg := range Algorithms(coll) {
			w := 4
			if alg == HCM {
				w = 8
			}
			s, _ := Build(coll, alg, w)
			if !FinalBarrierRemovable(s) {
				t.Errorf("%s: final barrier not removable", s.Name())
			}
		}
	}
	s, _ := Build(AllReduce, TwoShot, 4)
	s.Phases[0].Steps = append(s.Phases[0].Steps, Step{Kind: Copy, Dst: Ref{Buf: Scratch, Rank: Self, Chunk: Self},
		Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: Self}}})
	if FinalBarrierRemovable(s) {
		t.Error("a scratch write before the first barrier must keep the final barrier")
	}
	one := &Schedule{Collective: AllGather, Algorithm: "x", World: 2, Phases: []Phase{{Sync: true}}}
	if FinalBarrierRemovable(one) {
		t.Error("a single barrier cannot be removed")
	}
}
