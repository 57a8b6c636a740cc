package schedule

import (
	"errors"
	"testing"

	"github.com/collgen/collgen/coll"
)

// TestRoundsUnitsShortLastRound runs every shipped push schedule that may
// run in rounds, thread by thread, over a message whose last round is
// short (chunks of 7 elements in windows of 3: rounds of 3, 3 and 1; an
// all-reduce's last chunk shorter still), followed by the next
// collective. With the kernels' padding (every loop that puts or polls
// covers the whole window, cg_round_n) no put can overwrite a line before
// it is read; without it, the threads past the last round's data read in
// the round before and send nothing after, and the next collective's
// first puts can land on lines they have not read.
func TestRoundsUnitsShortLastRound(t *testing.T) {
	const win, perChunk = 3, 7
	checked, holes := 0, 0
	for _, ps := range pushRounds(2, 3, 4, 8) {
		s, w := ps.s, ps.s.World
		n := perChunk * w
		if s.Collective == coll.AllReduce {
			n -= 3 // the last chunk 4 elements: rounds of 3 and 1, then none
		}
		checked++
		if err := CheckRoundsUnits(s, ps.split, n, win, true); err != nil {
			t.Errorf("%s, padded rounds: %v", s.Name(), err)
		}
		var ow *OverwriteError
		switch err := CheckRoundsUnits(s, ps.split, n, win, false); {
		case errors.As(err, &ow):
			holes++
		case err != nil:
			t.Errorf("%s, unpadded rounds: %v", s.Name(), err)
		}
	}
	if checked == 0 {
		t.Fatal("no push schedule runs in rounds")
	}
	if holes == 0 {
		t.Error("without padding no schedule can overwrite a line before it is read: the check sees nothing")
	}
	t.Logf("%d schedules; %d of them can overwrite an unread line without padding", checked, holes)
}

// TestRoundsUnitsFullRounds: rounds of equal windows need no padding, and
// one round needs none either (the next collective's round 0 uses the
// other slot); the unit-level check agrees with SimulateWindows there.
func TestRoundsUnitsFullRounds(t *testing.T) {
	for _, ps := range pushRounds(2, 3, 4) {
		for _, tc := range []struct{ perChunk, win int }{{9, 3}, {4, 4}} {
			if err := CheckRoundsUnits(ps.s, ps.split, tc.perChunk*ps.s.World, tc.win, false); err != nil {
				t.Errorf("%s, %d elements per chunk in windows of %d: %v", ps.s.Name(), tc.perChunk, tc.win, err)
			}
		}
	}
}

// pushRound is a shipped push schedule that may run in rounds, and its split.
type pushRound struct {
	s     *Schedule
	split Split
}

// pushRounds lists the shipped push schedules that may run in rounds at
// the given world sizes, with the split their kernels use (RoundsSplit).
func pushRounds(worlds ...int) []pushRound {
	var out []pushRound
	for _, c := range coll.Collectives() {
		for _, alg := range Algorithms(c) {
			for _, w := range worlds {
				s, err := Build(c, alg, w)
				if err != nil || !s.Protocol.Push() {
					continue
				}
				if split, ok := RoundsSplit(s); ok {
					out = append(out, pushRound{s, split})
				}
			}
		}
	}
	return out
}
