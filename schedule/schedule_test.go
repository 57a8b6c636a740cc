package schedule

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
)

// testWorlds are the world sizes the simulator covers: every size up to 16
// and the edges of the host backend's range.
var testWorlds = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 31, 32, 63, 64}

// TestSimulateEveryCombination runs every schedule for every world size it
// exists at, over element counts that are tiny, odd, not divisible by the
// world size, and large enough for many vectors per chunk. Algorithms whose
// schedules are identical at every world size (an LL128 schedule and its LL
// twin) are simulated once, and each group runs as a parallel subtest.
func TestSimulateEveryCombination(t *testing.T) {
	for _, c := range coll.Collectives() {
		for _, g := range identicalSchedules(t, c) {
			t.Run(g.name, func(t *testing.T) {
				t.Parallel()
				mem := &arena{}
				for _, s := range g.scheds {
					// Validate and CheckRaces depend only on the schedule:
					// once, not once per size.
					if err := Validate(s); err != nil {
						t.Fatal(err)
					}
					if err := CheckRaces(s); err != nil {
						t.Fatal(err)
					}
					if err := CheckSplit(s); err != nil {
						t.Fatal(err)
					}
					// Vector width only rounds all-reduce chunks (ChunkElems):
					// the other collectives' chunks are the per-rank count, so
					// one width covers them.
					w := s.World
					counts, vecs := []int{0, w, 3 * w, 13 * w, 64 * w}, []int{1}
					if c == coll.AllReduce {
						counts, vecs = []int{0, 1, 2, 3, w - 1, w, w + 1, 7*w + 3, 1000, 8*w*8 + 5}, []int{1, 8}
					}
					pushRoundsDone := false         // at worlds above 16, for one count
					split, rounds := RoundsSplit(s) // the kernel's split in rounds, once per schedule
					for _, n := range counts {
						for _, vec := range vecs {
							if err := simulate(s, n, vec, 0, Spread, mem); err != nil {
								t.Errorf("n=%d vec=%d: %v", n, vec, err)
							}
							wins := []int{1, 2, 5}
							if s.Protocol.Push() {
								// Three rounds reuse a slot (round 2 overwrites round
								// 0's places), which is what rounds add to a push
								// schedule; the order of its waits does not depend on
								// the count, so large worlds check it for one count.
								chunk := ChunkElems(c, n, w, vec)
								if chunk < 3 || (w > 16 && pushRoundsDone) {
									continue
								}
								pushRoundsDone = true
								wins = []int{(chunk + 2) / 3}
							}
							for _, win := range wins { // rounds over windows (cg_window)
								var ow *OverwriteError
								if err := simulate(s, n, vec, win, split, mem); errors.As(err, &ow) && !rounds {
									continue // runs in one round: the next test
								} else if err != nil {
									t.Errorf("n=%d vec=%d window=%d: %v", n, vec, win, err)
								}
							}
						}
					}
				}
			})
		}
	}
}

// scheduleGroup is the schedules of one or more algorithms of a collective
// that are identical at every world size of testWorlds.
type scheduleGroup struct {
	name   string // the algorithms, joined by "+"
	scheds []*Schedule
}

// identicalSchedules builds every algorithm of c at every world size it
// exists at and groups the algorithms whose schedules are the same: same
// steps, chunk counts and kind of protocol (all the simulator reads).
func identicalSchedules(t *testing.T, c coll.Collective) []scheduleGroup {
	t.Helper()
	var groups []scheduleGroup
	byKey := map[string]int{}
	for _, alg := range Algorithms(c) {
		var key strings.Builder
		var scheds []*Schedule
		for _, w := range testWorlds {
			s, err := Build(c, alg, w)
			if err != nil {
				if alg == coll.HCM && w != 8 {
					continue
				}
				t.Fatalf("Build(%s, %s, %d): %v", c, alg, w, err)
			}
			_, steps, _ := strings.Cut(s.String(), "\n") // without the name
			fmt.Fprintf(&key, "w%d in%d out%d push %v\n%s", w, s.InChunks, s.OutChunks, s.Protocol.Push(), steps)
			scheds = append(scheds, s)
		}
		if i, ok := byKey[key.String()]; ok {
			groups[i].name += "+" + string(alg)
			continue
		}
		byKey[key.String()] = len(groups)
		groups = append(groups, scheduleGroup{name: string(c) + "/" + string(alg), scheds: scheds})
	}
	return groups
}

