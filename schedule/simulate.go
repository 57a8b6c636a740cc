package schedule

import (
	"errors"
	"fmt"
	"slices"

	"github.com/collgen/collgen/coll"
)

// cell is a simulated element: which input element it stems from, the set of
// ranks whose contributions it holds, and a hash of the order in which they
// were combined (two cells with equal hashes were reduced in the same order,
// so real arithmetic would give bitwise-equal results). The zero cell is an
// element nothing wrote, so fresh buffers need no initialisation.
type cell struct {
	elem1 int    // global element index plus 1; 0 when never written
	ranks uint64 // contributing ranks, one bit each
	order uint64 // non-commutative hash of the reduction tree
}

func leaf(elem, rank int) cell {
	return cell{elem1: elem + 1, ranks: 1 << uint(rank), order: mix(0x9e3779b97f4a7c15, uint64(rank)+1)}
}

func mix(h, x uint64) uint64 {
	h ^= x + 0x9e3779b97f4a7c15 + h<<6 + h>>2
	h *= 0xff51afd7ed558ccd
	return h ^ h>>33
}

// Simulate executes the schedule on symbolic CPU buffers for an n-element
// collective (n counts the full buffer: the all-reduce data, the
// reduce-scatter input or the all-gather output) with chunks rounded to
// vecElems, and checks the collective's result on every rank: each output
// element comes from the right input element, holds every required
// contribution exactly once, and (for all-reduce) was combined in the same
// order on every rank. It also runs Validate and CheckRaces first.
func Simulate(s *Schedule, n, vecElems int) error {
	return SimulateWindows(s, n, vecElems, 0)
}

// SimulateWindows is Simulate for a schedule run in rounds, as the kernels
// run it when their stage slot cannot hold whole chunks (cg_window in the
// CUDA header): round r executes every phase over elements
// [r*window, (r+1)*window) of every chunk. window 0 is the whole chunk.
//
// A barrier schedule's Stage and Scratch hold one window of each chunk
// (chunk c at c*window) and are wiped before every round, so a round that
// reads anything an earlier round left there fails.
//
// A push schedule's inbox holds one window of each place, in two slots that
// rounds alternate as consecutive collectives do (round r's puts and reads
// use slot r%2, with round r's flag), and ranks run their rounds without
// waiting for one another beyond the inbox reads. The simulation tracks
// which events happen before which (vector clocks over the reads' waits)
// and fails if a put can overwrite a place before every read of what the
// round two earlier left there: the kernels have no credits, only this
// order, so every interleaving must keep it. It models the work split the
// kernel uses in rounds (RoundsSplit), and threads that work in every
// round: a kernel's loops that put or poll cover the whole window in every
// round, however short its data there (cg_round_n), so a short last round
// leaves no reader without a later send (CheckRoundsUnits checks the order
// thread by thread, without that assumption).
func SimulateWindows(s *Schedule, n, vecElems, window int) error {
	if window < 0 {
		return fmt.Errorf("%s: negative window %d", s.Name(), window)
	}
	if err := Validate(s); err != nil {
		return err
	}
	if err := CheckRaces(s); err != nil {
		return err
	}
	split := Spread
	if window > 0 && s.Protocol.Push() {
		split, _ = RoundsSplit(s)
	}
	return simulate(s, n, vecElems, window, split, &arena{})
}

// arena is memory for simulations that callers reuse across sizes: the
// large buffers of big worlds are then allocated once, not once per size.
type arena struct{ cells []cell }

// zeroed returns n zeroed cells, valid until the next call.
func (a *arena) zeroed(n int) []cell {
	if n > cap(a.cells) {
		a.cells = make([]cell, n) // fresh memory is zero
		return a.cells
	}
	a.cells = a.cells[:n]
	clear(a.cells)
	return a.cells
}

