package schedule

import (
	"fmt"

	"github.com/collgen/collgen/coll"
)

// Topology is the set of direct links between the ranks of a group.
type Topology struct {
	Kind  coll.TopologyKind // which links exist (all pairs, hybrid cube mesh, ...)
	World int               // ranks
	link  [][]bool
}

// NewTopology returns the links a topology kind has at a world size:
// fully connected for nvlink_full, pcie_p2p and host_shm; for
// hybrid_cube_mesh, two fully connected quads {0..3}, {4..7} plus the links
// i <-> i+4 (the 8-GPU DGX-1 layout PyTorch's IntraNodeComm detects).
func NewTopology(kind coll.TopologyKind, world int) (*Topology, error) {
	lo, hi, only := KindWorldSizes(kind)
	if hi == 0 {
		return nil, fmt.Errorf("unknown topology kind %q (known: %v)", kind, coll.TopologyKinds())
	}
	if world < lo || world > hi {
		if only != nil {
			return nil, fmt.Errorf("topology kind %s has exactly %v ranks, not %d", kind, only, world)
		}
		return nil, fmt.Errorf("topology kind %s has %d to %d ranks, not %d", kind, lo, hi, world)
	}
	t := &Topology{Kind: kind, World: world, link: make([][]bool, world)}
	for a := range t.link {
		t.link[a] = make([]bool, world)
		for b := range t.link[a] {
			switch kind {
			case coll.HybridCubeMesh:
				t.link[a][b] = a/4 == b/4 || a^4 == b
			default:
				t.link[a][b] = true
			}
		}
	}
	return t, nil
}

// Linked reports whether rank a can read rank b's memory directly.
func (t *Topology) Linked(a, b int) bool { return a == b || t.link[a][b] }

