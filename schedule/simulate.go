package schedule

import (
	"fmt"

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

// SimulateWindows is Simulate for a barrier schedule run in rounds, as the
// kernels run it when the stage cannot hold whole chunks (cg_window in the
// CUDA header): round r executes every phase over elements
// [r*window, (r+1)*window) of every chunk, and Stage and Scratch hold one
// window of each chunk (chunk c at c*window). Stage and Scratch are wiped
// before every round, so a round that reads anything an earlier round left
// there fails. window 0 is the whole chunk.
func SimulateWindows(s *Schedule, n, vecElems, window int) error {
	if s.Protocol.Push() && window != 0 {
		return fmt.Errorf("%s: push schedules run in one round (window 0), not %d", s.Name(), window)
	}
	if window < 0 {
		return fmt.Errorf("%s: negative window %d", s.Name(), window)
	}
	if err := Validate(s); err != nil {
		return err
	}
	if err := CheckRaces(s); err != nil {
		return err
	}
	return simulate(s, n, vecElems, window, &arena{})
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
// schedule, for callers that ran them once for many sizes; buffers come
// from mem.
func simulate(s *Schedule, n, vecElems, window int, mem *arena) error {
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
				size[b] = places * c // InboxLayout's places, one chunk each
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
	// round starting at element w0 of every chunk.
	w0 := 0
	span := func(ref Ref, r int) (int, int) {
		if s.chunks(ref.Buf) == 1 {
			return w0, min(w0+win, c)
		}
		ci := ref.Chunk.Eval(r, w)
		lo, hi := ChunkRange(ci, c, n)
		lo, hi = min(lo+w0, hi), min(lo+w0+win, hi)
		if ref.Buf.Symmetric() && win < c { // window layout
			lo, hi = ci*win, ci*win+hi-lo
		}
		if ref.Buf == Inbox { // the chunk's place in its owner's inbox
			k := inboxAt[ref.Rank.Eval(r, w)][ref.Lane.Eval(r, w)][ci]
			if k < 0 {
				return 0, 0 // no put writes it: an empty span, which exec reports
			}
			lo, hi = k*c, k*c+hi-lo
		}
		return lo, hi
	}
	// exec runs step st of rank r, naming it by phase pi and index si. It
	// writes the destination as it goes: a destination is either a source
	// itself (the same chunk, read at an index before it is written there)
	// or disjoint from every source (another chunk, lane or buffer).
	exec := func(pi, si int, st Step, r int) error {
		dlo, dhi := span(st.Dst, r)
		dst := bufs[st.Dst.Rank.Eval(r, w)][st.Dst.Buf][dlo:dhi]
		srcs := make([][]cell, len(st.Srcs))
		for j, ref := range st.Srcs {
			lo, hi := span(ref, r)
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
	if s.Protocol.Push() {
		if err := simulateLL(s, exec); err != nil {
			return err
		}
		return checkResult(s, bufs, n, c)
	}
	rounds := 1
	if win > 0 && win < c {
		rounds = (c + win - 1) / win
	}
	for round := range rounds {
		w0 = round * win
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
					if err := exec(pi, si, st, r); err != nil {
						return err
					}
				}
			}
		}
	}
	return checkResult(s, bufs, n, c)
}

// simulateLL runs an LL schedule as dataflow: each rank runs its steps in
// program order (phases are only grouping), and a step that reads an Inbox
// chunk waits until the put that writes it has run, as the kernels wait for
// each line's flag. Ranks advance round-robin, as far as they can; if no
// rank can advance before all are done, the schedule deadlocks.
func simulateLL(s *Schedule, exec func(pi, si int, st Step, r int) error) error {
	w := s.World
	type pos struct{ pi, si int }
	var order []pos
	for pi, ph := range s.Phases {
		for si := range ph.Steps {
			order = append(order, pos{pi, si})
		}
	}
	// written[(owner*w + lane)*w + chunk]: the put of that inbox chunk ran.
	written := make([]bool, w*w*w)
	inboxChunk := func(ref Ref, r int) int {
		return (ref.Rank.Eval(r, w)*w+ref.Lane.Eval(r, w))*w + ref.Chunk.Eval(r, w)
	}
	next := make([]int, w)
	for done := 0; done < w; {
		progress := false
		done = 0
		for r := 0; r < w; r++ {
			for next[r] < len(order) {
				p := order[next[r]]
				st := s.Phases[p.pi].Steps[p.si]
				ready := true
				for _, ref := range st.Srcs {
					if ref.Buf == Inbox && !written[inboxChunk(ref, r)] {
						ready = false
					}
				}
				if !ready {
					break
				}
				if err := exec(p.pi, p.si, st, r); err != nil {
					return err
				}
				if st.Dst.Buf == Inbox {
					written[inboxChunk(st.Dst, r)] = true
				}
				next[r]++
				progress = true
			}
			if next[r] == len(order) {
				done++
			}
		}
		if done < w && !progress {
			for r := 0; r < w; r++ {
				if next[r] < len(order) {
					p := order[next[r]]
					return fmt.Errorf("%s: deadlock: rank %d waits at phase %d step %d for inbox data nobody sends", s.Name(), r, p.pi, p.si)
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