// simulate is SimulateWindows without the checks that depend only on the
// schedule, for callers that ran them once for many sizes, with the work
// split of a push schedule's rounds given; buffers come from mem.
func simulate(s *Schedule, n, vecElems, window int, split Split, mem *arena) error {
	w := s.World
	if s.Collective != coll.AllReduce && n%w != 0 {
		return fmt.Errorf("%s: %d elements do not split into %d equal parts", s.Name(), n, w)
	}
	c := ChunkElems(s.Collective, n, w, vecElems)
	win := c // elements per chunk per round
	if window > 0 && window < c {
		win = window
	}
	// bufLen is how many elements each buffer holds: Stage and Scratch one
	// window of each chunk.
	bufLen := func(b Buffer) int {
		switch {
		case s.chunks(b) == 1:
			return c
		case b.Symmetric() && win < c:
			return w * win
		}
		return n
	}
	inboxAt, places := s.InboxLayout()
	var size [NumBuffers]int // of each rank's buffers
	perRank := 0
	for b := Input; b < NumBuffers; b++ {
		size[b] = bufLen(b)
		if b == Inbox {
			size[b] = 0 // only push schedules have inboxes
			if s.Protocol.Push() {
				size[b] = 2 * places * win // two slots of InboxLayout's places, one window each
			}
		}
		perRank += size[b]
	}
	cells := mem.zeroed(w * perRank)
	bufs := make([][NumBuffers][]cell, w)
	for r := range bufs {
		for b := Input; b < NumBuffers; b++ {
			bufs[r][b], cells = cells[:size[b]:size[b]], cells[size[b]:]
		}
		for i := range bufs[r][Input] {
			elem := i
			if s.InChunks == 1 {
				elem = r*c + i
			}
			bufs[r][Input][i] = leaf(elem, r)
		}
	}
	// span returns the element range of a ref's chunk on rank r in the
	// given round, which starts at element round*win of every chunk.
	span := func(ref Ref, r, round int) (int, int) {
		w0 := round * win
		ci := ref.Chunk.Eval(r, w)
		var lo, hi int
		if s.chunks(ref.Buf) == 1 {
			lo, hi = w0, min(w0+win, c)
		} else {
			lo, hi = ChunkRange(ci, c, n)
			lo, hi = min(lo+w0, hi), min(lo+w0+win, hi)
			if ref.Buf.Symmetric() && win < c { // window layout
				lo, hi = ci*win, ci*win+hi-lo
			}
		}
		if ref.Buf == Inbox { // the chunk's place in its owner's inbox
			k := inboxAt[ref.Rank.Eval(r, w)][ref.Lane.Eval(r, w)][ci]
			if k < 0 {
				return 0, 0 // no put writes it: an empty span, which exec reports
			}
			at := ((round%2)*places + k) * win // its slot, then its place
			lo, hi = at, at+hi-lo
		}
		return lo, hi
	}
	// exec runs step st of rank r, naming it by phase pi and index si. It
	// writes the destination as it goes: a destination is either a source
	// itself (the same chunk, read at an index before it is written there)
	// or disjoint from every source (another chunk, lane or buffer).
	exec := func(pi, si int, st Step, r, round int) error {
		dlo, dhi := span(st.Dst, r, round)
		dst := bufs[st.Dst.Rank.Eval(r, w)][st.Dst.Buf][dlo:dhi]
		srcs := make([][]cell, len(st.Srcs))
		for j, ref := range st.Srcs {
			lo, hi := span(ref, r, round)
			if hi-lo != dhi-dlo {
				return fmt.Errorf("%s phase %d step %d rank %d: source %s has %d elements, destination %s has %d",
					s.Name(), pi, si, r, ref, hi-lo, st.Dst, dhi-dlo)
			}
			srcs[j] = bufs[ref.Rank.Eval(r, w)][ref.Buf][lo:hi]
		}
		for i := range dst {
			acc := srcs[0][i]
			for j := 1; j < len(srcs); j++ {
				v := srcs[j][i]
				if acc.elem1 == 0 || v.elem1 == 0 {
					return fmt.Errorf("%s phase %d step %d rank %d: reads an element nothing wrote", s.Name(), pi, si, r)
				}
				if acc.elem1 != v.elem1 {
					return fmt.Errorf("%s phase %d step %d rank %d: combines element %d with element %d", s.Name(), pi, si, r, acc.elem1-1, v.elem1-1)
				}
				if acc.ranks&v.ranks != 0 {
					return fmt.Errorf("%s phase %d step %d rank %d: element %d counts ranks %b twice", s.Name(), pi, si, r, acc.elem1-1, acc.ranks&v.ranks)
				}
				acc = cell{elem1: acc.elem1, ranks: acc.ranks | v.ranks, order: mix(acc.order, v.order)}
			}
			if acc.elem1 == 0 {
				return fmt.Errorf("%s phase %d step %d rank %d: reads an element nothing wrote", s.Name(), pi, si, r)
			}
			dst[i] = acc
		}
		return nil
	}
	rounds := 1
	if win > 0 && win < c {
		rounds = (c + win - 1) / win
	}
	if s.Protocol.Push() {
		if err := simulatePush(s, rounds, split, exec); err != nil {
			return err
		}
		return checkResult(s, bufs, n, c)
	}
	for round := range rounds {
		if rounds > 1 {
			for r := range bufs {
				clear(bufs[r][Stage])
				clear(bufs[r][Scratch])
			}
		}
		for pi, ph := range s.Phases {
			for si, st := range ph.Steps {
				for r := 0; r < w; r++ {
					// Ranks run a phase concurrently, but CheckRaces proved that no
					// rank reads what another writes in it, so writing now is safe.
					if err := exec(pi, si, st, r, round); err != nil {
						return err
					}
				}
			}
		}
	}
	return checkResult(s, bufs, n, c)
}