// Validate checks a schedule's structure: indices are in range, copies and
// puts have one source, reduces at least one, and the protocol's rules hold.
//
// coll.Barrier: steps write only the executing rank's buffers, no Inbox
// or Put appears, and the last phase ends in a barrier when peers are read
// (so the next collective cannot overwrite a stage buffer a peer still
// reads).
//
// coll.LL and coll.LL128 (Protocol.Push): no barriers; peers are
// only ever written through Put (into the writer's own lane of their
// Inbox) and never read; Inboxes are read
// only by their owner; each Inbox chunk is written at most once per
// collective (its flag then names exactly one write); a Put sends Input or
// the result of the step just before it (the kernel fuses the two, so the
// same thread produces and sends each line); and every rank reads a lane
// written by every other rank. That last rule is what makes two
// alternating Inbox slots enough: a rank starts collective k+2 only after
// reading data every peer sent in k+1, which each peer sent only after
// finishing k, so no write of k+2 can land in a slot a peer still reads
// for k.
//
// coll.Lamport adds one rule: each Inbox chunk written is read exactly
// once per collective. The reader zeroes each line after reading it, which
// is what makes the slot empty for the collective after next: a second
// read would wait for data that never comes, and a chunk never read would
// look ready to the next collective that uses the slot.
func Validate(s *Schedule) error {
	w := s.World
	readsPeers := false
	ll := s.Protocol.Push()
	if !s.Protocol.Valid() {
		return fmt.Errorf("%s: unknown protocol %q", s.Name(), s.Protocol)
	}
	inboxWrites := map[region]string{}
	inboxReads := map[region]int{}
	heard := make([]map[int]bool, w) // heard[r][s]: rank r reads a lane rank s writes
	for r := range heard {
		heard[r] = map[int]bool{}
	}
	for pi, ph := range s.Phases {
		if ll && ph.Sync {
			return fmt.Errorf("%s phase %d: LL schedules have no barriers (readers wait per line)", s.Name(), pi)
		}
		for si, st := range ph.Steps {
			where := fmt.Sprintf("%s phase %d step %d", s.Name(), pi, si)
			if (st.Kind == Copy || st.Kind == Put) && len(st.Srcs) != 1 {
				return fmt.Errorf("%s: %s has %d sources, want 1", where, st.Kind, len(st.Srcs))
			}
			if len(st.Srcs) == 0 {
				return fmt.Errorf("%s: reduce has no sources", where)
			}
			if st.Kind == Put {
				if !ll {
					return fmt.Errorf("%s: put needs the LL protocol", where)
				}
				if st.Dst.Buf != Inbox || !st.Dst.Lane.IsSelf() {
					return fmt.Errorf("%s: put writes %s; a put writes the executing rank's own lane of an inbox", where, st.Dst)
				}
				src := st.Srcs[0]
				fused := false
				for j := si - 1; j >= 0; j-- {
					if prev := ph.Steps[j]; prev.Kind != Put {
						fused = prev.Dst.Equal(src)
						break
					}
				}
				if src.Buf != Input && !fused {
					return fmt.Errorf("%s: put sends %s, which is neither input nor the result of the step just before the puts", where, src)
				}
			} else {
				if !st.Dst.Rank.IsSelf() {
					return fmt.Errorf("%s: writes %s; steps other than put may only write the executing rank's buffers", where, st.Dst)
				}
				if st.Dst.Buf == Inbox {
					return fmt.Errorf("%s: writes %s; only puts write inboxes", where, st.Dst)
				}
			}
			for i, ref := range append([]Ref{st.Dst}, st.Srcs...) {
				isDst := i == 0
				if ref.Buf == Inbox && !ll {
					return fmt.Errorf("%s: uses %s, but inboxes need the LL protocol", where, ref)
				}
				if ll && (ref.Buf == Stage || ref.Buf == Scratch) {
					return fmt.Errorf("%s: uses %s; LL schedules keep their symmetric data in the inbox", where, ref)
				}
				if ref.Buf == Inbox && !isDst && !ref.Rank.IsSelf() {
					return fmt.Errorf("%s: reads %s; an inbox is read only by its owner", where, ref)
				}
				if !ref.Buf.Symmetric() && ref.Buf != Inbox && !ref.Rank.IsSelf() {
					return fmt.Errorf("%s: %s is private to its rank and cannot be read by peers", where, ref)
				}
				if ref.Buf == Scratch && !s.UsesScratch {
					return fmt.Errorf("%s: uses scratch but the schedule does not declare UsesScratch", where)
				}
				if ref.Buf == Scratch && s.AccScratch && st.Kind != Reduce {
					return fmt.Errorf("%s: a %s step uses a scratch that holds accumulator values; only reduce steps may", where, st.Kind)
				}
				for r := 0; r < w; r++ {
					peer, chunk := ref.Rank.Eval(r, w), ref.Chunk.Eval(r, w)
					if peer < 0 || peer >= w {
						return fmt.Errorf("%s: %s names rank %d on rank %d, outside 0..%d", where, ref, peer, r, w-1)
					}
					if n := s.chunks(ref.Buf); chunk < 0 || chunk >= n {
						return fmt.Errorf("%s: %s names chunk %d on rank %d; %s has %d chunks", where, ref, chunk, r, ref.Buf, n)
					}
					if ref.Buf == Inbox {
						lane := ref.Lane.Eval(r, w)
						if lane < 0 || lane >= w {
							return fmt.Errorf("%s: %s names lane %d on rank %d, outside 0..%d", where, ref, lane, r, w-1)
						}
						g := regionOf(ref, r, w)
						if isDst {
							if prev, dup := inboxWrites[g]; dup {
								return fmt.Errorf("%s: rank %d writes lane %d chunk %d of rank %d's inbox, already written at %s; each inbox chunk may be written once per collective", where, r, lane, chunk, peer, prev)
							}
							inboxWrites[g] = where
						} else {
							inboxReads[g]++
							if lane != r {
								heard[r][lane] = true
							}
						}
					}
					if peer != r && !ll {
						readsPeers = true
					}
				}
			}
		}
	}
	if ll {
		for r := 0; r < w; r++ {
			for p := 0; p < w; p++ {
				if p != r && !heard[r][p] {
					return fmt.Errorf("%s: rank %d never reads data rank %d sends, so two inbox slots could not keep collectives apart", s.Name(), r, p)
				}
			}
		}
	}
	if s.Protocol == coll.Lamport {
		// A chunk read but never written is a read with no put, which
		// Simulate reports as a deadlock; here, the reads of what is written.
		for g, where := range inboxWrites {
			if n := inboxReads[g]; n != 1 {
				return fmt.Errorf("%s: the inbox chunk written at %s is read %d times; under the Lamport protocol each is read exactly once (the read empties it)", s.Name(), where, n)
			}
		}
	}
	if readsPeers && (len(s.Phases) == 0 || !s.Phases[len(s.Phases)-1].Sync) {
		return fmt.Errorf("%s: reads peers but its last phase has no barrier, so a following collective could overwrite data a peer is still reading", s.Name())
	}
	return nil
}