func TestLinksHybridCubeMesh(t *testing.T) {
	hcm, err := NewTopology(coll.HybridCubeMesh, 8)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Build(coll.AllReduce, coll.HCM, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckLinks(s, hcm); err != nil {
		t.Errorf("hcm schedule on the hybrid cube mesh: %v", err)
	}
	for _, alg := range []coll.Algorithm{coll.OneShot, coll.TwoShot} {
		s, _ := Build(coll.AllReduce, alg, 8)
		err := CheckLinks(s, hcm)
		if err == nil || !strings.Contains(err.Error(), "has no link") {
			t.Errorf("%s on the hybrid cube mesh: got %v, want a missing-link error", alg, err)
		}
	}
	want := "allreduce_oneshot_w8 phase 1 step 0: rank 5 reads stage of rank 0, but hybrid_cube_mesh has no link 5-0"
	s1, _ := Build(coll.AllReduce, coll.OneShot, 8)
	if err := CheckLinks(s1, hcm); err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

func TestCanRun(t *testing.T) {
	cases := []struct {
		kind coll.TopologyKind
		col  coll.Collective
		alg  coll.Algorithm
		w    int
		want string
	}{
		{coll.NVLinkFull, coll.AllReduce, coll.OneShot, 4, ""},
		{coll.NVLinkFull, coll.AllReduce, coll.HCM, 4, "hcm needs world size 8"},
		{coll.HybridCubeMesh, coll.AllReduce, coll.HCM, 8, ""},
		{coll.HybridCubeMesh, coll.AllReduce, coll.TwoShot, 8, "has no link"},
		{coll.HybridCubeMesh, coll.AllReduce, coll.HCM, 4, "has exactly [8] ranks"},
		{coll.HostSHM, coll.AllGather, coll.OneShot, 64, ""},
		{coll.HostSHM, coll.AllGather, coll.OneShot, 65, "1 to 64"},
		{coll.PCIeP2P, coll.ReduceScatter, "ring", 2, "unknown reduce_scatter algorithm"},
		{"torus", coll.AllReduce, coll.OneShot, 2, "unknown topology kind"},
	}
	for _, c := range cases {
		err := CanRun(c.kind, c.col, c.alg, c.w)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CanRun(%s, %s, %s, %d) = %v, want %q", c.kind, c.col, c.alg, c.w, err, c.want)
		}
	}
}

// TestCheckersCatchBrokenSchedules makes sure the checkers can fail: a
// schedule with its barrier removed races, and one that reduces a chunk
// twice is caught by the simulator.
func TestCheckersCatchBrokenSchedules(t *testing.T) {
	s, _ := Build(coll.AllReduce, coll.TwoShot, 4)
	s.Phases[0].Sync = false
	merged := &Schedule{Collective: s.Collective, Algorithm: "broken", World: 4, InChunks: 4, OutChunks: 4,
		Phases: []Phase{{Steps: append(append([]Step{}, s.Phases[0].Steps...), s.Phases[1].Steps...), Sync: true}, s.Phases[2]}}
	if err := CheckRaces(merged); err == nil || !strings.Contains(err.Error(), "same phase") {
		t.Errorf("merged phases: got %v, want a race", err)
	}
	d, _ := Build(coll.AllReduce, coll.OneShot, 3)
	d.Phases[1].Steps[0].Srcs = append(d.Phases[1].Steps[0].Srcs, d.Phases[1].Steps[0].Srcs[0])
	if err := Simulate(d, 30, 1); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("double contribution: got %v", err)
	}
	o, _ := Build(coll.AllReduce, coll.OneShot, 3)
	o.Phases[1].Steps[1].Srcs[0], o.Phases[1].Steps[1].Srcs[1] = o.Phases[1].Steps[1].Srcs[1], o.Phases[1].Steps[1].Srcs[0]
	if err := Simulate(o, 30, 1); err == nil || !strings.Contains(err.Error(), "different order") {
		t.Errorf("rank-dependent order: got %v", err)
	}
	// Unwritten data and misplaced elements: the simulator alone (these
	// schedules pass Validate and CheckRaces).
	u, _ := Build(coll.AllGather, coll.OneShot, 2)
	u.Phases[0].Steps = nil // nothing stages the input that peers read
	if err := Simulate(u, 8, 1); err == nil || !strings.Contains(err.Error(), "reads an element nothing wrote") {
		t.Errorf("unstaged input: got %v", err)
	}
	m, _ := Build(coll.AllGather, coll.OneShot, 3)
	g := m.Phases[1].Steps
	g[1].Dst, g[2].Dst = g[2].Dst, g[1].Dst // each peer's chunk lands in the other's place
	if err := Simulate(m, 9, 1); err == nil || !strings.Contains(err.Error(), "holds element") {
		t.Errorf("misplaced chunk: got %v", err)
	}
	// A reduce-scatter whose reduce is split by the destination's chunk
	// (0, a one-chunk output) instead of the chunk it reads: the block that
	// reads a peer's staged element is not the one that staged it.
	sp, _ := Build(coll.ReduceScatter, coll.OneShot, 3)
	sp.OutChunks = 3
	if err := CheckSplit(sp); err == nil || !strings.Contains(err.Error(), "written split as chunk") {
		t.Errorf("split by the wrong chunk: got %v", err)
	}
	// A scratch of accumulator values (hcm's) is only reduced into and
	// from: a copy would move A values as elements.
	h, _ := Build(coll.AllReduce, coll.HCM, 8)
	if !h.AccScratch {
		t.Error("hcm keeps its partials as elements; want AccScratch (a sum rounded once)")
	}
	h.Phases = append(h.Phases, Phase{Sync: true, Steps: []Step{{Kind: Copy, Dst: Ref{Buf: Output, Rank: Self, Chunk: Self},
		Srcs: []Ref{{Buf: Scratch, Rank: Self, Chunk: Self}}}}})
	if err := Validate(h); err == nil || !strings.Contains(err.Error(), "holds accumulator values") {
		t.Errorf("copy from an accumulator scratch: got %v", err)
	}
	e, _ := Build(coll.AllGather, coll.OneShot, 2)
	e.Phases[len(e.Phases)-1].Sync = false
	if err := Validate(e); err == nil || !strings.Contains(err.Error(), "last phase has no barrier") {
		t.Errorf("missing final barrier: got %v", err)
	}
}