// simulatePush runs a push schedule's rounds as dataflow: each rank runs
// its steps in program order, round after round (phases are only
// grouping), and a step that reads an Inbox chunk waits until the put of
// that chunk in the same round has run, as the kernels wait for each
// line's flag. Ranks advance round-robin, as far as they can; if no rank
// can advance before all are done, the schedule deadlocks.
//
// Rounds alternate two inbox slots, so a put of round r overwrites what
// round r-2 put in the same place. Whether every read of that older
// content happens before the put in every execution, not just in this one,
// is decided per thread, as the kernels run. With the Spread split the
// thread that owns unit u of chunk c (SplitChunk) owns it in every step on
// every rank, but its other units, in other chunks, depend on the size, so
// the only order to count on is that of the steps of one chunk index on
// one rank; with the Aligned split one thread owns unit u of every chunk,
// so all steps of a rank are ordered. Vector clocks over those classes
// ((rank, chunk), or one per rank), merged along each wait, decide it; a
// put that no chain of waits orders after a read it overwrites is an
// *OverwriteError.
func simulatePush(s *Schedule, rounds int, split Split, exec func(pi, si int, st Step, r, round int) error) error {
	w := s.World
	order := stepOrder(s)
	inboxChunk := s.inboxChunk // a place in a slot is slot*w*w*w + inbox chunk
	perSlot := w * w * w
	// readers[chunk]: how many reads of an inbox chunk one round makes.
	readers := make([]int, perSlot)
	for r := 0; r < w; r++ {
		for _, p := range order {
			for _, ref := range s.Phases[p.pi].Steps[p.si].Srcs {
				if ref.Buf == Inbox {
					readers[inboxChunk(ref, r)]++
				}
			}
		}
	}
	// A place's state: the round whose put it holds (-1: none), that put's
	// clock, and the reads of it so far (reader's class and its own count).
	type read struct{ class, rank, at int }
	type place struct {
		round, class int
		clock        []int
		reads        []read
	}
	places := make([]place, 2*perSlot)
	for i := range places {
		places[i].round = -1
	}
	// clock[c*w+r][q]: the events of class (rank q, chunk c) that happen
	// before the next of class (r, c); waits connect only equal chunks.
	clock := make([][]int, w*w)
	for i := range clock {
		clock[i] = make([]int, w)
	}
	next := make([]int, w) // each rank's next event: round*len(order) + step
	total := rounds * len(order)
	for done := 0; done < w; {
		progress := false
		done = 0
		for r := 0; r < w; r++ {
			for next[r] < total {
				round, p := next[r]/len(order), order[next[r]%len(order)]
				st := s.Phases[p.pi].Steps[p.si]
				slot := (round % 2) * perSlot
				ready := true
				for _, ref := range st.Srcs {
					if ref.Buf == Inbox && places[slot+inboxChunk(ref, r)].round != round {
						ready = false
					}
				}
				if !ready {
					break
				}
				if err := exec(p.pi, p.si, st, r, round); err != nil {
					return err
				}
				class := 0
				if split == Spread {
					class = s.SplitChunk(st).Chunk.Eval(r, w)
				}
				clk := clock[class*w+r]
				clk[r]++
				for _, ref := range st.Srcs {
					if ref.Buf == Inbox {
						pl := &places[slot+inboxChunk(ref, r)]
						if pl.class == class {
							mergeClock(clk, pl.clock)
						}
						pl.reads = append(pl.reads, read{class, r, clk[r]})
					}
				}
				if st.Dst.Buf == Inbox {
					k := inboxChunk(st.Dst, r)
					pl := &places[slot+k]
					if pl.round >= 0 {
						if len(pl.reads) < readers[k] {
							return &OverwriteError{Schedule: s.Name(), Rank: r, Phase: p.pi, Step: p.si, Round: round, Dst: st.Dst, Reader: -1, ReadRound: pl.round}
						}
						for _, rd := range pl.reads {
							if rd.class != class || clk[rd.rank] < rd.at {
								return &OverwriteError{Schedule: s.Name(), Rank: r, Phase: p.pi, Step: p.si, Round: round, Dst: st.Dst, Reader: rd.rank, ReadRound: pl.round}
							}
						}
					}
					pl.round, pl.class, pl.clock, pl.reads = round, class, slices.Clone(clk), pl.reads[:0]
				}
				next[r]++
				progress = true
			}
			if next[r] == total {
				done++
			}
		}
		if done < w && !progress {
			for r := 0; r < w; r++ {
				if next[r] < total {
					return deadlock(s, r, order[next[r]%len(order)], next[r]/len(order))
				}
			}
		}
	}
	return nil
}