// chunks returns how many chunks buffer b holds.
func (s *Schedule) chunks(b Buffer) int {
	switch b {
	case Input:
		return s.InChunks
	case Output:
		return s.OutChunks
	}
	return s.World
}

// CheckLinks proves that every peer access of the schedule (reads, and the
// writes of puts) uses a link of the topology; the error names the first
// access that does not.
func CheckLinks(s *Schedule, t *Topology) error {
	if t.World != s.World {
		return fmt.Errorf("%s: topology %s has %d ranks, schedule %d", s.Name(), t.Kind, t.World, s.World)
	}
	for pi, ph := range s.Phases {
		for si, st := range ph.Steps {
			refs, verb := st.Srcs, "reads"
			if st.Kind == Put {
				refs, verb = []Ref{st.Dst}, "writes"
			}
			for _, ref := range refs {
				for r := 0; r < s.World; r++ {
					if p := ref.Rank.Eval(r, s.World); !t.Linked(r, p) {
						return fmt.Errorf("%s phase %d step %d: rank %d %s %s of rank %d, but %s has no link %d-%d",
							s.Name(), pi, si, r, verb, ref.Buf, p, t.Kind, r, p)
					}
				}
			}
		}
	}
	return nil
}

// region is one chunk of one rank's buffer (and lane, for the Inbox).
type region struct {
	owner int
	buf   Buffer
	lane  int
	chunk int
}

// regionOf is the region a ref names on rank r of a w-rank world.
func regionOf(ref Ref, r, w int) region {
	g := region{owner: ref.Rank.Eval(r, w), buf: ref.Buf, chunk: ref.Chunk.Eval(r, w)}
	if ref.Buf == Inbox {
		g.lane = ref.Lane.Eval(r, w)
	}
	return g
}

// Overlap reports whether refs a and b name the same chunk of the same
// buffer on some rank of a w-rank world (as the simulation keeps buffers:
// apart by kind, whatever a run aliases).
func Overlap(a, b Ref, w int) bool {
	for r := range w {
		if regionOf(a, r, w) == regionOf(b, r, w) {
			return true
		}
	}
	return false
}

// CheckRaces proves that no rank reads a peer's chunk in the same phase in
// which that peer writes it: such a read would race with the write, since
// ranks meet only at barriers. LL schedules have no such reads (Validate:
// peers are only written, through puts, and readers wait per line).
func CheckRaces(s *Schedule) error {
	w := s.World
	if s.Protocol.Push() {
		return nil
	}
	for pi, ph := range s.Phases {
		writes := map[region]bool{}
		for _, st := range ph.Steps {
			for r := 0; r < w; r++ {
				writes[regionOf(st.Dst, r, w)] = true
			}
		}
		for si, st := range ph.Steps {
			for _, ref := range st.Srcs {
				for r := 0; r < w; r++ {
					g := regionOf(ref, r, w)
					if g.owner != r && writes[g] {
						return fmt.Errorf("%s phase %d step %d: rank %d reads %s chunk %d of rank %d while that rank writes it in the same phase",
							s.Name(), pi, si, r, g.buf, g.chunk, g.owner)
					}
				}
			}
		}
	}
	return nil
}

