package schedule

import (
	"errors"
	"strings"
	"testing"

	"github.com/collgen/collgen/coll"
)

// TestChunkRangeClamps: chunks past the buffer's end are empty at n, the
// last partial chunk ends at n.
func TestChunkRangeClamps(t *testing.T) {
	for _, c := range []struct{ i, c, n, lo, hi int }{
		{0, 2, 5, 0, 2}, {2, 2, 5, 4, 5}, {3, 2, 5, 5, 5}, {1, 4, 4, 4, 4}, {0, 0, 0, 0, 0},
	} {
		if lo, hi := ChunkRange(c.i, c.c, c.n); lo != c.lo || hi != c.hi {
			t.Errorf("ChunkRange(%d, %d, %d) = [%d, %d), want [%d, %d)", c.i, c.c, c.n, lo, hi, c.lo, c.hi)
		}
	}
}

// TestInboxLayoutUneven: the places an inbox needs are the most any owner
// needs, not the last owner's.
func TestInboxLayoutUneven(t *testing.T) {
	// Every rank puts its input into rank 0's inbox: rank 0 holds two
	// lanes, rank 1 none.
	s := &Schedule{Collective: coll.AllGather, Algorithm: "toward0", World: 2, InChunks: 1, OutChunks: 2, Protocol: coll.LL,
		Phases: []Phase{{Steps: []Step{{Kind: Put,
			Dst:  Ref{Buf: Inbox, Rank: ConstIndex(0), Lane: Self, Chunk: ConstIndex(0)},
			Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: ConstIndex(0)}}}}}}}
	if at, n := s.InboxLayout(); n != 2 || at[0][0][0] != 0 || at[0][1][0] != 1 || at[1][0][0] != -1 {
		t.Errorf("InboxLayout = %v, %d places; want 2 (rank 0's two lanes)", at, n)
	}
}

// TestValidateIndexBounds: a ref naming rank w, chunk n or lane w (one past
// the last) is refused.
func TestValidateIndexBounds(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(s *Schedule)
		want string
	}{
		{"rank w", func(s *Schedule) { s.Phases[1].Steps[1].Srcs[0].Rank = ConstIndex(s.World) }, "names rank 3 on rank 0, outside 0..2"},
		{"chunk w", func(s *Schedule) { s.Phases[1].Steps[1].Srcs[0].Chunk = ConstIndex(s.World) }, "names chunk 3 on rank 0; stage has 3 chunks"},
	} {
		s, err := Build(coll.AllReduce, coll.OneShot, 3)
		if err != nil {
			t.Fatal(err)
		}
		c.edit(s)
		if err := Validate(s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v, want %q", c.name, err, c.want)
		}
	}
	ll, err := Build(coll.AllGather, coll.OneShotLL, 3)
	if err != nil {
		t.Fatal(err)
	}
	edited := false
	for pi := range ll.Phases {
		for si := range ll.Phases[pi].Steps {
			for j := range ll.Phases[pi].Steps[si].Srcs {
				if ref := &ll.Phases[pi].Steps[si].Srcs[j]; ref.Buf == Inbox && !edited {
					ref.Lane, edited = ConstIndex(3), true
				}
			}
		}
	}
	if err := Validate(ll); !edited || err == nil || !strings.Contains(err.Error(), "names lane 3 on rank 0, outside 0..2") {
		t.Errorf("lane w: Validate = %v", err)
	}
}

// TestCheckRacesOwnChunk: a rank may read in a phase what it wrote itself
// earlier in it (program order); only peers' writes race.
func TestCheckRacesOwnChunk(t *testing.T) {
	s := &Schedule{Collective: coll.AllGather, Algorithm: "own", World: 2, InChunks: 1, OutChunks: 2,
		Phases: []Phase{{Sync: true, Steps: []Step{
			{Kind: Copy, Dst: Ref{Buf: Stage, Rank: Self, Chunk: Self}, Srcs: []Ref{{Buf: Input, Rank: Self, Chunk: ConstIndex(0)}}},
			{Kind: Copy, Dst: Ref{Buf: Output, Rank: Self, Chunk: Self}, Srcs: []Ref{{Buf: Stage, Rank: Self, Chunk: Self}}},
		}}}}
	if err := CheckRaces(s); err != nil {
		t.Errorf("reading its own chunk written earlier in the phase: %v", err)
	}
	s.Phases[0].Steps[1].Srcs[0].Rank, s.Phases[0].Steps[1].Srcs[0].Chunk = Rel(1), Rel(1)
	if err := CheckRaces(s); err == nil {
		t.Error("reading a peer's chunk it writes in the same phase: no race found")
	}
}

// TestRoundsUnitsShortSecondRound: chunks of 4 in windows of 3 run in two
// rounds (3 and 1), not one: without padding some schedule overwrites an
// unread line, as with TestRoundsUnitsShortLastRound's 7 in 3.
func TestRoundsUnitsShortSecondRound(t *testing.T) {
	holes := 0
	for _, ps := range pushRounds(2, 3, 4) {
		var ow *OverwriteError
		if err := CheckRoundsUnits(ps.s, ps.split, 4*ps.s.World, 3, false); errors.As(err, &ow) {
			holes++
		} else if err != nil {
			t.Errorf("%s: %v", ps.s.Name(), err)
		}
	}
	if holes == 0 {
		t.Error("chunks of 4 in windows of 3 without padding: no schedule can overwrite an unread line; the short second round was not checked")
	}
}