func TestFinalBarrierRemovable(t *testing.T) {
	for _, c := range coll.Collectives() {
		for _, alg := range Algorithms(c) {
			w := 4
			if alg == coll.HCM {
				w = 8
			}
			s, _ := Build(c, alg, w)
			if got, want := FinalBarrierRemovable(s), !s.Protocol.Push(); got != want {
				t.Errorf("%s: FinalBarrierRemovable = %v, want %v (LL schedules have no barriers)", s.Name(), got, want)
			}
		}
	}
	s, _ := Build(coll.AllReduce, coll.TwoShot, 4)
	s.Phases[0].Steps = append(s.Phases[0].Steps, Step{Kind: Copy, Dst: Ref{Buf: Scratch, Rank: Self, Chunk: Self},
		Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: Self}}})
	if FinalBarrierRemovable(s) {
		t.Error("a scratch write before the first barrier must keep the final barrier")
	}
	one := &Schedule{Collective: coll.AllGather, Algorithm: "x", World: 2, Phases: []Phase{{Sync: true}}}
	if FinalBarrierRemovable(one) {
		t.Error("a single barrier cannot be removed")
	}
}

// TestLLRules breaks each LL rule once and checks the error names it.
func TestLLRules(t *testing.T) {
	build := func(c coll.Collective, alg coll.Algorithm, w int) *Schedule {
		t.Helper()
		s, err := Build(c, alg, w)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cases := []struct {
		name    string
		breakIt func(s *Schedule)
		want    string
	}{
		{"barrier", func(s *Schedule) { s.Phases[0].Sync = true }, "LL schedules have no barriers"},
		{"put to other lane", func(s *Schedule) { s.Phases[0].Steps[0].Dst.Lane = Rel(1) }, "a put writes the executing rank's own lane"},
		{"put to stage", func(s *Schedule) { s.Phases[0].Steps[0].Dst.Buf = Stage }, "a put writes the executing rank's own lane"},
		{"double write", func(s *Schedule) {
			s.Phases[0].Steps = append(s.Phases[0].Steps, s.Phases[0].Steps[0])
		}, "each inbox chunk may be written once per collective"},
		{"read peer inbox", func(s *Schedule) { s.Phases[1].Steps[0].Srcs[1].Rank = Rel(1) }, "an inbox is read only by its owner"},
		{"deaf to a peer", func(s *Schedule) {
			st := &s.Phases[1].Steps[0]
			st.Srcs = st.Srcs[:len(st.Srcs)-1]
		}, "never reads data rank"},
		{"put of unfused output", func(s *Schedule) {
			s.Phases[0].Steps[0].Srcs[0].Buf = Output
		}, "neither input nor the result of the step just before"},
		{"write peer output", func(s *Schedule) { s.Phases[1].Steps[0].Dst.Rank = Rel(1) }, "may only write the executing rank's buffers"},
		{"unknown protocol", func(s *Schedule) { s.Protocol = "carrier-pigeon" }, "unknown protocol"},
	}
	for _, tc := range cases {
		s := build(coll.ReduceScatter, coll.OneShotLL, 4)
		tc.breakIt(s)
		if err := Validate(s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	// A put in a barrier schedule, and an inbox read there.
	b := build(coll.AllGather, coll.OneShot, 2)
	b.Phases[0].Steps[0].Kind = Put
	if err := Validate(b); err == nil || !strings.Contains(err.Error(), "put needs the LL protocol") {
		t.Errorf("put in a barrier schedule: got %v", err)
	}
	// A deadlock: rank waits for a put that comes after its own wait.
	d := build(coll.AllGather, coll.OneShotLL, 2)
	d.Phases[0], d.Phases[1] = d.Phases[1], d.Phases[0]
	if err := Simulate(d, 8, 1); err == nil || !strings.Contains(err.Error(), "deadlock") {
		t.Errorf("wait before send: got %v, want a deadlock", err)
	}
	// Two-shot LL's fused reduce+put is accepted; reordering the put before
	// the reduce is not.
	tw := build(coll.AllReduce, coll.TwoShotLL, 4)
	ph := &tw.Phases[1]
	ph.Steps[0], ph.Steps[1] = ph.Steps[1], ph.Steps[0]
	if err := Validate(tw); err == nil || !strings.Contains(err.Error(), "neither input nor the result") {
		t.Errorf("put before its reduce: got %v", err)
	}
	// Lamport: each inbox chunk written is read exactly once (under LL the
	// flags, not the reader, keep collectives apart).
	for _, alg := range []coll.Algorithm{coll.OneShotLamport, coll.TwoShotLamport} {
		for _, tc := range []struct {
			name    string
			breakIt func(s *Schedule)
			want    string
		}{
			{"read twice", func(s *Schedule) {
				last := &s.Phases[len(s.Phases)-1]
				last.Steps = append(last.Steps, last.Steps[len(last.Steps)-1])
			}, "is read 2 times"},
			{"never read", func(s *Schedule) {
				// The first reduce stops reading its first inbox source
				// (every peer is still heard elsewhere).
				for pi := range s.Phases {
					for si := range s.Phases[pi].Steps {
						st := &s.Phases[pi].Steps[si]
						if i := slices.IndexFunc(st.Srcs, func(r Ref) bool { return r.Buf == Inbox }); st.Kind == Reduce && i >= 0 {
							st.Srcs = slices.Delete(st.Srcs, i, i+1)
							return
						}
					}
				}
			}, "is read 0 times"},
		} {
			s := build(coll.AllReduce, alg, 2)
			if err := Validate(s); err != nil {
				t.Fatalf("%s: %v", alg, err)
			}
			tc.breakIt(s)
			err := Validate(s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s %s: got %v, want an error containing %q", alg, tc.name, err, tc.want)
			}
		}
	}
}

func TestLLNeedsGPU(t *testing.T) {
	for _, c := range coll.Collectives() {
		for _, alg := range []coll.Algorithm{coll.OneShotLL, coll.OneShotLL128} {
			err := CanRun(coll.HostSHM, c, alg, 4)
			if err == nil || !strings.Contains(err.Error(), "host backend does not allow") {
				t.Errorf("%s %s on host_shm: got %v", c, alg, err)
			}
			if err := CanRun(coll.NVLinkFull, c, alg, 4); err != nil {
				t.Errorf("%s %s on nvlink_full: %v", c, alg, err)
			}
		}
	}
	hcm, _ := NewTopology(coll.HybridCubeMesh, 8)
	s, _ := Build(coll.AllReduce, coll.OneShotLL, 8)
	want := "allreduce_oneshot_ll_w8 phase 0 step 1: rank 3 writes inbox of rank 4, but hybrid_cube_mesh has no link 3-4"
	if err := CheckLinks(s, hcm); err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

// TestInboxLayout: push schedules' inboxes hold only the chunks their puts
// write, one place each (Simulate runs them in this layout, so places that
// overlapped would corrupt results there too).
func TestInboxLayout(t *testing.T) {
	for _, w := range []int{2, 3, 4, 8, 16} {
		for _, c := range []struct {
			collective coll.Collective
			algorithm  coll.Algorithm
			want       int
		}{
			{coll.AllReduce, coll.TwoShotLL, 2 * (w - 1)},
			{coll.AllReduce, coll.TwoShotLL128, 2 * (w - 1)},
			{coll.ReduceScatter, coll.OneShotLL, w - 1},
			{coll.AllGather, coll.OneShotLL128, w - 1},
			{coll.AllReduce, coll.OneShot, 0},
		} {
			s, err := Build(c.collective, c.algorithm, w)
			if err != nil {
				t.Fatal(err)
			}
			at, n := s.InboxLayout()
			if n != c.want || s.InboxChunks() != n {
				t.Errorf("%s: %d inbox places, want %d", s.Name(), n, c.want)
			}
			for o := range at {
				seen := map[int]bool{}
				for l := range at[o] {
					for ch, p := range at[o][l] {
						if p >= 0 && (seen[p] || p >= n) {
							t.Errorf("%s: owner %d lane %d chunk %d at place %d, taken or out of %d", s.Name(), o, l, ch, p, n)
						}
						seen[p] = true
					}
				}
			}
		}
	}
}

// TestSimulatePushRoundsCatchOverwrites runs a push schedule whose rank
// sends to its successor but waits only for its predecessor (three ranks in
// a ring): in one round it is fine, in rounds a put of round 2 can land
// before the round-0 data it overwrites was read, since no wait orders the
// reader's read before the writer's put. The simulator must say so, and
// accept the same ring when every rank also waits for its successor.
func TestSimulatePushRoundsCatchOverwrites(t *testing.T) {
	self := Self
	put := Step{Kind: Put, Dst: Ref{Buf: Inbox, Rank: Rel(1), Lane: self, Chunk: self}, Srcs: []Ref{{Buf: Input, Rank: self, Chunk: self}}}
	take := Step{Kind: Copy, Dst: Ref{Buf: Output, Rank: self, Chunk: Rel(-1)}, Srcs: []Ref{{Buf: Inbox, Rank: self, Lane: Rel(-1), Chunk: Rel(-1)}}}
	ring := &Schedule{Collective: coll.AllGather, Algorithm: coll.OneShotLL, World: 3, InChunks: 3, OutChunks: 3, Protocol: coll.LL,
		Phases: []Phase{{Steps: []Step{put}}, {Steps: []Step{take}}}}
	mem := &arena{}
	// One round: the data arrives; the output misses chunks the ring never
	// sends, so only the result check can fail.
	if err := simulate(ring, 3*8, 1, 0, Spread, mem); err != nil && strings.Contains(err.Error(), "overwrite") {
		t.Fatalf("one round: %v", err)
	}
	var ow *OverwriteError
	for _, split := range []Split{Spread, Aligned} {
		if err := simulate(ring, 3*8, 1, 2, split, mem); !errors.As(err, &ow) {
			t.Fatalf("rounds over a ring without back-pressure, split %d: got %v, want an *OverwriteError", split, err)
		}
	}
	if RoundsSafe(ring) {
		t.Error("RoundsSafe accepts the ring without back-pressure")
	}
	if err := CheckRoundsUnits(ring, Spread, 3*8, 2, true); !errors.As(err, &ow) {
		t.Errorf("unit by unit, rounds over a ring without back-pressure: got %v, want an *OverwriteError", err)
	}
	// Sending chunk c back and waiting for it there (the threads of chunk
	// c, on both ranks) orders every read before the put two rounds later.
	back := Step{Kind: Put, Dst: Ref{Buf: Inbox, Rank: Rel(-1), Lane: self, Chunk: Rel(-1)}, Srcs: []Ref{{Buf: Output, Rank: self, Chunk: Rel(-1)}}}
	wait := Step{Kind: Copy, Dst: Ref{Buf: Output, Rank: self, Chunk: self}, Srcs: []Ref{{Buf: Inbox, Rank: self, Lane: Rel(1), Chunk: self}}}
	ring.Phases = []Phase{{Steps: []Step{put}}, {Steps: []Step{take, back}}, {Steps: []Step{wait}}}
	if err := simulate(ring, 3*8, 1, 2, Spread, mem); errors.As(err, &ow) {
		t.Fatalf("ring with a wait for the successor: %v", err)
	}
	if err := CheckRoundsUnits(ring, Spread, 3*8, 2, true); err != nil {
		t.Errorf("unit by unit, ring with a wait for the successor: %v", err)
	}
	if split, ok := RoundsSplit(ring); !ok || split != Spread {
		t.Errorf("RoundsSplit(ring that waits for its successor) = %d, %v; want Spread, true", split, ok)
	}
}

// TestRoundsSplit pins how shipped schedules run in rounds: every one may;
// the all-reduce's push schedules with the Spread split (every thread waits
// for the peers it sends to), a reduce-scatter's or all-gather's one-shot
// only Aligned, since under Spread its sending threads wait for nothing (at
// world 1 nothing is sent, so Spread serves).
func TestRoundsSplit(t *testing.T) {
	for _, c := range coll.Collectives() {
		for _, alg := range Algorithms(c) {
			for _, w := range []int{1, 2, 3, 4, 8} {
				s, err := Build(c, alg, w)
				if err != nil {
					continue
				}
				want := Spread
				if s.Protocol.Push() && c != coll.AllReduce && w > 1 {
					want = Aligned
				}
				if got, ok := RoundsSplit(s); got != want || !ok {
					t.Errorf("RoundsSplit(%s) = %d, %v; want %d, true", s.Name(), got, ok, want)
				}
				if spread, aligned := simulate(s, 3*w, 1, 1, Spread, &arena{}), simulate(s, 3*w, 1, 1, Aligned, &arena{}); want == Aligned && (spread == nil || aligned != nil) {
					t.Errorf("%s in rounds: spread %v, aligned %v; want an overwrite spread and none aligned", s.Name(), spread, aligned)
				}
			}
		}
	}
}

// TestProtocolOfAlgorithm: every schedule's protocol is the one its
// algorithm's name says (coll.Algorithm.Protocol), which the generator,
// spec validation and tune go by without building the schedule.
func TestProtocolOfAlgorithm(t *testing.T) {
	for _, c := range coll.Collectives() {
		for _, a := range Algorithms(c) {
			s, err := Build(c, a, 8)
			if err != nil {
				t.Fatal(err)
			}
			if s.Protocol != a.Protocol() {
				t.Errorf("%s %s: schedule protocol %s, but %s.Protocol() is %s", c, a, s.Protocol, a, a.Protocol())
			}
		}
	}
}
