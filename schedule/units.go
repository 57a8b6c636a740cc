package schedule

import (
	"fmt"
	"slices"

	"github.com/collgen/collgen/coll"
)

// CheckRoundsUnits checks, unit by unit, the order that keeps a push
// schedule's rounds from overwriting inbox lines before they are read, as
// the kernels run it: one thread per unit of a window (one element here),
// the thread of unit o of chunk c (Spread) or of unit o of every chunk
// (Aligned) the same in every step and round, and then a second collective
// of the same size in the same slots, whose kernel starts only after this
// rank's kernel has ended. n elements run in windows of win elements of
// every chunk (vector width 1); pad says whether a round's loops cover the
// whole window however short its data (the kernels' cg_round_n) or only
// the data, so that threads past a short round's data sit it out.
//
// SimulateWindows judges the same order with one class per chunk, which
// assumes every thread works in every round; this check needs no such
// assumption, at the price of clocks over every unit's thread, so it is
// meant for small windows. A put that no chain of waits orders after a
// read of what it overwrites is an *OverwriteError; a read that waits for
// a put nobody makes is a deadlock.
func CheckRoundsUnits(s *Schedule, split Split, n, win int, pad bool) error {
	w := s.World
	if !s.Protocol.Push() || win < 1 {
		return fmt.Errorf("%s: CheckRoundsUnits wants a push schedule and a window of at least one element", s.Name())
	}
	if s.Collective != coll.AllReduce && n%w != 0 {
		return fmt.Errorf("%s: %d elements do not split into %d equal parts", s.Name(), n, w)
	}
	c := ChunkElems(s.Collective, n, w, 1)
	rounds := max(1, (c+win-1)/win)
	const extra = 2 // the next collective's rounds: its round 0 reuses the slot of this one's round rounds-2
	// span is how many elements of chunk ci round rd covers (the next
	// collective's rounds as this one's).
	span := func(ci, rd int) int {
		lo, hi := 0, c
		if s.Collective == coll.AllReduce {
			lo, hi = ChunkRange(ci, c, n)
		}
		start := lo + (rd%rounds)*win
		return max(0, min(hi, start+win)-start)
	}
	order := stepOrder(s)
	// class is the thread of unit o of a step on rank r; active says
	// whether the step's loop reaches unit o in round rd.
	chunkOf := func(st Step, r int) int { return s.SplitChunk(st).Chunk.Eval(r, w) }
	classes := w * win
	if split == Spread {
		classes *= w
	}
	class := func(st Step, r, o int) int {
		if split == Spread {
			return (r*w+chunkOf(st, r))*win + o
		}
		return r*win + o
	}
	rankOf := func(cls int) int {
		if split == Spread {
			return cls / (w * win)
		}
		return cls / win
	}
	active := func(st Step, r, rd, o int) bool {
		if pad && rounds > 1 {
			return o < win
		}
		return o < span(chunkOf(st, r), rd)
	}
	perSlot := w * w * w
	place := func(ref Ref, r, rd, o int) int { return (((rd%2)*perSlot)+s.inboxChunk(ref, r))*win + o }
	// readers[rd][place]: the reads round rd makes of a place.
	total := rounds + extra
	readers := make([]map[int]int, total)
	for rd := range total {
		readers[rd] = map[int]int{}
		for r := range w {
			for _, p := range order {
				st := s.Phases[p.pi].Steps[p.si]
				for o := range win {
					if !active(st, r, rd, o) {
						continue
					}
					for _, ref := range st.Srcs {
						if ref.Buf == Inbox {
							readers[rd][place(ref, r, rd, o)]++
						}
					}
				}
			}
		}
	}
	type read struct{ class, at int }
	type line struct {
		round int
		clock []int
		reads []read
	}
	lines := map[int]*line{}
	clock := make([][]int, classes)
	for i := range clock {
		clock[i] = make([]int, classes)
	}
	events := len(order) * win
	next := make([]int, w) // each rank's next event: (round*len(order) + step)*win + unit
	for {
		progress, done := false, 0
		for r := range w {
			for next[r] < total*events {
				rd, p, o := next[r]/events, order[next[r]%events/win], next[r]%win
				if next[r] == rounds*events {
					// The next collective's kernel starts after this rank's
					// kernel ended: every thread of it after every thread of
					// this one.
					var join []int
					for cls := range classes {
						if rankOf(cls) == r {
							join = mergeClock(join, clock[cls])
						}
					}
					for cls := range classes {
						if rankOf(cls) == r {
							copy(clock[cls], join)
						}
					}
				}
				st := s.Phases[p.pi].Steps[p.si]
				if !active(st, r, rd, o) {
					next[r]++
					progress = true
					continue
				}
				ready := true
				for _, ref := range st.Srcs {
					if l := lines[place(ref, r, rd, o)]; ref.Buf == Inbox && (l == nil || l.round != rd) {
						ready = false
					}
				}
				if !ready {
					break
				}
				cls := class(st, r, o)
				clk := clock[cls]
				clk[cls]++
				for _, ref := range st.Srcs {
					if ref.Buf == Inbox {
						l := lines[place(ref, r, rd, o)]
						mergeClock(clk, l.clock)
						l.reads = append(l.reads, read{cls, clk[cls]})
					}
				}
				if st.Dst.Buf == Inbox {
					at := place(st.Dst, r, rd, o)
					l := lines[at]
					if l == nil {
						l = &line{round: -1}
						lines[at] = l
					}
					if l.round >= 0 {
						ow := &OverwriteError{Schedule: s.Name(), Rank: r, Phase: p.pi, Step: p.si, Round: rd, Dst: st.Dst, Reader: -1, ReadRound: l.round}
						if len(l.reads) < readers[l.round][at] {
							return ow
						}
						for _, rr := range l.reads {
							if clk[rr.class] < rr.at {
								ow.Reader = rankOf(rr.class)
								return ow
							}
						}
					}
					l.round, l.clock, l.reads = rd, slices.Clone(clk), l.reads[:0]
				}
				next[r]++
				progress = true
			}
			if next[r] == total*events {
				done++
			}
		}
		if done == w {
			return nil
		}
		if !progress {
			for r := range w {
				if next[r] < total*events {
					return deadlock(s, r, order[next[r]%events/win], next[r]/events)
				}
			}
		}
	}
}