// checkResult compares every rank's output with what the collective must
// produce.
func checkResult(s *Schedule, bufs [][NumBuffers][]cell, n, c int) error {
	w := s.World
	all := uint64(1)<<uint(w) - 1
	if w == 64 {
		all = ^uint64(0)
	}
	for r := 0; r < w; r++ {
		out := bufs[r][Output]
		for i, v := range out {
			var wantElem int
			var wantRanks uint64
			switch s.Collective {
			case coll.AllReduce:
				wantElem, wantRanks = i, all
			case coll.ReduceScatter:
				wantElem, wantRanks = r*c+i, all
			case coll.AllGather:
				wantElem, wantRanks = i, 1<<uint(i/c)
			}
			if v.elem1 != wantElem+1 || v.ranks != wantRanks {
				return fmt.Errorf("%s n=%d: rank %d output[%d] holds element %d from ranks %b, want element %d from ranks %b",
					s.Name(), n, r, i, v.elem1-1, v.ranks, wantElem, wantRanks)
			}
			if s.Collective == coll.AllReduce && v.order != bufs[0][Output][i].order {
				return fmt.Errorf("%s n=%d: rank %d reduced output[%d] in a different order than rank 0, so results could differ in the last bit",
					s.Name(), n, r, i)
			}
		}
	}
	return nil
}

// OverwriteError is a push schedule's put that, run in rounds, can
// overwrite an inbox chunk before the read of what the round two earlier
// left there: no chain of waits orders the read before it (see
// SimulateWindows). Such a schedule runs in one round only (RoundsSafe).
type OverwriteError struct {
	Schedule          string // the schedule's name (Schedule.Name)
	Rank, Phase, Step int    // the put
	Round             int    // the put's round
	Dst               Ref    // the inbox chunk it overwrites
	Reader            int    // the rank whose read is not ordered before the put; -1: a read had not run yet
	ReadRound         int    // the round that left the data the read takes
}

// Error says which write would land on data a reader has not read yet.
func (e *OverwriteError) Error() string {
	who := "a reader"
	if e.Reader >= 0 {
		who = fmt.Sprintf("rank %d", e.Reader)
	}
	return fmt.Sprintf("%s: in rounds, rank %d's put at phase %d step %d of round %d can overwrite %s before %s reads what round %d left there: no wait orders the two",
		e.Schedule, e.Rank, e.Phase, e.Step, e.Round, e.Dst, who, e.ReadRound)
}

// Split is how a push kernel's loops spread units over threads.
type Split int