// FinalBarrierRemovable reports whether a backend that alternates every
// rank's Stage buffer between two slots on consecutive collectives may skip
// the schedule's final barrier. The argument, for consecutive collectives
// k and k+1 on one group:
//
//   - A rank starts collective k+1 only after finishing k. It waited in k's
//     first barrier for every peer to arrive in k, so every peer had
//     finished k-1 by then.
//   - Writes before the first barrier of k+1 go only to Stage (required
//     here), into the slot k-1 used: every peer finished reading it (above).
//     Peers may still be reading k's slot, which is the other one.
//   - Writes after the first barrier of k+1 happen once every peer arrived
//     in k+1, so every peer has finished k and reads none of k's data.
//
// So the schedule needs at least two barriers (one stays), no symmetric
// buffer but Stage may be written before the first barrier, and its final
// phase must end in a barrier (the one to drop).
func FinalBarrierRemovable(s *Schedule) bool {
	if s.Protocol.Push() {
		return false // no barriers at all
	}
	if len(s.Phases) == 0 || !s.Phases[len(s.Phases)-1].Sync || s.Barriers() < 2 {
		return false
	}
	for _, ph := range s.Phases {
		for _, st := range ph.Steps {
			if st.Dst.Buf.Symmetric() && st.Dst.Buf != Stage {
				return false
			}
		}
		if ph.Sync {
			return true // reached the first barrier
		}
	}
	return true
}

// SplitChunk is the ref whose chunk index (and, through it, length) sets
// how a kernel's threads share a step's elements (the device runtime's
// work split, cg_shift): the destination's chunk, or for a one-chunk
// destination (all-gather's input, reduce-scatter's output) its first
// source's.
func (s *Schedule) SplitChunk(st Step) Ref {
	if st.Dst.Buf == Input && s.InChunks == 1 || st.Dst.Buf == Output && s.OutChunks == 1 {
		return st.Srcs[0]
	}
	return st.Dst
}

// CheckSplit proves that every element a barrier schedule writes is read
// later (by any rank, its writer included) under the same work split it
// was written with: the reading step's SplitChunk names the same chunk
// index as the writing step's. The device split then gives the element to
// the same block on both sides, which is what lets each block synchronise
// through its own barrier flags only (per-block barriers, no grid-wide
// one). It holds whatever the chunks' alignment: the warp-wide unaligned
// loops write only elements their own warp owns.
func CheckSplit(s *Schedule) error {
	if s.Protocol.Push() {
		return nil
	}
	w := s.World
	split := map[region]int{} // the split chunk each written region was written with
	for pi, ph := range s.Phases {
		for si, st := range ph.Steps {
			for r := 0; r < w; r++ {
				sc := s.SplitChunk(st).Chunk.Eval(r, w)
				for _, ref := range st.Srcs {
					g := regionOf(ref, r, w)
					if c, ok := split[g]; ok && c != sc {
						return fmt.Errorf("%s phase %d step %d: rank %d reads %s chunk %d of rank %d split as chunk %d, but it was written split as chunk %d (another block may write it)",
							s.Name(), pi, si, r, g.buf, g.chunk, g.owner, sc, c)
					}
				}
			}
		}
		for _, st := range ph.Steps {
			for r := 0; r < w; r++ {
				split[regionOf(st.Dst, r, w)] = s.SplitChunk(st).Chunk.Eval(r, w)
			}
		}
	}
	return nil
}