const (
	// Spread gives unit u of chunk c to the thread c*units+u (modulo the
	// grid; cg_first's shift), so a phase's chunks run on distinct threads.
	Spread Split = iota
	// Aligned gives unit u of every chunk to the same thread (no shift): a
	// thread that sends unit u of one chunk also waits for unit u of
	// another, which orders its sends in rounds. It needs chunks of equal
	// length, as a reduce-scatter's and an all-gather's are (the per-rank
	// count); an all-reduce's last chunk may be shorter.
	Aligned
)

// RoundsSplit reports whether a schedule may run in rounds (cg_window),
// and with which work split: always for barrier schedules; for a push
// schedule, when every put of a round is ordered by waits after the reads
// of the round two earlier in the same place (the simulation over three
// rounds finds no *OverwriteError) under the Spread split, or else under
// the Aligned split where chunks are equal. An all-reduce's one-shot and
// two-shot are safe spread: each thread waits for the peers it sends to. A
// reduce-scatter's or all-gather's one-shot is not (the threads that send
// a peer its chunk wait for nothing, and would lap a slow reader), but is
// aligned: the thread that sends unit u waits for unit u of its own chunk,
// which the peer sent after reading. It judges only this order; whether
// the schedule is correct at all is Simulate's to say.
func RoundsSplit(s *Schedule) (Split, bool) {
	if !s.Protocol.Push() {
		return Spread, true
	}
	n := 3 * s.World // chunks of 3 elements: rounds 0..2 of one element
	var ow *OverwriteError
	if !errors.As(simulate(s, n, 1, 1, Spread, &arena{}), &ow) {
		return Spread, true
	}
	if s.Collective != coll.AllReduce && !errors.As(simulate(s, n, 1, 1, Aligned, &arena{}), &ow) {
		return Aligned, true
	}
	return Spread, false
}

// PushRounds reports whether the generated kernel of a push schedule runs
// in rounds (so any message size passes through a bounded inbox): when
// RoundsSplit allows, except the reduce-scatter's and all-gather's LL
// one-shots (the Aligned split), which keep one round: their rules end
// where the LL inbox still holds the message (64-128 KiB), and with the
// one-round branch of an aligned kernel their 8 KiB rows were 11% slower on
// 2 x H200 (docs/performance.md). A spec rule may send unbounded sizes
// only to barrier schedules and to push schedules with rounds. It returns
// RoundsSplit's split too, which the kernel's rounds use.
func PushRounds(s *Schedule) (split Split, rounds bool) {
	split, ok := RoundsSplit(s)
	return split, s.Protocol.Push() && ok && !(split == Aligned && s.Protocol == coll.LL)
}

// RoundsSafe reports whether a schedule may run in rounds (RoundsSplit).
func RoundsSafe(s *Schedule) bool {
	_, ok := RoundsSplit(s)
	return ok
}

// stepPos is a step of a schedule: its phase and its index there.
type stepPos struct{ pi, si int }

// stepOrder lists a schedule's steps in program order (phases are only
// grouping), as each rank of a push schedule runs them.
func stepOrder(s *Schedule) []stepPos {
	var order []stepPos
	for pi, ph := range s.Phases {
		for si := range ph.Steps {
			order = append(order, stepPos{pi, si})
		}
	}
	return order
}

// inboxChunk numbers the inbox chunk a ref names on rank r: (owner*W +
// lane)*W + chunk, W*W*W of them.
func (s *Schedule) inboxChunk(ref Ref, r int) int {
	w := s.World
	return (ref.Rank.Eval(r, w)*w+ref.Lane.Eval(r, w))*w + ref.Chunk.Eval(r, w)
}

// deadlock is the error of a push simulation in which no rank can advance:
// rank r waits at step p of a round for a put nobody makes.
func deadlock(s *Schedule, r int, p stepPos, round int) error {
	return fmt.Errorf("%s: deadlock: rank %d waits at phase %d step %d of round %d for inbox data nobody sends", s.Name(), r, p.pi, p.si, round)
}

// mergeClock raises dst to src component by component (dst nil: a copy of
// src) and returns it.
func mergeClock(dst, src []int) []int {
	if dst == nil {
		return slices.Clone(src)
	}
	for i := range dst {
		dst[i] = max(dst[i], src[i])
	}
	return dst
}
